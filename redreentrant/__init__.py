"""redreentrant: reentrant, owner-scoped distributed locks on a Redlock quorum of Redis masters.

The thread flavour: locks owned by threads. The same names, owned by asyncio tasks, are
in :mod:`redreentrant.asyncio`.

>>> from redreentrant import LockManager
>>> with LockManager(["redis://127.0.0.1:6379/0"]) as mgr:   # doctest: +SKIP
...     with mgr.lock("orders:42"):
...         ...
"""

from ._core.errors import (
    FencingError,
    LockError,
    LockKeyTypeError,
    LockLostError,
    LockNotOwnedError,
    LockOwnerError,
    LockTimeoutError,
    LockUpgradeError,
    ManagerClosedError,
    QuorumUnavailableError,
    RedisServerNotFound,
)
from ._core.locking import ReadWriteLock
from ._core.owner import OwnerInfo, parse_owner
from ._core.views import LockView, MasterView
from ._sync.fenced import FencedStore
from ._sync.lock import FairLock, Lock, ReadLock, WriteLock
from ._sync.manager import LockManager

__version__ = "0.1.0"

__all__ = [
    "FairLock",
    "FencedStore",
    "FencingError",
    "Lock",
    "LockError",
    "LockKeyTypeError",
    "LockLostError",
    "LockManager",
    "LockNotOwnedError",
    "LockOwnerError",
    "LockTimeoutError",
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
