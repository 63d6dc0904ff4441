"""python-redis-lock's module name for its own tests: the adapter, re-exported."""

from redreentrant.compat.redis_lock import (
    AlreadyAcquired,
    AlreadyStarted,
    InvalidTimeout,
    Lock,
    NotAcquired,
    NotExpirable,
    TimeoutNotUsable,
    TimeoutTooLarge,
    reset_all,
)

__all__ = [
    "AlreadyAcquired",
    "AlreadyStarted",
    "InvalidTimeout",
    "Lock",
    "NotAcquired",
    "NotExpirable",
    "TimeoutNotUsable",
    "TimeoutTooLarge",
    "reset_all",
]
