"""Clients of Sentinel-managed members made from ``redis+sentinel://`` URLs (thread
flavour): redis-py's ``Sentinel.master_for`` client, whose connections ask the sentinels
for the master's address as they connect (see :mod:`redreentrant._core.sentinel`)."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.connection import AbstractConnection
from redis.retry import Retry
from redis.sentinel import Sentinel

from .._core.masters import no_handshake
from .._core.sentinel import parse_sentinel_url


class SentinelClient(redis.Redis):
    """The client of a Sentinel-managed master that a manager made from a URL: closing
    it closes its pool and its clients of the sentinels too."""

    def close(self) -> None:
        super().close()
        pool: Any = self.connection_pool
        pool.disconnect()
        for sentinel in pool.sentinel_manager.sentinels:
            sentinel.close()
            sentinel.connection_pool.disconnect()


def sentinel_client(url: str, timeout: float) -> redis.Redis:
    """A client of the master of the Sentinel-managed group ``url`` names, with
    ``timeout`` for connecting and reading, to the sentinels and to the master, and no
    retries (a round has its own deadline; the next one connects again)."""
    target = parse_sentinel_url(url)
    options: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
        **no_handshake(AbstractConnection),
    }
    sentinels = list(target.sentinels)
    sentinel = Sentinel(sentinels, sentinel_kwargs={**options, **target.tls})  # type: ignore[no-untyped-call]
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        target.service, redis_class=SentinelClient, db=target.db, **options, **target.options
    )
    return client
