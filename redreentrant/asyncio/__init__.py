"""The asyncio twin of redreentrant: the same names, owned by tasks instead of threads.

>>> from redreentrant.asyncio import LockManager
>>> async def main() -> None:                      # doctest: +SKIP
...     async with LockManager(["redis://127.0.0.1:6379/0"]) as mgr:
...         async with mgr.lock("orders:42"):
...             ...
"""

from .._async.election import Campaign, Election
from .._async.fenced import FencedStore
from .._async.lock import FairLock, Lock, ReadLock, UpgradeableReadLock, WriteLock
from .._async.manager import LockManager
from .._async.multilock import MultiLock
from .._async.semaphore import Semaphore
from .._async.signals import LostSignal
from .._core.election import LeaderView
from .._core.errors import (
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
from .._core.listeners import LockInfo, LockListener
from .._core.locking import ReadWriteLock
from .._core.owner import OwnerInfo, parse_owner
from .._core.views import LockView, MasterView

__all__ = [
    "Campaign",
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
    "parse_owner",
]
