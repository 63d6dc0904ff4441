"""redreentrant: reentrant, owner-scoped distributed locks on a Redlock quorum of Redis masters.

>>> from redreentrant import LockManager
>>> with LockManager(["redis://127.0.0.1:6379/0"]) as mgr:   # doctest: +SKIP
...     with mgr.lock("orders:42"):
...         ...
"""

from .errors import (
    LockError,
    LockKeyTypeError,
    LockLostError,
    LockNotOwnedError,
    LockOwnerError,
    LockUpgradeError,
    ManagerClosedError,
    QuorumUnavailableError,
    RedisServerNotFound,
)
from .fairlock import FairLock
from .lock import Lock
from .manager import LockManager
from .owner import OwnerInfo, parse_owner
from .rwlock import ReadLock, ReadWriteLock, WriteLock
from .views import LockView, MasterView

__version__ = "0.1.0"

__all__ = [
    "FairLock",
    "Lock",
    "LockError",
    "LockKeyTypeError",
    "LockLostError",
    "LockManager",
    "LockNotOwnedError",
    "LockOwnerError",
    "LockUpgradeError",
    "LockView",
    "ManagerClosedError",
    "MasterView",
    "OwnerInfo",
    "QuorumUnavailableError",
    "ReadLock",
    "ReadWriteLock",
    "RedisServerNotFound",
    "WriteLock",
    "__version__",
    "parse_owner",
]
