"""The loopback address servers listen on: free ports, and clients that probe fast.

Free ports come from the kernel's own allocator (bind to port 0), with every socket of a
batch held open until all are picked, so a batch never repeats a port (``port-for``
serves the opposite need: a port kept for a service across runs, which port 0 binds
would *not* pick).
Another process may still take a port before ``redis-server`` binds it: a server's first
start moves to a fresh port then (:meth:`redreentrant.testing.LocalServer.start`).
"""

from __future__ import annotations

import socket

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .._core.keys import MEMORY_KEY

__all__ = ["HOST", "PROBE_TIMEOUT", "client", "free_ports", "pid_on"]

HOST = "127.0.0.1"
"""The only address servers started here listen on."""

PROBE_TIMEOUT = 0.2
"""Seconds for one probe of a server (a readiness check, a status)."""


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct ports that were free on :data:`HOST` a moment ago."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def client(port: int, timeout: float, host: str = HOST) -> redis.Redis:
    """A client of the server on ``host:port`` that never retries, decoding replies."""
    # No retries: a probe must fail fast, and redis-py >= 6 retries 3 times by default.
    return redis.Redis(
        host=host,
        port=port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


def pid_on(port: int, timeout: float = PROBE_TIMEOUT, host: str = HOST) -> int | None:
    """The pid of the ``redis-server`` answering on ``host:port``, or None if none
    answers.

    A pid, not a PING: a server that answers on a port may be someone else's."""
    probe = client(port, timeout, host)
    try:
        return int(probe.info("server").get("process_id", -1))
    except (redis.RedisError, OSError, ValueError):
        return None
    finally:
        probe.close()


def remember_from_the_start(port: int, timeout: float = PROBE_TIMEOUT, host: str = HOST) -> None:
    """Tell a server that just started for the first time, empty, that its memory began
    before any lease (its memory record, unless it has one): no hold can have been
    forgotten there, so it is not quarantined (see docs/safety.md). Never for a server
    that restarted or was flushed while holds may stand: that is the fault the
    quarantine exists for. Only on a master: a replica copies its master's record, and a
    sentinel holds no data."""
    with client(port, timeout, host) as connection:
        if connection.info("cluster").get("cluster_enabled"):  # a cluster node keeps none
            return
        replication = connection.info("replication")
        if replication.get("role") == "master" and not connection.exists(MEMORY_KEY):
            # With its previous replication id, as the scripts write it: a replica
            # promoted later then tells a failover from a restart that kept the data.
            began = {"began": 0, "replid2": replication["master_replid2"], "failover": 0}
            connection.hset(MEMORY_KEY, mapping=began)
