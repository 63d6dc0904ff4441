"""The asyncio :class:`FencedStore`: a value in Redis guarded by fencing tokens."""

from __future__ import annotations

import redis.asyncio

from .._core.guard import SCRIPT, token_key, write_args
from .._core.replies import accepted


class FencedStore:
    """The asyncio twin of :class:`redreentrant.FencedStore` (over a
    ``redis.asyncio.Redis`` client)."""

    def __init__(
        self, client: redis.asyncio.Redis, key: str, *, token_key: str | None = None
    ) -> None:
        self.client = client
        self.key = key
        self.token_key = token_key if token_key is not None else _default(key)
        self._script = client.register_script(SCRIPT.source)

    async def write(self, token: int, value: str | bytes | int | float) -> bool:
        """See :meth:`redreentrant.FencedStore.write`."""
        reply = await self._script(keys=[self.key, self.token_key], args=write_args(token, value))
        return accepted(reply)

    async def read(self) -> bytes | None:
        """See :meth:`redreentrant.FencedStore.read`."""
        value = await self.client.get(self.key)
        return None if value is None else value.encode() if isinstance(value, str) else bytes(value)

    async def largest_token(self) -> int | None:
        """See :meth:`redreentrant.FencedStore.largest_token`."""
        value = await self.client.get(self.token_key)
        return None if value is None else int(value)


_default = token_key
