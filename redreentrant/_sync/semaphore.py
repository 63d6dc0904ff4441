"""The sync semaphore: :class:`Semaphore`, whose permits are owned by threads."""

from __future__ import annotations

from .._core.kinds import SEMAPHORES, SemaphoreKind
from .._core.owner import OwnerInfo, parse_owner
from .lock import Lock


class Semaphore(Lock):
    """A distributed semaphore of ``permits`` permits: at most that many owners hold
    one at a time, across every client of the masters (see the semaphore docs for the
    argument). A permit is held like a :class:`Lock`: owned by the thread that acquired
    it, reentrant (a thread holds at most one permit of a semaphore, and re-entry
    counts), renewed by the watchdog or taken with a fixed ``lease=``, and lost like a
    lock (:attr:`lost`, :meth:`ensure_held`, ``on_lost``). Waiters are woken by a
    release, not by polling. Get one from :meth:`LockManager.semaphore`.
    """

    kind: SemaphoreKind = SEMAPHORES
    fixed_fencing = False

    def __repr__(self) -> str:
        return f"<Semaphore {self.name!r} permits={self.permits} hold_count={self.hold_count}>"

    @property
    def permits(self) -> int:
        """How many owners may hold a permit at once."""
        return self.kind.permits

    def available(self) -> int:
        """How many permits are free on a quorum's view (one read-only round): those an
        acquire could take now."""
        return self._driver.run(self._engine.permits_free(self.kind, self.name))

    def holders(self) -> dict[str, OwnerInfo | None]:
        """Who holds a permit on a quorum of the masters (one read-only round): owner id
        -> what the id tells (host, pid, thread or task; None for another format)."""
        owners = self._driver.run(self._engine.permit_holders(self.kind, self.name))
        return {owner: parse_owner(owner) for owner in owners}

    def locked(self) -> bool:
        """Whether no permit is free on a quorum's view (one read-only round)."""
        return self.available() == 0

    def __enter__(self) -> Semaphore:
        self.acquire()
        return self
