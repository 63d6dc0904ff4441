"""The fair lock: reentrant, granted in order of arrival (sync front end)."""

from __future__ import annotations

from .kinds import FAIR, LockKind
from .lock import Lock


class FairLock(Lock):
    """A reentrant lock granted first come, first served.

    Blocked acquirers queue in Redis (on every master) with a deadline in server time
    that each refreshes while it waits; a release wakes only the head of the queue. A
    waiter that gives up leaves the queue; one that dies is dropped once its deadline
    (at most one lease) passes, so the queue never sticks. ``acquire(blocking=False)``
    does not queue, and is refused while others are queued. With several masters, the
    order is the one a quorum of masters saw: see the docs for what that promises.
    Get one from :meth:`LockManager.fair_lock`.
    """

    kind: LockKind = FAIR
