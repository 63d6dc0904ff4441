"""Every exception redreentrant raises on purpose.

Hierarchy::

    LockError                       base of everything below
    ├── LockNotOwnedError           release by an owner that holds nothing
    ├── LockLostError               the lease was lost while held
    ├── LockUpgradeError            a reader asked for the write lock (would self-deadlock)
    ├── LockKeyTypeError            a lock key holds data that is not a lock
    └── QuorumUnavailableError      too many masters failed to answer for a quorum

Bad arguments (an empty name, a lease <= 0, a negative timeout, ...) raise the built-in
``ValueError`` or ``TypeError`` before anything is sent to Redis.
"""

from __future__ import annotations

from collections.abc import Mapping


class LockError(Exception):
    """Base class of the errors raised by redreentrant."""


class LockNotOwnedError(LockError):
    """The calling owner (thread or task) does not hold the lock it tried to release."""


class LockLostError(LockError):
    """The owner's lease was lost: it expired, was deleted, or could not be renewed on a quorum.

    Mutual exclusion was not guaranteed from the moment the lease was lost; work done
    under the lock since then must be treated as unprotected.
    """


class LockUpgradeError(LockError):
    """A holder of a read lock asked for the write lock, which could never be granted."""


class LockKeyTypeError(LockError):
    """A lock's key exists on a master but holds a value that is not a lock."""

    def __init__(self, key: str, master: str, detail: str) -> None:
        super().__init__(f"key {key!r} on {master} is not a redreentrant lock ({detail})")
        self.key = key
        self.master = master


class QuorumUnavailableError(LockError):
    """Too many masters failed (errors or time-outs, not contention) for a quorum.

    ``errors`` maps each failed master's address to the exception it gave.
    """

    def __init__(self, action: str, errors: Mapping[str, BaseException], needed: int) -> None:
        detail = "; ".join(f"{m}: {type(e).__name__}: {e}" for m, e in errors.items())
        super().__init__(
            f"{action}: {len(errors)} master(s) failed, a quorum of {needed} is out of reach"
            f" ({detail})"
        )
        self.errors: dict[str, BaseException] = dict(errors)
        self.needed = needed


class RedisServerNotFound(RuntimeError):
    """No redis-server binary could be found for an embedded local ensemble."""
