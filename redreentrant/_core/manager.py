"""What the sync and the asyncio lock managers share: their public face (settings,
masters, the making of lock objects) and the report of lost holds (no I/O).

Each flavour adds its driver, transport, wake-ups and watchdog, and the calls that
make rounds (``inspect``, ``force_unlock``, ``close``).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar, cast

from .engine import Engine
from .holds import Hold
from .keys import scan_pattern, validate_name
from .kinds import EXCLUSIVE, FAIR, FAMILIES, READ, UPGRADEABLE, WRITE, LockKind, name_and_family
from .locking import ReadWriteLock, U
from .owner import object_token, parse_owner
from .settings import shortest_lease

log = logging.getLogger(__name__)
L = TypeVar("L")  # the flavour's lock class


class ManagerCore(Generic[L, U]):
    """Settings, masters and lock objects of a lock manager (see ``LockManager``)."""

    def __init__(
        self, engine: Engine, make_lock: Callable[[LockKind, str, bool | None, str | None], L]
    ) -> None:
        self._engine = engine
        self._make_lock = make_lock
        _after_fork.add(self._after_fork_in_child)

    # -- settings and state ----------------------------------------------------------------

    @property
    def id(self) -> str:
        """This manager's id, ``<host>:<pid>:<uuid>``: the first part of its owner ids."""
        return self._engine.id

    @property
    def lease(self) -> float:
        """The watchdog-managed lease, in seconds."""
        return self._engine.settings.lease

    @property
    def master_timeout(self) -> float:
        """How long one master may take to answer in a round, in seconds."""
        return self._engine.settings.master_timeout

    @property
    def drift_factor(self) -> float:
        return self._engine.settings.drift_factor

    @property
    def retry_jitter(self) -> float:
        return self._engine.settings.retry_jitter

    @property
    def on_lost(self) -> Callable[[Any], object] | None:
        return self._engine.settings.on_lost

    @property
    def shortest_lease(self) -> float:
        """The shortest fixed ``lease=`` an acquire honours, in seconds (about 4 ms): its
        drift allowance leaves half of it for the round."""
        return shortest_lease(self._engine.settings.drift_factor)

    @property
    def fencing(self) -> bool:
        """Whether locks hand out fencing tokens unless made with ``fencing=False``."""
        return self._engine.settings.fencing

    @property
    def masters(self) -> tuple[str, ...]:
        """The masters' addresses, in order."""
        return self._engine.quorum.masters

    @property
    def quorum(self) -> int:
        """How many masters must grant a lock: ``N // 2 + 1``."""
        return self._engine.quorum.needed

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called: every later call fails with
        :class:`ManagerClosedError`."""
        return self._engine.closed

    def owner_id(self, owner: object = None) -> str:
        """The id of an owner under this manager: the calling thread's (asyncio: task's),
        or, given ``owner``, that object's as its locks' holds carry it (see
        :meth:`lock`). :func:`~redreentrant.parse_owner` reads one."""
        token = owner_token(owner)
        return self._engine.owner_id() if token is None else f"{self.id}:{token}"

    def _names_found(
        self, pattern: str, found: Sequence[Iterable[object] | BaseException]
    ) -> dict[str, tuple[str, ...]]:
        """What ``names(pattern)`` returns, from each master's keys that matched
        :func:`names_match` (or the error its scan raised)."""
        q = self._engine.quorum
        failed = {i: f for i, f in enumerate(found) if isinstance(f, BaseException)}
        if len(failed) > q.tolerated:
            raise q.unavailable("list the lock names", failed)
        families: dict[str, set[str]] = {}
        for keys_ in found:
            if isinstance(keys_, BaseException):
                continue
            for raw in keys_:
                try:
                    key = raw.decode() if isinstance(raw, bytes) else str(raw)
                except UnicodeDecodeError:
                    continue
                seen = name_and_family(key)
                if seen is not None and fnmatch.fnmatchcase(seen[0], pattern):
                    families.setdefault(seen[0], set()).add(seen[1])
        order = [kind.family for kind in FAMILIES]
        return {n: tuple(f for f in order if f in families[n]) for n in sorted(families)}

    # -- lock objects --------------------------------------------------------------------

    def lock(self, name: str, *, fencing: bool | None = None, owner: object = None) -> L:
        """A reentrant lock named ``name``, owned by whoever acquires it: the calling
        thread (asyncio: task), or the object ``owner``, whose holds any thread or task
        may then take, re-enter and release (one at a time). Reentrancy counts per
        owner. When ``owner`` is garbage-collected, its watchdog-managed holds are
        released and reported, as a dead thread's are.

        ``fencing`` (default: the manager's) gives each first hold a fencing token
        (``lock.token``), at the cost of one more round per acquire."""
        self._engine.check_open()
        return self._make_lock(EXCLUSIVE, name, fencing, owner_token(owner))

    def rw_lock(
        self, name: str, *, fencing: bool | None = None, owner: object = None
    ) -> ReadWriteLock[L, U]:
        """A read/write lock named ``name``: ``.read`` (shared), ``.write`` (exclusive)
        and ``.upgradeable`` (shared with readers, one holder at a time, and able to
        upgrade to the write lock); ``owner`` as for :meth:`lock`.

        ``fencing`` applies to the write side, upgrades included (readers and
        upgradeable readers share, and get no token)."""
        self._engine.check_open()
        token = owner_token(owner)
        return ReadWriteLock(
            validate_name(name),
            self._make_lock(READ, name, fencing, token),
            self._make_lock(WRITE, name, fencing, token),
            # The flavour makes the lock class of the kind's label: its upgradeable one.
            cast(U, self._make_lock(UPGRADEABLE, name, fencing, token)),
        )

    def fair_lock(self, name: str, *, fencing: bool | None = None, owner: object = None) -> L:
        """A reentrant lock named ``name`` that is granted in order of arrival;
        ``fencing`` and ``owner`` as for :meth:`lock`."""
        self._engine.check_open()
        return self._make_lock(FAIR, name, fencing, owner_token(owner))

    # -- reports -------------------------------------------------------------------------

    def _report(self, hold: Hold) -> object:
        """Report a lost hold: log it, tell the listener, and call ``on_lost``
        (returning what it returned)."""
        who = parse_owner(hold.owner)
        log.warning(
            "redreentrant: lost %s %r held by %s (%s); acquired at %s",
            hold.kind.noun,
            hold.name,
            who.describe() if who is not None else hold.owner,
            hold.lost,
            hold.site,
        )
        self._engine.told_lost(hold)
        on_lost = self.on_lost
        if on_lost is None:
            return None
        try:
            return on_lost(self._make_lock(hold.kind, hold.name, None, None))
        except Exception:
            log.exception("redreentrant: on_lost hook raised")
            return None

    def _after_fork_in_child(self) -> None:
        self._engine.after_fork_in_child()


#: how many keys one SCAN step of ``names()`` asks a master for
SCAN_COUNT = 1000


def names_match(pattern: object) -> str:
    """The ``SCAN MATCH`` pattern of ``names(pattern)`` (``pattern``: an fnmatch glob)."""
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a str, not {type(pattern).__name__}")
    return scan_pattern(pattern)


def owner_token(owner: object) -> str | None:
    """The token of an ``owner=`` object (None: the calling thread or task)."""
    return None if owner is None else object_token(owner)


class _ForkRegistry:
    """What to do in a forked child, for each manager alive (kept weakly)."""

    def __init__(self) -> None:
        self._hooks: list[weakref.WeakMethod[Callable[[], None]]] = []
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._in_child)

    def add(self, hook: Callable[[], None]) -> None:
        self._hooks = [h for h in self._hooks if h() is not None]
        self._hooks.append(weakref.WeakMethod(hook))

    def _in_child(self) -> None:
        for ref in list(self._hooks):
            hook = ref()
            if hook is not None:
                hook()


_after_fork = _ForkRegistry()
