"""The sync multi-lock: :class:`MultiLock`, several locks held as one by a thread."""

from __future__ import annotations

from .._core.kinds import MultiKind
from .lock import Lock


class MultiLock(Lock):
    """The reentrant locks of several names, taken and released together: all of them
    or none. Each name is the lock :meth:`LockManager.lock` gives, so a multi-lock
    excludes the holders of any of its names, and they exclude it. Held as one lock:
    owned by the thread that acquired it, reentrant as a whole, one watchdog entry, one
    :attr:`lost` signal. An acquire that cannot take every name takes none and leaves
    nothing taken; no acquire waits while it holds part of the names, so multi-locks
    whose names overlap in any order never deadlock. With fencing, each name gets a
    token (:attr:`tokens`). Get one from :meth:`LockManager.multi_lock`.
    """

    kind: MultiKind

    def __repr__(self) -> str:
        return f"<MultiLock {list(self.names)!r} hold_count={self.hold_count}>"

    @property
    def names(self) -> tuple[str, ...]:
        """The names, in the order the locks are taken (by hash slot, then by name)."""
        return self.kind.names

    @property
    def tokens(self) -> dict[str, int]:
        """The fencing token of each name, for the calling owner's hold (see
        :attr:`Lock.token`)."""
        return self._engine.tokens(self.kind, self.name, self._owner())

    def __enter__(self) -> MultiLock:
        self.acquire()
        return self
