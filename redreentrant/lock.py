"""The sync reentrant lock: :class:`Lock`, owned by the calling thread."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from .errors import LockLostError
from .lockbase import LockBase, check_acquire_args

if TYPE_CHECKING:
    from .manager import LockManager

__all__ = ["Lock", "check_acquire_args"]


class Lock(LockBase):
    """A distributed, reentrant lock owned by the thread that acquires it.

    Semantics follow :class:`threading.RLock`: the owning thread may acquire it again
    (each acquire needs its own release), and only the owner may release it. Lock
    objects are cheap views: two ``mgr.lock("x")`` objects in one thread share the
    thread's hold, and different threads (or managers) are different owners.

    Get one from :meth:`LockManager.lock`.
    """

    _manager: LockManager

    def acquire(
        self, blocking: bool = True, timeout: float = -1, lease: float | None = None
    ) -> bool:
        """Acquire the lock; return True once held, False if not obtained in time.

        ``blocking=False`` tries one round and returns at once. ``timeout`` (seconds,
        ``-1`` for no limit) bounds the wait of a blocking call. Waiting is woken by the
        holder's release (pub/sub) or by its lease running out.

        ``lease=None`` (the default) takes the manager's lease and lets the watchdog renew
        it while the lock is held; ``lease=seconds`` is a fixed lease, never renewed: if
        the work outlives it, the release raises :class:`LockLostError`.

        Re-entry by the owner always succeeds at once (one round that records the new
        hold count and refreshes the lease), or raises :class:`LockLostError` if the
        owner's lease was lost. A re-entry keeps the hold's kind of lease: ``lease=`` on
        a watchdog-managed hold raises ``ValueError`` (changing nothing); on a fixed hold
        it sets the fixed lease anew. Raises :class:`QuorumUnavailableError` when too
        many masters fail to answer, :class:`LockKeyTypeError` if the key holds non-lock
        data, and :class:`ManagerClosedError` if the manager is (or gets) closed, the
        wait included; then nothing is held.

        A thread that ends while it holds a watchdog-managed lock has it released by the
        watchdog, with a warning and an ``on_lost`` report.
        """
        mgr = self._manager
        return mgr._run(self._acquire(mgr.owner_id(), blocking, timeout, lease))

    def release(self) -> None:
        """Release one hold level; the last release frees the lock and wakes waiters.

        Raises :class:`LockNotOwnedError` (changing nothing) if the calling thread does
        not hold the lock, and :class:`LockLostError` if its lease was lost meanwhile.
        """
        mgr = self._manager
        mgr._run(self._release(mgr.owner_id(), quiet_if_lost=False))

    def __enter__(self) -> Lock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # An inner block already raised LockLostError for this lock: unwind quietly
        # rather than raise it again at every level.
        mgr = self._manager
        mgr._run(self._release(mgr.owner_id(), quiet_if_lost=isinstance(exc, LockLostError)))

    def locked(self) -> bool:
        """Whether anyone holds the lock on a quorum of masters (one round, read-only)."""
        return self._manager._run(self._locked())

    def force_unlock(self) -> bool:
        """Delete the lock on every master, whoever holds it, and wake its waiters.

        For operators recovering from a stuck holder: the holder is not told until its
        next renewal, re-entry or release raises :class:`LockLostError`. Returns True if
        any master had the lock.
        """
        return self._manager._run(self._force_unlock())
