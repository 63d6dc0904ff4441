"""The sync leader election: :class:`Election`, led by a thread."""

from __future__ import annotations

from collections.abc import Iterator

from .._core import election
from .._core.engine import entry_caller
from .._core.errors import LockTimeoutError
from .._core.kinds import ELECTION, LockKind
from .._core.owner import new_token
from .lock import Lock


class Election(Lock):
    """Leader election on the name: one leader at a time, candidates served in order of
    arrival, every new leader with a larger :attr:`term` than every earlier one.

    Leadership is a hold of a fair lock of the election's own, always with a fencing
    token (the term): owned by the thread that campaigned, renewed by the watchdog,
    and lost like a lock (:attr:`lost`, :meth:`ensure_held`, ``on_lost``, listeners).
    Beside it the masters keep the leader record (term, value, the leader's thread
    name), which :meth:`leader` and :meth:`observe` read. Get one from
    :meth:`LockManager.election`.
    """

    kind: LockKind = ELECTION
    fixed_fencing = True

    def campaign(self, value: bytes | str = b"", timeout: float = -1) -> Election:
        """Wait (woken, not polling) until the calling thread leads, then proclaim
        ``value`` and return this election, a context manager that resigns at its end
        (``with election.campaign(value=b"host-a"):``). ``timeout`` (seconds, ``-1``
        for no limit) bounds the wait: then :class:`LockTimeoutError`, and nothing is
        held nor queued. The leader already: proclaims ``value`` (see :meth:`proclaim`).
        Raises :class:`FencingError` (nothing held) rather than hand out a term that
        could be smaller than an earlier one."""
        if not self._campaign(value, True, timeout):
            raise LockTimeoutError(self.name, timeout, "another candidate leads")
        return self

    def _campaign(self, value: bytes | str, blocking: bool, timeout: float) -> bool:
        engine = self._engine
        steps = election.campaign(
            engine, ELECTION, self.name, self._owner(), election.check_value(value),
            blocking, timeout, None, entry_caller(),
        )  # fmt: skip
        return self._driver.run(steps)

    def acquire(
        self,
        blocking: bool = True,
        timeout: float = -1,
        lease: float | None = None,
        max_hold: float | None = None,
    ) -> bool:
        """Campaign with an empty value (see :meth:`campaign`): True once the calling
        thread leads, False if ``timeout`` passed first (or, ``blocking=False``, at
        once). The leader already: True, nothing changes. ``lease`` and ``max_hold``
        are not taken: leadership is renewed by the watchdog until it resigns."""
        if lease is not None or max_hold is not None:
            raise ValueError("an election takes no lease= or max_hold=: the watchdog renews it")
        if self.is_owned():
            return True
        return self._campaign(b"", blocking, timeout)

    def resign(self) -> None:
        """Give up leadership: the next candidate in line leads. Raises
        :class:`LockNotOwnedError` if the calling thread does not lead, and
        :class:`LockLostError` if its leadership was lost meanwhile."""
        self.release()

    @property
    def term(self) -> int:
        """The term of the calling thread's leadership: larger than every earlier
        leader's, across all clients (the fencing token of its grant). Local: no round
        trip. Raises :class:`LockNotOwnedError` if the calling thread does not lead."""
        return self.token

    def proclaim(self, value: bytes | str) -> None:
        """Change the leader's value without giving up leadership (one round); the
        observers are told. Raises :class:`LockNotOwnedError` if the calling thread
        does not lead, and :class:`LockLostError` if its leadership is gone."""
        engine = self._engine
        value = election.check_value(value)
        owner = self._owner()
        self._driver.run(election.proclaim(engine, ELECTION, self.name, owner, value))

    def leader(self) -> election.LeaderView | None:
        """Who leads, as a quorum of masters sees it now (one read-only round; no
        campaign needed): owner, host, pid, thread name, value, term and the validity
        left; None when nobody leads."""
        return self._driver.run(election.leader(self._engine.quorum, ELECTION, self.name))

    def observe(self) -> Iterator[election.LeaderView | None]:
        """The leader now (None: nobody), then each change: a new leader, a new value,
        or nobody. Woken by the masters' messages (a change counts once a quorum of
        masters announced it), never reported backwards; a leader that dies publishes
        nothing, and is seen gone when the validity it was last seen with runs out.
        The changes are kept for a consumer that falls behind. Close the iterator (or
        let it go) to stop observing."""
        engine = self._engine
        seen = election.Observation(engine, ELECTION, self.name, f"{engine.id}:{new_token('o')}")
        hub = self._driver.hub
        seen.generation = hub.watch(seen.channel, seen.observer, log=True)
        try:
            while True:
                yield self._driver.run(seen.next())
        finally:
            hub.unwatch(seen.channel, seen.observer)

    def __enter__(self) -> Election:
        self.acquire()
        return self
