"""The sync read/write lock: many readers or one writer, both reentrant."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import LockUpgradeError
from .kinds import READ, WRITE, LockKind
from .lock import Lock

if TYPE_CHECKING:
    from .manager import LockManager


class ReadLock(Lock):
    """The read side of a :class:`ReadWriteLock`: shared with other readers.

    A reader is refused while a writer holds the lock or waits for it (so a stream of
    readers cannot starve a writer). Each reader's hold has its own lease: a reader that
    dies frees its share by itself when its lease ends. The thread holding the write lock
    may take the read lock too, and keeps it after releasing the write lock (downgrade).
    """

    kind: LockKind = READ


class WriteLock(Lock):
    """The write side of a :class:`ReadWriteLock`: excludes readers and other writers.

    A thread that holds only the read lock cannot take the write lock (it would wait for
    itself forever): the attempt raises :class:`LockUpgradeError` at once, whatever the
    timeout. Release the read lock first.
    """

    kind: LockKind = WRITE

    def _check_first_hold(self, owner: str) -> None:
        if self._manager._holds.get(READ, self.name, owner) is not None:
            raise LockUpgradeError(
                f"lock {self.name!r}: a holder of the read lock cannot take the write lock"
                " (release the read lock first)"
            )


class ReadWriteLock:
    """A read/write lock named ``name``: ``.read`` and ``.write`` are its two locks.

    Both are reentrant and owned by the thread that acquires them. Get one from
    :meth:`LockManager.rw_lock`.
    """

    def __init__(self, manager: LockManager, name: str) -> None:
        self.read = ReadLock(manager, name)
        self.write = WriteLock(manager, name)
        self.name = self.read.name

    def __repr__(self) -> str:
        return f"<ReadWriteLock {self.name!r}>"
