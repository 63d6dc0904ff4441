"""The asyncio semaphore: :class:`Semaphore`, whose permits are owned by tasks."""

from __future__ import annotations

from .._core.kinds import SEMAPHORES, SemaphoreKind
from .._core.owner import OwnerInfo, parse_owner
from .lock import Lock


class Semaphore(Lock):
    """The asyncio twin of :class:`redreentrant.Semaphore`: its permits are owned by
    tasks. Get one from :meth:`LockManager.semaphore`."""

    kind: SemaphoreKind = SEMAPHORES
    fixed_fencing = False

    def __repr__(self) -> str:
        return f"<Semaphore {self.name!r} permits={self.permits}>"

    @property
    def permits(self) -> int:
        """How many owners may hold a permit at once."""
        return self.kind.permits

    async def available(self) -> int:
        """How many permits are free on a quorum's view (one read-only round)."""
        return await self._driver.run(self._engine.permits_free(self.kind, self.name))

    async def holders(self) -> dict[str, OwnerInfo | None]:
        """Who holds a permit on a quorum of the masters (one read-only round): owner id
        -> what the id tells."""
        owners = await self._driver.run(self._engine.permit_holders(self.kind, self.name))
        return {owner: parse_owner(owner) for owner in owners}

    async def locked(self) -> bool:
        """Whether no permit is free on a quorum's view (one read-only round)."""
        return await self.available() == 0

    async def __aenter__(self) -> Semaphore:
        await self.acquire()
        return self
