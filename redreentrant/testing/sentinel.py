"""A local Sentinel group for tests: :class:`LocalSentinelGroup`.

One master, ``replicas`` replicas and ``sentinels`` sentinels monitoring them as one
service, every one a :class:`~redreentrant.testing.LocalServer` of the same binary on
``127.0.0.1``, in a directory of its own under the group's temp dir (so the reaper stops
them after a hard kill, as it stops an ensemble's). A sentinel is ``redis-server
sentinel.conf --sentinel``; its config file is its own, and the sentinel rewrites it.
Each data server has a config file too (``redis.conf``, with the ``replicaof`` line of
a replica), which the sentinels rewrite when they reconfigure it, and which
:meth:`LocalSentinelGroup.wait_for_master` points at the new master for the servers that
are down: a server killed and started again (:meth:`LocalServer.start`) comes back as a
replica of the current master. (One started again before that comes back as an empty
master, which the sentinels turn into a replica some seconds later.)

The sentinels are told of each other and of the replicas in their config files, so the
group is ready for a failover as soon as it starts; with ``down_after`` and
``failover_timeout`` small (by default half a second and two seconds), a failover after
:meth:`LocalSentinelGroup.kill_master` takes a few seconds.
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import time
from collections.abc import Sequence
from typing import Any

import redis

from .ensemble import make_directory, remove_directory
from .loopback import HOST, client, free_ports
from .server import START_TIMEOUT, STOP_TIMEOUT, LocalServer, answering, start_all, stop_all

__all__ = ["LocalSentinelGroup"]

#: seconds for one command of the harness to a server or a sentinel
_COMMAND_TIMEOUT = 2.0
_POLL_INTERVAL = 0.02
_PORT_ATTEMPTS = 3
#: how long (seconds) a failover of the group may take in the harness's waits
FAILOVER_WAIT = 30.0


class LocalSentinelGroup:
    """A master, its replicas and the sentinels that watch them, on ``127.0.0.1``.

    :param replicas: number of replicas (1 or 2).
    :param sentinels: number of sentinels (at least ``quorum``).
    :param service: the name the sentinels know the master by.
    :param quorum: how many sentinels must agree that the master is down.
    :param down_after: seconds without an answer before a sentinel deems a server down
        (the sentinels' ``down-after-milliseconds``).
    :param failover_timeout: the sentinels' ``failover-timeout``, in seconds (a failover
        that failed is tried again after twice that).
    :param binary: ``redis-server`` to run; default :func:`find_redis_server`.
    :param base_dir: parent directory of the group's temp dir; default the system one.
    :param extra_args: extra ``redis-server`` arguments given to the master and the
        replicas (not to the sentinels).
    """

    def __init__(
        self,
        replicas: int = 2,
        sentinels: int = 3,
        *,
        service: str = "locks",
        quorum: int = 2,
        down_after: float = 0.5,
        failover_timeout: float = 2.0,
        binary: str | None = None,
        base_dir: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        if replicas not in (1, 2):
            raise ValueError(f"replicas must be 1 or 2, not {replicas!r}")
        if not 1 <= quorum <= sentinels:
            raise ValueError(f"quorum must be from 1 to sentinels ({sentinels}), not {quorum!r}")
        if not service or any(c.isspace() or c == "/" for c in service):
            raise ValueError(f"service must be a name without spaces or '/', not {service!r}")
        self.service = service
        self.quorum = quorum
        self.down_after = down_after
        self.failover_timeout = failover_timeout
        self._stopped = False
        resolved, self.directory = make_directory(self, self.stop, binary, base_dir)
        # Diskless full syncs without their default delay of 5 s: a replica is in sync
        # in milliseconds.
        args = ("--repl-diskless-sync-delay", "0", *extra_args)
        ports = iter(free_ports(1 + replicas + sentinels))
        #: the master and the replicas, the master first (it may change: see master())
        self.servers: list[LocalServer] = [
            self._server(resolved, f"redis{k}", next(ports), "redis.conf", args)
            for k in range(1 + replicas)
        ]
        #: the sentinels
        self.sentinels: list[LocalServer] = [
            self._server(resolved, f"sentinel{k}", next(ports), "sentinel.conf", ("--sentinel",))
            for k in range(sentinels)
        ]

    def _server(
        self, binary: str, name: str, port: int, config: str, args: Sequence[str]
    ) -> LocalServer:
        directory = os.path.join(self.directory, name)
        os.makedirs(directory)
        # A fixed port (never moved by a start): the config files name the others' ports.
        return LocalServer(
            binary=binary,
            directory=directory,
            port=port,
            extra_args=args,
            config_file=os.path.join(directory, config),
        )

    def _assign_ports(self) -> None:
        every = self.servers + self.sentinels
        for server, port in zip(every, free_ports(len(every)), strict=True):
            server.port = port

    # -- state ------------------------------------------------------------------------

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every sentinel."""
        return [(HOST, s.port) for s in self.sentinels]

    @property
    def url(self) -> str:
        """``redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,.../SERVICE/0``: the group as one
        quorum member."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinel_addresses)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def __repr__(self) -> str:
        ports = [s.port for s in self.servers]
        sentinels = [s.port for s in self.sentinels]
        return f"<LocalSentinelGroup {self.service!r} servers={ports} sentinels={sentinels}>"

    def master(self) -> LocalServer:
        """The server the sentinels name as the master now (what most of the sentinels
        that answer say, as clients ask them: ``SENTINEL MASTERS``; during a failover,
        still the master failed over, down or not).

        :raises RuntimeError: no sentinel answers, or they name no server of the group.
        """
        said: collections.Counter[int] = collections.Counter()
        for sentinel in answering(self.sentinels):
            with contextlib.suppress(redis.RedisError, OSError, KeyError, ValueError):
                said[self._view(sentinel)[0]] += 1
        for port, _ in said.most_common(1):
            for server in self.servers:
                if server.port == port:
                    return server
        raise RuntimeError(f"{self!r}: no sentinel names a master of the group ({dict(said)})")

    def replicas(self) -> list[LocalServer]:
        """The running servers other than the master."""
        master = self.master()
        return [s for s in self.servers if s is not master and s.running]

    # -- life cycle -------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> LocalSentinelGroup:
        """Start the master and the replicas, wait until the replicas are in sync, then
        start the sentinels and wait until each knows the others and the replicas.
        Returns ``self``."""
        if self._stopped:
            raise RuntimeError("this LocalSentinelGroup was stopped; create a new one")
        try:
            for attempt in range(_PORT_ATTEMPTS):
                try:
                    self._write_configs()
                    # The master first: a replica that finds no master tries again a
                    # second later.
                    self.servers[0].start(timeout)
                    start_all(self.servers[1:], timeout)
                    self.wait_replicas_in_sync(timeout, self.servers[0])
                    start_all(self.sentinels, timeout)
                    break
                except RuntimeError as error:
                    if "already in use" not in str(error) or attempt + 1 == _PORT_ATTEMPTS:
                        raise
                    self._stop_all(STOP_TIMEOUT)
                    self._assign_ports()  # another process took a port: all of them anew
            self._wait_watching(self.servers[0], timeout)
        except BaseException:
            self._stop_all(STOP_TIMEOUT)
            raise
        return self

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the sentinels, then the servers, and remove the temp dir. Idempotent."""
        self._stop_all(timeout)
        for server in self.sentinels + self.servers:
            server.close()
        self._stopped = True
        remove_directory(self, self.directory)

    def _stop_all(self, timeout: float) -> None:
        stop_all(self.sentinels, timeout)  # first: no failover while the servers stop
        stop_all(self.servers, timeout)

    def __enter__(self) -> LocalSentinelGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _write_configs(self) -> None:
        master = self.servers[0]
        for server in self.servers:
            with open(self._config(server), "w", encoding="utf-8") as conf:
                if server is not master:
                    conf.write(f"replicaof {HOST} {master.port}\n")
        ids = [secrets.token_hex(20) for _ in self.sentinels]
        name = self.service
        for sentinel, myid in zip(self.sentinels, ids, strict=True):
            lines = [
                f"sentinel myid {myid}",
                f"sentinel monitor {name} {HOST} {master.port} {self.quorum}",
                f"sentinel down-after-milliseconds {name} {round(self.down_after * 1000)}",
                f"sentinel failover-timeout {name} {round(self.failover_timeout * 1000)}",
                f"sentinel parallel-syncs {name} {len(self.servers)}",
            ]
            lines += [f"sentinel known-replica {name} {HOST} {s.port}" for s in self.servers[1:]]
            lines += [
                f"sentinel known-sentinel {name} {HOST} {other.port} {other_id}"
                for other, other_id in zip(self.sentinels, ids, strict=True)
                if other is not sentinel
            ]
            with open(self._config(sentinel), "w", encoding="utf-8") as conf:
                conf.write("\n".join(lines) + "\n")

    @staticmethod
    def _config(server: LocalServer) -> str:
        assert server.config_file is not None
        return server.config_file

    # -- failures and failovers -------------------------------------------------------

    def kill_master(self) -> LocalServer:
        """SIGKILL the current master; returns it (give it to :meth:`wait_for_master`)."""
        master = self.master()
        master.kill()
        return master

    def failover(self, timeout: float = FAILOVER_WAIT) -> LocalServer:
        """Have a sentinel fail the master over to a replica (``SENTINEL FAILOVER``);
        returns the master before it (give it to :meth:`wait_for_master`). Waits (up to
        ``timeout`` seconds) until a sentinel takes it: one refuses while it knows no
        replica fit to be promoted, or while a failover is under way."""
        master = self.master()
        deadline = time.monotonic() + timeout
        while True:
            errors = []
            for sentinel in answering(self.sentinels):
                try:
                    with self._client(sentinel) as r:
                        r.execute_command("SENTINEL", "FAILOVER", self.service)
                    return master
                except (redis.RedisError, OSError) as error:
                    errors.append(error)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self!r}: no sentinel started a failover: {errors}")
            time.sleep(_POLL_INTERVAL)

    def wait_for_master(
        self, not_this: LocalServer | None = None, timeout: float = FAILOVER_WAIT
    ) -> LocalServer:
        """Wait until every running sentinel names the same master, other than
        ``not_this``, deems it up with no failover under way, and that server says it
        is a master (``ROLE``); returns it. From then on, clients that ask the sentinels
        where the master is (redis-py's ``Sentinel``) are told this one.

        Servers of the group that are not running are then pointed at it in their
        config files: started again, they come back as its replicas.

        :raises RuntimeError: not so within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            master = self._agreed_master()
            if master is not None and master is not not_this and self._is_master(master):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self!r}: no new master within {timeout:g}s")
            time.sleep(_POLL_INTERVAL)
        for server in self.servers:
            if not server.running:
                self._point_at(server, master)
        return master

    def wait_replicas_in_sync(
        self, timeout: float = FAILOVER_WAIT, master: LocalServer | None = None
    ) -> None:
        """Wait until every running replica replicates the master (``master``, default
        the sentinels' :meth:`master`) with its link up and has everything the master
        had written when this began.

        :raises RuntimeError: not so within ``timeout`` seconds.
        """
        master = master or self.master()
        with self._client(master) as r:
            offset = int(r.info("replication")["master_repl_offset"])
        deadline = time.monotonic() + timeout
        waiting = [s for s in answering(self.servers) if s is not master]
        while waiting:
            waiting = [s for s in waiting if not self._in_sync(s, master, offset)]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self!r}: replicas {[s.port for s in waiting]} not in sync with"
                    f" {master.port} within {timeout:g}s"
                )
            time.sleep(_POLL_INTERVAL)

    # -- internals --------------------------------------------------------------------

    def _client(self, server: LocalServer) -> redis.Redis:
        return client(server.port, timeout=_COMMAND_TIMEOUT)

    def _view(self, sentinel: LocalServer) -> tuple[int, bool]:
        """The port of the master ``sentinel`` names (``SENTINEL MASTER``, which is what
        clients read: the address changes once a failover ended), and whether it deems
        that master up with no failover under way."""
        with self._client(sentinel) as r:
            state: Any = r.sentinel_master(self.service)
        settled = (
            state.get("is_master")
            and not state.get("is_sdown")
            and not state.get("is_odown")
            and "failover_in_progress" not in str(state.get("flags", ""))
        )
        return int(state["port"]), bool(settled)

    def _agreed_master(self) -> LocalServer | None:
        """The server every running sentinel names as a master that is up, if they
        agree."""
        ports = set()
        for sentinel in answering(self.sentinels):
            try:
                port, settled = self._view(sentinel)
            except (redis.RedisError, OSError, KeyError, ValueError):
                return None
            if not settled:
                return None
            ports.add(port)
        found = [s for s in self.servers if s.port in ports]
        return found[0] if len(ports) == 1 and found else None

    def _is_master(self, server: LocalServer) -> bool:
        if not server.running or server.paused:
            return False
        try:
            with self._client(server) as r:
                role: Any = r.execute_command("ROLE")
        except (redis.RedisError, OSError):
            return False
        return str(role[0]) == "master"

    def _in_sync(self, replica: LocalServer, master: LocalServer, offset: int) -> bool:
        try:
            with self._client(replica) as r:
                info = r.info("replication")
        except (redis.RedisError, OSError):
            return False
        return (
            info.get("role") == "slave"
            and int(info.get("master_port", -1)) == master.port
            and info.get("master_link_status") == "up"
            and int(info.get("slave_repl_offset", -1)) >= offset
        )

    def _wait_watching(self, master: LocalServer, timeout: float) -> None:
        """Wait until every sentinel watches ``master``, its replicas (in sync) and the
        other sentinels: then a failover may start."""
        deadline = time.monotonic() + timeout
        others = len(self.sentinels) - 1
        replicas = len(self.servers) - 1
        while True:
            ready = True
            for sentinel in self.sentinels:
                try:
                    with self._client(sentinel) as r:
                        state: Any = r.sentinel_master(self.service)
                        known: Any = r.sentinel_slaves(self.service)
                except (redis.RedisError, OSError):
                    ready = False
                    break
                good = [
                    k
                    for k in known
                    if k.get("is_slave")
                    and not k.get("is_sdown")
                    and not k.get("is_disconnected")
                    and k.get("master-link-status") == "ok"
                    and int(k.get("master-port", -1)) == master.port
                ]
                if (
                    int(state.get("port", -1)) != master.port
                    or int(state.get("num-other-sentinels", -1)) != others
                    or len(good) != replicas
                ):
                    ready = False
                    break
            if ready:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self!r}: the sentinels are not ready within {timeout:g}s")
            time.sleep(_POLL_INTERVAL)

    def _point_at(self, server: LocalServer, master: LocalServer) -> None:
        """Make ``server``'s config file say it replicates ``master``."""
        path = self._config(server)
        try:
            with open(path, encoding="utf-8") as conf:
                lines = conf.read().splitlines()
        except FileNotFoundError:
            lines = []
        kept = [
            line for line in lines if line.split(maxsplit=1)[:1] not in (["replicaof"], ["slaveof"])
        ]
        with open(path, "w", encoding="utf-8") as conf:
            conf.write("\n".join([*kept, f"replicaof {HOST} {master.port}"]) + "\n")
