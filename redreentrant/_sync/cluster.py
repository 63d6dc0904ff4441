"""Clients for the nodes of cluster members (thread flavour): made on first use, one
per node, shared by the transport and the wake-up hub, closed with the manager.

Which node a call goes to is decided in the core (:mod:`redreentrant._core.cluster`);
this only makes the node clients, with the member's options and the manager's time-outs,
and tells which client classes are cluster members (valkey-py's when it is installed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.cluster
import redis.connection
from redis.connection import AbstractConnection

from .._core.cluster import Address, ClusterMember, connect_timeout
from .._core.masters import no_handshake


def cluster_types() -> tuple[type, ...]:
    """The cluster client classes a sync manager takes as members."""
    types: list[type] = [redis.cluster.RedisCluster]
    try:
        import valkey.cluster  # optional: only if the application uses valkey-py
    except ImportError:
        pass
    else:
        types.append(valkey.cluster.ValkeyCluster)
    return tuple(types)


class NodeClients:
    """One ``redis.Redis`` per node of each cluster member, made when first needed."""

    def __init__(self, members: Sequence[object], timeout: float) -> None:
        self._members = list(members)
        self._timeout = timeout
        self._clients: dict[tuple[int, Address], redis.Redis] = {}
        self._lock = threading.Lock()

    def client(self, i: int, node: Address) -> redis.Redis:
        """The client of member ``i``'s ``node``."""
        with self._lock:
            found = self._clients.get((i, node))
            if found is None:
                member = self._members[i]
                assert isinstance(member, ClusterMember)
                options: dict[str, Any] = {
                    "socket_timeout": self._timeout,
                    **member.options,
                    "socket_connect_timeout": connect_timeout(member, self._timeout),
                    **no_handshake(AbstractConnection),
                }
                if options.pop("ssl", False):
                    options["connection_class"] = redis.connection.SSLConnection
                # A pool of its own, as from a URL: no connect retries with back-off
                # (redis.Redis's default), which would hold up a round on a dead node.
                pool = redis.ConnectionPool(host=node[0], port=node[1], **options)
                found = redis.Redis(connection_pool=pool)
                self._clients[(i, node)] = found
            return found

    def primaries(self, i: int) -> list[redis.Redis]:
        """Clients of member ``i``'s primary nodes (for ``names()`` and ``ping()``), its
        slot map read first when it is stale or was never read."""
        member = self._members[i]
        assert isinstance(member, ClusterMember)
        if member.stale:
            for node in member.refresh_targets()[:2]:
                try:
                    slots = self.client(i, node).execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
                    if member.load(slots, node):
                        break
                except Exception:
                    continue
        return [self.client(i, node) for node in member.primaries()]

    def pubsub(self, i: int) -> Callable[[], Any]:
        """A maker of member ``i``'s pub/sub connection: on one of its nodes, the next
        one at each (re)connect (a classic PUBLISH reaches every node of a cluster)."""
        member = self._members[i]
        assert isinstance(member, ClusterMember)
        return lambda: self.client(i, member.pick()).pubsub()  # type: ignore[no-untyped-call]

    def close(self) -> None:
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
        for client in clients:
            client.close()
            client.connection_pool.disconnect()
