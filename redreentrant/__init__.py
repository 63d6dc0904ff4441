"""redreentrant: reentrant, owner-scoped distributed locks on a Redlock quorum of Redis masters.

The thread flavour: locks owned by threads. The same names, owned by asyncio tasks, are
in :mod:`redreentrant.asyncio`.

>>> from redreentrant import LockManager
>>> with LockManager(["redis://127.0.0.1:6379/0"]) as mgr:   # doctest: +SKIP
...     with mgr.lock("orders:42"):
...         ...
"""

import logging

from ._core.election import LeaderView
from ._core.errors import (
    DurabilityError,
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
)
from ._core.listeners import LockInfo, LockListener
from ._core.locking import ReadWriteLock
from ._core.owner import OwnerInfo, parse_owner
from ._core.views import LockView, MasterView
from ._sync.election import Election
from ._sync.fenced import FencedStore
from ._sync.lock import FairLock, Lock, ReadLock, UpgradeableReadLock, WriteLock
from ._sync.manager import LockManager
from ._sync.multilock import MultiLock
from ._sync.semaphore import Semaphore
from ._sync.signals import LostSignal

# The library's loggers ("redreentrant.*") print nothing unless the application
# configures logging: the usual convention for a library.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    "DurabilityError",
    "Election",
    "FairLock",
    "FencedStore",
    "FencingError",
    "LeaderView",
    "Lock",
    "LockError",
    "LockInfo",
    "LockKeyTypeError",
    "LockListener",
    "LockLostError",
    "LockManager",
    "LockNotOwnedError",
    "LockOwnerError",
    "LockTimeoutError",
    "LockUpgradeError",
    "LockView",
    "LostSignal",
    "ManagerClosedError",
    "MasterView",
    "MultiLock",
    "OwnerInfo",
    "QuorumUnavailableError",
    "ReadLock",
    "ReadWriteLock",
    "Semaphore",
    "UpgradeableReadLock",
    "WriteLock",
    "__version__",
    "parse_owner",
]
