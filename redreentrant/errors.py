"""Every exception redreentrant raises on purpose (the same classes in
:mod:`redreentrant` and :mod:`redreentrant.asyncio`).

Hierarchy::

    LockError                       base of everything below
    ├── LockNotOwnedError           release by an owner that holds nothing
    ├── LockLostError               the lease was lost while held
    ├── LockUpgradeError            a reader asked for the write lock (would self-deadlock)
    ├── LockKeyTypeError            a lock key holds data that is not a lock
    ├── LockOwnerError              an asyncio acquire ran in a task of its own
    ├── FencingError                a fencing token could not be proven larger
    ├── DurabilityError             a master cannot make writes as durable as asked
    ├── LockTimeoutError            a synchronized call timed out (also a TimeoutError)
    ├── ManagerClosedError          the manager was closed (also a RuntimeError)
    └── QuorumUnavailableError      too many masters failed to answer for a quorum

Bad arguments (an empty name, a lease <= 0, a negative timeout, ...) raise the built-in
``ValueError`` or ``TypeError`` before anything is sent to Redis.

Every error pickles (it crosses ``multiprocessing`` and ``concurrent.futures``); a
master's error that does not pickle travels as a ``RuntimeError`` with its text.
"""

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

__all__ = [
    "DurabilityError",
    "FencingError",
    "LockError",
    "LockKeyTypeError",
    "LockLostError",
    "LockNotOwnedError",
    "LockOwnerError",
    "LockTimeoutError",
    "LockUpgradeError",
    "ManagerClosedError",
    "QuorumUnavailableError",
]
