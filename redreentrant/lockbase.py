"""What every lock object does, for the sync and the asyncio front ends alike.

The bookkeeping of holds (re-entry, loss, ownership) is written here once, as
generators of effects; :class:`redreentrant.Lock` drives them with threads and
``redreentrant.asyncio.Lock`` with tasks. The owner is passed in explicitly so that a
release can finish in a shielded task that is not the owner itself.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from .errors import LockLostError, LockNotOwnedError, LockUpgradeError, ManagerClosedError
from .holds import Hold
from .keys import validate_name
from .kinds import EXCLUSIVE, LockKind
from .quorum import Steps
from .steps import acquire_steps, force_unlock_steps, held_by_quorum, probe_steps, release_steps

if TYPE_CHECKING:
    from .managerbase import ManagerBase


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


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def call_site() -> str:
    """Where the caller outside this package is (``file:line in function``): named in
    the warning when a hold's owner dies. A few frame hops, no traceback is built."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "?"
    code = frame.f_code
    return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"


class LockBase:
    """A lock named ``name`` of one kind, seen from one manager (shared logic)."""

    kind: LockKind = EXCLUSIVE

    def __init__(self, manager: ManagerBase[Any], name: str) -> None:
        self._manager = manager
        self.name = validate_name(name)

    def __repr__(self) -> str:
        try:
            held = f" hold_count={self.hold_count}"
        except RuntimeError:  # an asyncio lock looked at from outside a task
            held = ""
        return f"<{type(self).__name__} {self.name!r}{held}>"

    def _hold(self) -> Hold | None:
        mgr = self._manager
        return mgr._holds.get(self.kind, self.name, mgr.owner_id())

    # -- algorithms (generators of effects) -----------------------------------------

    def _acquire(
        self, owner: str, blocking: bool, timeout: float, lease: float | None
    ) -> Steps[bool]:
        check_acquire_args(blocking, timeout)
        mgr = self._manager
        q = mgr._quorum
        lease_s = mgr._check_lease(lease)
        hold = mgr._holds.get(self.kind, self.name, owner)
        if hold is not None:
            if hold.lost is not None:
                raise LockLostError(f"lock {self.name!r} was lost: {hold.lost}")
            if hold.managed and lease is not None:
                # The watchdog renews this hold with the manager's lease every lease/3:
                # a shorter TTL set now would expire between its ticks.
                raise ValueError(
                    f"lock {self.name!r} is held with a watchdog-managed lease: a re-entry"
                    " cannot set lease= (re-enter without it, or take the first hold"
                    " with a fixed lease)"
                )
            renewed = hold.lease if lease is None else lease_s
            count = hold.count + 1
            steps = acquire_steps(q, self.kind, self.name, owner, count, renewed, True, None)
            try:
                valid_until = yield from steps
            except LockLostError as error:
                hold.lost = str(error)
                raise
            assert valid_until is not None  # a re-entry succeeds or raises
            hold.count += 1
            hold.lease = renewed
            hold.valid_until = valid_until
            return True
        upgrade = self.kind.upgrade_from
        if upgrade is not None and mgr._holds.get(upgrade, self.name, owner) is not None:
            raise LockUpgradeError(
                f"lock {self.name!r}: a holder of the read lock cannot take the write lock"
                " (release the read lock first)"
            )
        site = call_site()
        deadline = None if timeout == -1 or not blocking else time.monotonic() + timeout
        steps = acquire_steps(
            q, self.kind, self.name, owner, 1, lease_s, blocking, deadline, mgr._is_closed
        )
        valid_until = yield from steps
        if valid_until is None:
            return False
        if mgr.closed:
            # Granted while the manager was closing: nothing would renew or report it.
            with contextlib.suppress(Exception):
                yield from release_steps(q, self.kind, self.name, owner, 0)
            raise ManagerClosedError("the lock manager was closed during the acquire")
        hold = Hold(self.kind, self.name, owner, 1, lease_s, lease is None, valid_until, site=site)
        mgr._holds.add(hold)
        if hold.managed:
            mgr._watchdog.ensure_started()
        return True

    def _release(self, owner: str, quiet_if_lost: bool) -> Steps[None]:
        mgr = self._manager
        hold = mgr._holds.get(self.kind, self.name, owner)
        if hold is None:
            raise LockNotOwnedError(f"lock {self.name!r} is not held by this owner")
        hold.count -= 1
        if hold.count == 0:
            # Off the watchdog before the release runs, so it is never renewed after.
            mgr._holds.remove(hold)
        steps = release_steps(mgr._quorum, self.kind, self.name, owner, hold.count)
        if hold.lost is not None:
            if hold.count == 0:
                # Already reported as lost: remove what is left where it still is; what
                # cannot be removed now expires with its lease.
                with contextlib.suppress(Exception):
                    yield from steps
            if quiet_if_lost:
                return
            raise LockLostError(f"lock {self.name!r} was lost: {hold.lost}")
        try:
            yield from steps
        except LockLostError as error:
            hold.lost = str(error)
            raise

    def _locked(self) -> Steps[bool]:
        q = self._manager._quorum
        views = yield from probe_steps(q, (self.kind,), self.name)
        return held_by_quorum(q, self.kind, views)

    def _force_unlock(self) -> Steps[bool]:
        return force_unlock_steps(self._manager._quorum, (self.kind,), self.name)

    # -- local state (no I/O) -----------------------------------------------------------

    @property
    def hold_count(self) -> int:
        """How many times the calling owner holds the lock (0 if it does not)."""
        hold = self._hold()
        return 0 if hold is None else hold.count

    def is_owned(self) -> bool:
        """Whether the calling owner holds the lock, with validity left and no loss
        detected. Local knowledge only: no round trip."""
        hold = self._hold()
        return hold is not None and hold.lost is None and hold.valid_until > time.monotonic()

    def remaining(self) -> float:
        """Seconds of validity left on the calling owner's hold (0.0 if not owned).

        For a watchdog-managed hold this is refreshed at every renewal."""
        hold = self._hold()
        if hold is None or hold.lost is not None:
            return 0.0
        return max(0.0, hold.valid_until - time.monotonic())
