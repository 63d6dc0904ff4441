"""The exceptions (documented, with their hierarchy, in :mod:`redreentrant.errors`,
which re-exports them)."""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any


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
    """An owner asked for a lock that one of its own holds rules out: a side of a
    read/write lock its hold would keep from ever being granted (the write lock while
    it holds the read lock, the upgradeable lock while it holds the read or the write
    lock), or a name it holds alone and in a multi-lock at once. Raised at once;
    nothing changes."""


class LockKeyTypeError(LockError):
    """A lock's key exists on a master but holds a value that is not a lock."""

    def __init__(self, key: str, master: str, detail: str) -> None:
        super().__init__(f"key {key!r} on {master} is not a redreentrant lock ({detail})")
        self.key = key
        self.master = master
        self.detail = detail

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.master, self.detail))


class LockOwnerError(LockError):
    """An asyncio ``acquire`` ran as the whole of a task of its own (``create_task``,
    ``gather``, or ``asyncio.wait_for`` before Python 3.12): that task would own the
    lock and end at once, leaving a hold nobody can use or release. Raised before
    anything is held; the message says what to write instead."""


class FencingError(LockError):
    """A fencing token could not be proven larger than every earlier one: the lock's
    fencing counter was lost (a restart without persistence) on more masters than a
    quorum tolerates, or it is at its maximum (``2**63 - 1``) and cannot step. Raised
    by an acquire with fencing on; nothing is held. The message says which, and what
    an operator can do (see ``raise_fence``)."""


class LockTimeoutError(LockError, TimeoutError):
    """A lock was not obtained in time where going on without it is not an option: a
    call of a function decorated with ``synchronized(..., timeout=t)`` waited ``t``
    seconds for its lock and did not run. Nothing is held.

    ``name`` is the lock's name and ``timeout`` the wait in seconds. It is also a
    :class:`TimeoutError` (so ``except TimeoutError`` catches it)."""

    def __init__(self, name: str, timeout: float, detail: str = "") -> None:
        message = f"lock {name!r} was not obtained within {timeout:g} s"
        super().__init__(f"{message}: {detail}" if detail else message)
        self.name = name
        self.timeout = timeout
        self.detail = detail

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.timeout, self.detail))


class ManagerClosedError(LockError, RuntimeError):
    """The lock manager was closed: waiters woken by ``close()`` and every later call
    fail with it, and no new hold is taken."""


class DurabilityError(LockError):
    """A master cannot make its writes as durable as the manager's ``durability`` asks
    (a server without ``WAITAOF``), or did not in time (then one master's failure, in a
    :class:`QuorumUnavailableError`'s ``errors``)."""


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
        self.action = action
        self.errors: dict[str, BaseException] = dict(errors)
        self.needed = needed

    def __reduce__(self) -> tuple[Any, ...]:
        errors = _picklable(self.errors)
        # The message is kept as it was, also for errors sent as RuntimeErrors.
        state = {**self.__dict__, "errors": errors, "args": self.args}
        return (type(self), (self.action, errors, self.needed), state)


def _picklable(errors: Mapping[str, BaseException]) -> dict[str, BaseException]:
    out: dict[str, BaseException] = {}
    for master, error in errors.items():
        try:
            pickle.loads(pickle.dumps(error))
            out[master] = error
        except Exception:
            out[master] = RuntimeError(f"{type(error).__name__}: {error}")
    return out
