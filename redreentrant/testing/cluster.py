"""A local Redis Cluster for tests: :class:`LocalCluster`.

``size`` ``redis-server --cluster-enabled yes`` processes on ``127.0.0.1`` (primaries
only, no replicas), each a :class:`~redreentrant.testing.LocalServer` in a directory of
its own, with the hash slots split evenly between them by the harness (``CLUSTER
ADDSLOTSRANGE`` on Redis 7, ``ADDSLOTS`` on 6.2) and joined with ``CLUSTER MEET``. One
slot can be moved to another node while a lock is held in it, all at once
(:meth:`LocalCluster.migrate_slot`) or step by step (:meth:`LocalCluster.begin_migration`,
:meth:`LocalCluster.move_keys`, :meth:`LocalCluster.finish_migration`), so that clients
meet both ``ASK`` and ``MOVED``. Stopped like an ensemble: :meth:`LocalCluster.stop`, at
interpreter exit, or by the reaper after a hard kill.

The nodes run with ``cluster-require-full-coverage no``: a node killed by a test takes
its own slots down, and the other nodes keep serving theirs.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
import time
from collections.abc import Sequence

import redis

from .._core.keys import key_slot, lock_key
from .ensemble import make_directory, remove_directory
from .loopback import HOST, client
from .server import START_TIMEOUT, STOP_TIMEOUT, LocalServer, answering, start_all, stop_all

__all__ = ["LocalCluster", "cluster_ports"]

SLOTS = 16384
#: the cluster bus of a node listens on its port + 10000
BUS_OFFSET = 10000
_COMMAND_TIMEOUT = 5.0
_POLL_INTERVAL = 0.02
_PORT_ATTEMPTS = 3


def cluster_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free on :data:`HOST` a moment ago, each with
    its cluster bus port (+10000) free too. Both below Linux's usual range of ports for
    outgoing connections (32768 and up), which could take a bus port meanwhile."""
    ports: list[int] = []
    for _ in range(200 * count):
        if len(ports) == count:
            return ports
        port = random.randint(12000, 22000)
        if any(abs(port - p) in (0, BUS_OFFSET) for p in ports):
            continue
        try:
            for p in (port, port + BUS_OFFSET):
                with socket.socket() as s:
                    s.bind((HOST, p))
        except OSError:
            continue
        ports.append(port)
    raise RuntimeError(f"no {count} free port pairs for a cluster")


class LocalCluster:
    """A Redis Cluster of ``size`` primaries on ``127.0.0.1``, for tests.

    :param size: number of nodes, at least 1.
    :param binary: ``redis-server`` to run; default :func:`find_redis_server`.
    :param base_dir: parent directory of the cluster's temp dir; default the system one.
    :param extra_args: extra ``redis-server`` arguments given to every node.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        binary: str | None = None,
        base_dir: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self._stopped = False
        resolved, self.directory = make_directory(self, self.stop, binary, base_dir)
        args = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-require-full-coverage", "no",
            "--cluster-node-timeout", "5000",
            *extra_args,
        ]  # fmt: skip
        self.servers: list[LocalServer] = [
            LocalServer(
                binary=resolved,
                directory=os.path.join(self.directory, f"node{index}"),
                port=port,
                extra_args=args,
            )
            for index, port in enumerate(cluster_ports(size))
        ]
        self._ids: list[str] = []

    # -- state ------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return len(self.servers)

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:PORT?node=127.0.0.1:PORT...``: every node a seed."""
        first, *rest = self.servers
        nodes = "&".join(f"node={HOST}:{s.port}" for s in rest)
        return f"redis+cluster://{HOST}:{first.port}" + (f"?{nodes}" if nodes else "")

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [(HOST, s.port) for s in self.servers]

    def __len__(self) -> int:
        return len(self.servers)

    def __getitem__(self, index: int) -> LocalServer:
        return self.servers[index]

    def __repr__(self) -> str:
        return f"<LocalCluster size={self.size} ports={[s.port for s in self.servers]}>"

    def node_id(self, index: int) -> str:
        """The cluster id of node ``index``."""
        return self._ids[index]

    def owner(self, slot: int) -> int:
        """The index of the node that owns ``slot`` now (as the nodes that run see it)."""
        for server in answering(self.servers):
            with self._client(server) as r:
                for start, end, primary, *_ in r.execute_command("CLUSTER", "SLOTS"):
                    if int(start) <= slot <= int(end):
                        port = int(primary[1])
                        return next(i for i, s in enumerate(self.servers) if s.port == port)
        raise RuntimeError(f"no running node knows who owns slot {slot}")

    @staticmethod
    def slot_of(name: str) -> int:
        """The hash slot of lock ``name``'s keys."""
        return key_slot(lock_key(name))

    def names_on(self, index: int, count: int, prefix: str = "lock") -> list[str]:
        """``count`` lock names whose slot node ``index`` owns (as the slots were split)."""
        names = (f"{prefix}-{n}" for n in itertools.count())
        mine = (name for name in names if self._initial_owner(self.slot_of(name)) == index)
        return list(itertools.islice(mine, max(0, count)))

    def _initial_owner(self, slot: int) -> int:
        return min(slot * self.size // SLOTS, self.size - 1)

    def _ranges(self) -> list[tuple[int, int]]:
        bounds = [k * SLOTS // self.size for k in range(self.size + 1)]
        return [(bounds[k], bounds[k + 1] - 1) for k in range(self.size)]

    # -- life cycle -------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> LocalCluster:
        """Start every node, assign the slots, join the nodes, and wait until every node
        says ``cluster_state:ok`` and knows all the others. Returns ``self``."""
        if self._stopped:
            raise RuntimeError("this LocalCluster was stopped; create a new one")
        try:
            for attempt in range(_PORT_ATTEMPTS):
                try:
                    start_all(self.servers, timeout)
                    break
                except RuntimeError as error:
                    if "already in use" not in str(error) or attempt + 1 == _PORT_ATTEMPTS:
                        raise
                    stop_all(self.servers)
                    # Another process took a port or a bus port: all of them anew.
                    for server, port in zip(self.servers, cluster_ports(self.size), strict=True):
                        server.port = port
            self._form(timeout)
        except BaseException:
            stop_all(self.servers)
            raise
        return self

    def _form(self, timeout: float) -> None:
        self._ids = []
        for k, (server, (start, end)) in enumerate(zip(self.servers, self._ranges(), strict=True)):
            with self._client(server) as r:
                self._ids.append(str(r.execute_command("CLUSTER", "MYID")))
                try:
                    r.execute_command("CLUSTER", "ADDSLOTSRANGE", start, end)
                except redis.ResponseError:  # Redis 6.2 has no ADDSLOTSRANGE
                    r.execute_command("CLUSTER", "ADDSLOTS", *range(start, end + 1))
                r.execute_command("CLUSTER", "SET-CONFIG-EPOCH", k + 1)
        first = self.servers[0]
        for server in self.servers[1:]:
            with self._client(server) as r:
                r.execute_command("CLUSTER", "MEET", HOST, first.port)
        self.wait_stable(timeout)

    def wait_stable(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until every running node says ``cluster_state:ok``, knows every node,
        and agrees with the others on who owns every slot."""
        deadline = time.monotonic() + timeout
        running = answering(self.servers)
        while True:
            views = []
            ok = True
            for server in running:
                with self._client(server) as r:
                    info = r.execute_command("CLUSTER", "INFO")
                    known = f"cluster_known_nodes:{self.size}" in info
                    ok = ok and "cluster_state:ok" in info and known
                    views.append(
                        sorted(
                            (int(a), int(b), int(p[1]))
                            for a, b, p, *_ in r.execute_command("CLUSTER", "SLOTS")
                        )
                    )
            if ok and all(v == views[0] for v in views):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self!r} did not settle within {timeout:g}s")
            time.sleep(_POLL_INTERVAL)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop every node and remove the temp dir. Idempotent."""
        stop_all(self.servers, timeout)
        for server in self.servers:
            server.close()
        self._stopped = True
        remove_directory(self, self.directory)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- data and resharding ------------------------------------------------------------

    def _client(self, server: LocalServer) -> redis.Redis:
        return client(server.port, timeout=_COMMAND_TIMEOUT)

    def flushall(self) -> None:
        """``FLUSHALL`` on every running, unpaused node."""
        for server in answering(self.servers):
            with self._client(server) as r:
                r.flushall()

    def keys(self, pattern: str = "*") -> dict[int, list[str]]:
        """Each running, unpaused node's keys matching ``pattern`` (sorted), by index."""
        out: dict[int, list[str]] = {}
        for server in answering(self.servers):
            with self._client(server) as r:
                out[self.servers.index(server)] = sorted(r.keys(pattern))
        return out

    def begin_migration(self, slot: int, target: int) -> int:
        """Mark ``slot`` as migrating from its owner to node ``target`` (importing);
        returns the owner's index. Its keys stay where they are until :meth:`move_keys`:
        meanwhile the owner answers ``ASK`` for keys it no longer has."""
        source = self.owner(slot)
        if source == target:
            raise ValueError(f"node {target} owns slot {slot} already")
        with self._client(self.servers[target]) as r:
            r.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self._ids[source])
        with self._client(self.servers[source]) as r:
            r.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", self._ids[target])
        return source

    def move_keys(self, slot: int, source: int, target: int) -> int:
        """``MIGRATE`` every key of ``slot`` from node ``source`` to node ``target``;
        returns how many moved."""
        moved = 0
        dest = self.servers[target]
        with self._client(self.servers[source]) as r:
            while True:
                batch = r.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
                if not batch:
                    return moved
                r.execute_command(
                    "MIGRATE", HOST, dest.port, "", 0, int(_COMMAND_TIMEOUT * 1000), "KEYS", *batch
                )
                moved += len(batch)

    def finish_migration(self, slot: int, target: int) -> None:
        """Give ``slot`` to node ``target`` for good (``SETSLOT NODE`` on every running
        node, the target first), and wait until the nodes agree."""
        order = [target] + [i for i in range(self.size) if i != target]
        for server in answering(self.servers[i] for i in order):
            with self._client(server) as r:
                r.execute_command("CLUSTER", "SETSLOT", slot, "NODE", self._ids[target])
        self.wait_stable()

    def migrate_slot(self, slot: int, target: int) -> None:
        """Move ``slot`` and its keys to node ``target``, all at once."""
        source = self.begin_migration(slot, target)
        self.move_keys(slot, source, target)
        self.finish_migration(slot, target)
