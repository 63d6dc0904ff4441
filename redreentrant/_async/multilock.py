"""The asyncio multi-lock: :class:`MultiLock`, several locks held as one by a task."""

from __future__ import annotations

from .._core.engine import Engine
from .._core.kinds import EXCLUSIVE, MultiKind
from .driver import AsyncDriver
from .lock import Lock


class MultiLock(Lock):
    """The asyncio twin of :class:`redreentrant.MultiLock`, owned by a task. Get one
    from :meth:`LockManager.multi_lock`."""

    kind: MultiKind

    def __init__(
        self,
        engine: Engine,
        driver: AsyncDriver,
        kind: MultiKind,
        fencing: bool | None = None,
        cancel_on_loss: bool = False,
        owner: str | None = None,
    ) -> None:
        super().__init__(engine, driver, kind.label_of_names, fencing, cancel_on_loss, owner)
        self.kind = kind

    def __repr__(self) -> str:
        return f"<MultiLock {list(self.names)!r}>"

    @property
    def names(self) -> tuple[str, ...]:
        """The names, in the order the locks are taken (by hash slot, then by name)."""
        return self.kind.names

    @property
    def tokens(self) -> dict[str, int]:
        """The fencing token of each name, for the calling owner's hold."""
        return self._engine.tokens(self.kind, self.name, self._owner())

    async def locked(self) -> bool:
        """Whether any of the names is held on a quorum of masters (read-only rounds)."""
        for n in self.names:
            if await self._driver.run(self._engine.locked(EXCLUSIVE, n)):
                return True
        return False

    async def force_unlock(self) -> bool:
        """Delete every name's lock on every master, whoever holds it."""
        unlocked = [
            await self._driver.run(self._engine.force_unlock((EXCLUSIVE,), n)) for n in self.names
        ]
        return any(unlocked)

    async def raise_fence(self, at_least: int) -> int:
        """Raise every name's fencing counters to at least ``at_least``."""
        acks = [
            await self._driver.run(self._engine.raise_fence(EXCLUSIVE, n, at_least))
            for n in self.names
        ]
        return min(acks)

    async def fence_floor(self) -> int:
        """The largest of the names' fencing floors (see :meth:`Lock.fence_floor`)."""
        return max(
            [await self._driver.run(self._engine.fence_floor(EXCLUSIVE, n)) for n in self.names]
        )

    async def __aenter__(self) -> MultiLock:
        await self.acquire()
        return self
