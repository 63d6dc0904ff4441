"""Clients for the nodes of cluster members (asyncio flavour): made on first use, one
per node, shared by the transport and the wake-up hub, closed with the manager (see
:mod:`redreentrant._sync.cluster`, its thread twin)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.connection
from redis.asyncio.connection import AbstractConnection

from .._core.cluster import Address, ClusterMember, connect_timeout
from .._core.masters import no_handshake


def cluster_types() -> tuple[type, ...]:
    """The cluster client classes an asyncio manager takes as members."""
    types: list[type] = [redis.asyncio.cluster.RedisCluster]
    try:
        import valkey.asyncio.cluster  # optional: only if the application uses valkey-py
    except ImportError:
        pass
    else:
        types.append(valkey.asyncio.cluster.ValkeyCluster)
    return tuple(types)


class NodeClients:
    """One ``redis.asyncio.Redis`` per node of each cluster member, made when needed.

    No socket time-out: the transport bounds every read itself (as for the clients it
    makes from URLs), and the connect time-out is at most the master timeout."""

    def __init__(self, members: Sequence[object], timeout: float) -> None:
        self._members = list(members)
        self._timeout = timeout
        self._clients: dict[tuple[int, Address], redis.asyncio.Redis] = {}

    def client(self, i: int, node: Address) -> redis.asyncio.Redis:
        """The client of member ``i``'s ``node``."""
        found = self._clients.get((i, node))
        if found is None:
            member = self._members[i]
            assert isinstance(member, ClusterMember)
            options: dict[str, Any] = {
                **member.options,
                "socket_timeout": None,
                "socket_connect_timeout": connect_timeout(member, self._timeout),
                **no_handshake(AbstractConnection),
            }
            if options.pop("ssl", False):
                options["connection_class"] = redis.asyncio.connection.SSLConnection
            # A pool of its own, as from a URL (no connect retries with back-off).
            pool = redis.asyncio.ConnectionPool(host=node[0], port=node[1], **options)
            found = redis.asyncio.Redis(connection_pool=pool)
            self._clients[(i, node)] = found
        return found

    async def primaries(self, i: int) -> list[redis.asyncio.Redis]:
        """Clients of member ``i``'s primary nodes (for ``names()`` and ``ping()``), its
        slot map read first when it is stale or was never read."""
        member = self._members[i]
        assert isinstance(member, ClusterMember)
        if member.stale:
            for node in member.refresh_targets()[:2]:
                try:
                    slots = self.client(i, node).execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
                    if member.load(await asyncio.wait_for(slots, self._timeout), node):
                        break
                except Exception:
                    continue
        return [self.client(i, node) for node in member.primaries()]

    def pubsub(self, i: int) -> Callable[[], Any]:
        """A maker of member ``i``'s pub/sub connection, on the next node each time."""
        member = self._members[i]
        assert isinstance(member, ClusterMember)
        return lambda: self.client(i, member.pick()).pubsub()

    async def close(self) -> None:
        clients = list(self._clients.values())
        self._clients.clear()
        for client in clients:
            await client.aclose()
            await client.connection_pool.disconnect()
