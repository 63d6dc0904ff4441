"""The read/write lock: many readers or one writer, both reentrant (sync front end)."""

from __future__ import annotations

from typing import Generic, TypeVar

from .kinds import READ, WRITE, LockKind
from .lock import Lock

L = TypeVar("L")


class ReadLock(Lock):
    """The read side of a read/write lock: shared with other readers.

    A reader is refused while a writer holds the lock or waits for it (so a stream of
    readers cannot starve a writer). Each reader's hold has its own lease: a reader that
    dies frees its share by itself when its lease ends. The owner holding the write lock
    may take the read lock too, and keeps it after releasing the write lock (downgrade).
    """

    kind: LockKind = READ


class WriteLock(Lock):
    """The write side of a read/write lock: excludes readers and other writers.

    An owner that holds only the read lock cannot take the write lock (it would wait for
    itself forever): the attempt raises :class:`LockUpgradeError` at once, whatever the
    timeout. Release the read lock first.
    """

    kind: LockKind = WRITE


class ReadWriteLock(Generic[L]):
    """A read/write lock named ``name``: ``.read`` and ``.write`` are its two locks.

    Both are reentrant and owned by the thread (or task) that acquires them. Get one
    from ``LockManager.rw_lock``.
    """

    def __init__(self, name: str, read: L, write: L) -> None:
        self.name = name
        self.read = read
        self.write = write

    def __repr__(self) -> str:
        return f"<ReadWriteLock {self.name!r}>"
