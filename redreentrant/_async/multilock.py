"""The asyncio multi-lock: :class:`MultiLock`, several locks held as one by a task."""

from __future__ import annotations

from .._core.kinds import MultiKind
from .lock import Lock


class MultiLock(Lock):
    """The asyncio twin of :class:`redreentrant.MultiLock`, owned by a task. Get one
    from :meth:`LockManager.multi_lock`."""

    kind: MultiKind

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

    async def __aenter__(self) -> MultiLock:
        await self.acquire()
        return self
