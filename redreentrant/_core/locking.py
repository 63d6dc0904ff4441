"""What every lock object is, for the sync and the asyncio front ends alike: a view of
one named lock of one kind through one manager's :class:`~.engine.Engine` (no I/O).

The flavours' lock classes add the calls that make rounds, driven by their driver.
"""

from __future__ import annotations

from typing import Any, Generic

from typing_extensions import TypeVar

from .engine import Engine
from .holds import Hold
from .keys import validate_name
from .kinds import EXCLUSIVE, LockKind
from .settings import check_fencing

L = TypeVar("L")
#: the flavour's upgradeable read lock class
U = TypeVar("U", default=Any)


class LockCore:
    """A lock named ``name`` of one kind, seen from one manager (local state only)."""

    kind: LockKind = EXCLUSIVE
    #: whether its first holds always (True) or never (False) get a fencing token,
    #: whatever is asked (an election's term is its token; a semaphore's holders share)
    fixed_fencing: bool | None = None

    def __init__(
        self,
        engine: Engine,
        name: str,
        fencing: bool | None = None,
        owner: str | None = None,
        kind: LockKind | None = None,
    ) -> None:
        if kind is not None:  # a kind of each instance's own (a semaphore's, a multi-lock's)
            self.kind = kind
        self._engine = engine
        self.name = validate_name(name)
        #: whether a first hold of this lock gets a fencing token (see :attr:`token`)
        self.fencing = (
            (engine.settings.fencing if fencing is None else check_fencing(fencing))
            if self.fixed_fencing is None
            else self.fixed_fencing
        )
        # The token of the object that owns this lock's holds (``owner=``); None: the
        # calling thread or task.
        self._owner_token = owner

    def _owner(self) -> str:
        """The id of whoever owns this lock's holds here: the ``owner=`` object, else
        the calling thread or task."""
        token = self._owner_token
        engine = self._engine
        return engine.owner_id() if token is None else engine.owner_of(token)

    def __repr__(self) -> str:
        try:
            held = f" hold_count={self.hold_count}"
        except RuntimeError:  # an asyncio lock looked at from outside a task
            held = ""
        return f"<{type(self).__name__} {self.name!r}{held}>"

    def _hold(self) -> Hold | None:
        return self._engine.holds.get(self.kind, self.name, self._owner())

    @property
    def hold_count(self) -> int:
        """How many times the calling owner holds the lock (0 if it does not)."""
        hold = self._hold()
        return 0 if hold is None else hold.count

    def is_owned(self) -> bool:
        """Whether the calling owner holds the lock, with validity left and no loss
        detected. Local knowledge only: no round trip."""
        return self._engine.remaining(self._hold()) > 0

    @property
    def token(self) -> int:
        """The fencing token of the calling owner's hold: an ``int`` that grows with
        every grant of this lock's name (of this kind) across all clients. Local: no
        round trip. Pass it to the protected resource, which rejects writes carrying a
        token smaller than one it already accepted (see the fencing docs).

        Raises :class:`LockNotOwnedError` when the caller does not hold the lock, and
        :class:`FencingError` when its hold has no token (taken without fencing, or
        the read side of a read/write lock). Re-entries keep the first hold's token."""
        return self._engine.token(self.kind, self.name, self._owner())

    @property
    def valid_until(self) -> float:
        """When the validity of the calling owner's hold ends, on the
        :func:`time.monotonic` clock (``0.0`` if it does not hold the lock, or the hold
        was lost). Local: no round trip. A renewal or an :meth:`extend` moves it later.
        """
        return self._engine.valid_until(self._hold())

    def ensure_held(self) -> None:
        """Raise :class:`LockLostError` if the calling owner's hold was lost or its
        validity ran out (a fixed lease that expired counts), and
        :class:`LockNotOwnedError` if it holds nothing. Local: no round trip. Call it
        between steps of long work to stop before doing more unprotected."""
        self._engine.ensure_held(self.kind, self.name, self._owner())

    def remaining(self) -> float:
        """Seconds of validity left on the calling owner's hold (0.0 if not owned).

        For a watchdog-managed hold this is refreshed at every renewal."""
        return self._engine.remaining(self._hold())


class ReadWriteLock(Generic[L, U]):
    """A read/write lock named ``name``: ``.read`` (shared), ``.write`` (exclusive) and
    ``.upgradeable`` (shared with readers, exclusive among writers and upgradeable
    readers, and able to turn into the write lock: see its ``upgrade``).

    All are reentrant and owned by the thread (or task) that acquires them. Get one
    from ``LockManager.rw_lock``.
    """

    def __init__(self, name: str, read: L, write: L, upgradeable: U) -> None:
        self.name = name
        self.read = read
        self.write = write
        self.upgradeable = upgradeable

    def __repr__(self) -> str:
        return f"<ReadWriteLock {self.name!r}>"
