"""Clients of Sentinel-managed members made from ``redis+sentinel://`` URLs (asyncio
flavour): ``redis.asyncio``'s ``Sentinel.master_for`` client, whose connections ask the
sentinels for the master's address as they connect (see
:mod:`redreentrant._core.sentinel`)."""

from __future__ import annotations

from typing import Any

import redis.asyncio
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from .._core.masters import no_handshake
from .._core.sentinel import parse_sentinel_url


class SentinelClient(redis.asyncio.Redis):
    """The client of a Sentinel-managed master that a manager made from a URL: closing
    it closes its pool and its clients of the sentinels too."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        pool: Any = self.connection_pool
        await pool.disconnect()
        for sentinel in pool.sentinel_manager.sentinels:
            await sentinel.aclose()
            await sentinel.connection_pool.disconnect()


def sentinel_client(url: str, timeout: float) -> redis.asyncio.Redis:
    """An asyncio client of the master of the Sentinel-managed group ``url`` names,
    with ``timeout`` for connecting (to the sentinels and to the master) and for the
    sentinels' answers, and no retries. No socket time-out on the master's connections:
    the transport bounds every master's part of a round itself (as for a plain URL)."""
    target = parse_sentinel_url(url)
    quiet: dict[str, Any] = {"retry": Retry(NoBackoff(), 0), **no_handshake(AbstractConnection)}
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels),
        sentinel_kwargs={
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            **quiet,
            **target.tls,
        },
    )
    client: redis.asyncio.Redis = sentinel.master_for(
        target.service,
        redis_class=SentinelClient,
        db=target.db,
        socket_timeout=None,
        socket_connect_timeout=timeout,
        **quiet,
        **target.options,
    )
    return client
