"""The sync multi-lock: :class:`MultiLock`, several locks held as one by a thread."""

from __future__ import annotations

from .._core.engine import Engine
from .._core.kinds import EXCLUSIVE, MultiKind
from .driver import SyncDriver
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

    def __init__(
        self,
        engine: Engine,
        driver: SyncDriver,
        kind: MultiKind,
        fencing: bool | None = None,
        owner: str | None = None,
    ) -> None:
        super().__init__(engine, driver, kind.label_of_names, fencing, owner)
        self.kind = kind

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

    def locked(self) -> bool:
        """Whether any of the names is held on a quorum of masters (read-only rounds)."""
        return any(self._driver.run(self._engine.locked(EXCLUSIVE, n)) for n in self.names)

    def force_unlock(self) -> bool:
        """Delete every name's lock on every master, whoever holds it (see
        :meth:`Lock.force_unlock`). Returns True if any master had one."""
        unlocked = [
            self._driver.run(self._engine.force_unlock((EXCLUSIVE,), n)) for n in self.names
        ]
        return any(unlocked)

    def raise_fence(self, at_least: int) -> int:
        """Raise every name's fencing counters to at least ``at_least`` (see
        :meth:`Lock.raise_fence`); returns the fewest masters that acknowledged a name."""
        acks = [
            self._driver.run(self._engine.raise_fence(EXCLUSIVE, n, at_least)) for n in self.names
        ]
        return min(acks)

    def fence_floor(self) -> int:
        """The largest of the names' :meth:`Lock.fence_floor`: raised to it
        (:meth:`raise_fence`), every name's next tokens are larger than its last."""
        return max(self._driver.run(self._engine.fence_floor(EXCLUSIVE, n)) for n in self.names)

    def __enter__(self) -> MultiLock:
        self.acquire()
        return self
