"""The sync reentrant lock: :class:`Lock`, owned by the calling thread."""

from __future__ import annotations

import contextlib
import math
import time
from types import TracebackType
from typing import TYPE_CHECKING

from .errors import LockLostError, LockNotOwnedError
from .holds import Hold
from .keys import validate_name
from .kinds import EXCLUSIVE, LockKind
from .steps import acquire_steps, force_unlock_steps, held_by_quorum, probe_steps, release_steps

if TYPE_CHECKING:
    from .manager import LockManager


def check_acquire_args(blocking: bool, timeout: float) -> None:
    """``threading.Lock.acquire`` rules for ``blocking`` and ``timeout``."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number, not {type(timeout).__name__}")
    if math.isnan(timeout):
        raise ValueError("timeout must not be NaN")
    if not blocking and timeout != -1:
        raise ValueError("can't specify a timeout for a non-blocking call")
    if timeout < 0 and timeout != -1:
        raise ValueError("timeout value must be a non-negative number, or -1 for no limit")


class Lock:
    """A distributed, reentrant lock owned by the thread that acquires it.

    Semantics follow :class:`threading.RLock`: the owning thread may acquire it again
    (each acquire needs its own release), and only the owner may release it. Lock
    objects are cheap views: two ``mgr.lock("x")`` objects in one thread share the
    thread's hold, and different threads (or managers) are different owners.

    Get one from :meth:`LockManager.lock`.
    """

    kind: LockKind = EXCLUSIVE

    def __init__(self, manager: LockManager, name: str, kind: LockKind | None = None) -> None:
        self._manager = manager
        self.name = validate_name(name)
        if kind is not None:
            self.kind = kind

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} hold_count={self.hold_count}>"

    def _hold(self) -> Hold | None:
        mgr = self._manager
        return mgr._holds.get(self.kind, self.name, mgr.owner_id())

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
        owner's lease was lost. Raises :class:`QuorumUnavailableError` when too many
        masters fail to answer, and :class:`LockKeyTypeError` if the key holds non-lock
        data.
        """
        check_acquire_args(blocking, timeout)
        mgr = self._manager
        lease_s = mgr._check_lease(lease)
        owner = mgr.owner_id()
        hold = mgr._holds.get(self.kind, self.name, owner)
        if hold is not None:
            return self._reenter(hold, lease)
        self._check_first_hold(owner)
        deadline = None if timeout == -1 or not blocking else time.monotonic() + timeout
        steps = acquire_steps(
            mgr._quorum, self.kind, self.name, owner, 1, lease_s, blocking, deadline
        )
        valid_until = mgr._run(steps)
        if valid_until is None:
            return False
        hold = Hold(self.kind, self.name, owner, 1, lease_s, lease is None, valid_until)
        mgr._holds.add(hold)
        if hold.managed:
            mgr._watchdog.ensure_started()
        return True

    def _check_first_hold(self, owner: str) -> None:
        """Refuse a first hold that could never be granted (see the write lock)."""

    def _reenter(self, hold: Hold, lease: float | None) -> bool:
        mgr = self._manager
        if hold.lost is not None:
            raise LockLostError(f"lock {self.name!r} was lost: {hold.lost}")
        lease_s = hold.lease if lease is None else lease
        steps = acquire_steps(
            mgr._quorum, self.kind, self.name, hold.owner, hold.count + 1, lease_s, True, None
        )
        try:
            valid_until = mgr._run(steps)
        except LockLostError as error:
            hold.lost = str(error)
            raise
        assert valid_until is not None  # re-entry never returns "not free"
        hold.count += 1
        hold.valid_until = valid_until
        return True

    def release(self) -> None:
        """Release one hold level; the last release frees the lock and wakes waiters.

        Raises :class:`LockNotOwnedError` (changing nothing) if the calling thread does
        not hold the lock, and :class:`LockLostError` if its lease was lost meanwhile.
        """
        self._release(quiet_if_lost=False)

    def _release(self, quiet_if_lost: bool) -> None:
        mgr = self._manager
        hold = self._hold()
        if hold is None:
            raise LockNotOwnedError(f"lock {self.name!r} is not held by this owner")
        hold.count -= 1
        if hold.count == 0:
            # Off the watchdog before the release runs, so it is never renewed after.
            mgr._holds.remove(hold)
        if hold.lost is not None:
            if hold.count == 0:
                self._clean_up_lost(hold)
            if quiet_if_lost:
                return
            raise LockLostError(f"lock {self.name!r} was lost: {hold.lost}")
        try:
            mgr._run(release_steps(mgr._quorum, self.kind, self.name, hold.owner, hold.count))
        except LockLostError as error:
            hold.lost = str(error)
            raise

    def _clean_up_lost(self, hold: Hold) -> None:
        """Remove what is left of a lost hold on the masters that still have it."""
        mgr = self._manager
        # Already reported as lost; what cannot be removed now expires with its lease.
        with contextlib.suppress(Exception):
            mgr._run(release_steps(mgr._quorum, self.kind, self.name, hold.owner, 0))

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
        self._release(quiet_if_lost=isinstance(exc, LockLostError))

    @property
    def hold_count(self) -> int:
        """How many times the calling thread holds the lock (0 if it does not)."""
        hold = self._hold()
        return 0 if hold is None else hold.count

    def is_owned(self) -> bool:
        """Whether the calling thread holds the lock, with validity left and no loss
        detected. Local knowledge only: no round trip."""
        hold = self._hold()
        return hold is not None and hold.lost is None and hold.valid_until > time.monotonic()

    def remaining(self) -> float:
        """Seconds of validity left on the calling thread's hold (0.0 if not owned).

        For a watchdog-managed hold this is refreshed at every renewal."""
        hold = self._hold()
        if hold is None or hold.lost is not None:
            return 0.0
        return max(0.0, hold.valid_until - time.monotonic())

    def locked(self) -> bool:
        """Whether anyone holds the lock on a quorum of masters (one round, read-only)."""
        mgr = self._manager
        views = mgr._run(probe_steps(mgr._quorum, (self.kind,), self.name))
        return held_by_quorum(mgr._quorum, self.kind, views)

    def force_unlock(self) -> bool:
        """Delete the lock on every master, whoever holds it, and wake its waiters.

        For operators recovering from a stuck holder: the holder is not told until its
        next renewal, re-entry or release raises :class:`LockLostError`. Returns True if
        any master had the lock.
        """
        mgr = self._manager
        return mgr._run(force_unlock_steps(mgr._quorum, (self.kind,), self.name))
