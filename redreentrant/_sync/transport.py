"""Sync transport: carries out a :class:`~redreentrant._core.effects.Fanout` on redis-py
clients, following the fan-out protocol of :mod:`redreentrant._core.fanout` (which also
says how a round stops once decided, and what becomes of a master that stops
answering).

All masters are written to first, then read, so one round costs the slowest master's
round trip that it needs rather than the sum. Each master's connections are checked out
of its client's pool once and then kept (no thread, pool or connection is made per
call). Masters with a kept connection are sent to first; masters that need a new
connection are connected all at once (a few connector threads, made once per transport
and used only then, and for probes of suspect masters), so k unreachable masters cost
one connect time-out, not k. Replies are read under one deadline (the master timeout,
from when the last request went out).

A read never times out inside redis-py (which would close the connection): the
transport polls with ``can_read`` and reads only what has come, so a connection whose
replies are late stays open and behind.

A member that is a Redis Cluster is routed by the core
(:func:`redreentrant._core.cluster.route`): its calls go to the nodes owning their
slots, each node an *endpoint* with connections and health of its own, in the same
round as the plain masters.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
from redis.exceptions import ResponseError

from .._core.cluster import Backoff, Endpoints, NodeCommands, NodeRound, route
from .._core.effects import Call, Early, Fanout, Reply
from .._core.fanout import (
    Behind,
    FanoutRound,
    MasterHealth,
    WireCache,
    connection_getter,
    is_noscript,
    lone_calls,
    pack_calls,
    preload_commands,
    read_failed,
    suspect_error_text,
    wire_packer,
)
from .._core.masters import with_valkey
from .._core.owner import process_id
from .._core.wire import round_pools
from .cluster import NodeClients
from .wire import wire_pool

#: how far past the round's deadline (a share of the master timeout) a read may wait
#: when it waits on the socket's own time-out
SLACK = 0.1

#: a connection a round reads: (master, connection, what it owed before the round's
#: calls (None: nothing), when the round's calls went out on it)
_Pending = tuple[int, Any, Behind | None, float]


def _pack(conn: Any, commands: list[tuple[object, ...]]) -> list[bytes]:
    if len(commands) == 1:
        return conn.pack_command(*commands[0])  # type: ignore[no-any-return]
    return conn.pack_commands(commands)  # type: ignore[no-any-return]


def _packing(conn: Any) -> tuple[object, Callable[[list[tuple[object, ...]]], list[bytes]]]:
    """How ``conn`` packs commands: what the bytes depend on (its class and encoding),
    and the packer (hiredis directly where it can be: redis-py's own wrapper around it
    costs more than the packing)."""
    enc = conn.encoder
    how = (type(conn), enc.encoding, enc.encoding_errors)
    pack = wire_packer(enc.encoding, enc.encoding_errors)
    return how, pack or (lambda commands: _pack(conn, commands))


def _packed(fan: FanoutRound, i: int, conn: Any) -> list[bytes]:
    """Master ``i``'s commands, packed once per round for every master with the same
    calls and the same connection class and encoding."""
    how, pack = _packing(conn)
    return fan.packed(i, how, pack)


def _no_connection() -> Any:
    raise RuntimeError("a cluster member is reached through its nodes")


class SyncTransport:
    """Runs script calls on N members at once: redis-py clients, or Redis Clusters
    (:class:`~redreentrant._core.cluster.ClusterMember`) whose nodes' clients come from
    ``nodes``.

    Its tables are per endpoint (see :class:`~redreentrant._core.cluster.Endpoints`):
    endpoint ``i`` is plain master ``i``; the nodes of cluster members are added as
    they are first routed to."""

    def __init__(
        self,
        members: Sequence[Any],
        timeout: float,
        probe_interval: float = 1.0,
        nodes: NodeClients | None = None,
        wired: Collection[int] = (),
    ) -> None:
        """``wired``: the members whose rounds may run on wire connections (see
        :mod:`.wire`) rather than on their clients' own: the clients made from URLs."""
        self.timeout = timeout
        self.probe_interval = probe_interval
        self._ends = Endpoints(members, probe_interval, threading.Lock)
        self._nodes = nodes or NodeClients(members, timeout)
        self._grow_lock = threading.Lock()
        #: per endpoint: its client (None for a cluster member's own number), name, the
        #: pool its connections come from and go back to, and that pool's getter
        self.clients, self._names, self._pools = round_pools(
            members, lambda i: self._ends.cluster(i) is None, wired, wire_pool
        )
        self._getters: list[Any] = [
            _no_connection if pool is None else connection_getter(pool) for pool in self._pools
        ]
        # An error reply, and a read that timed out, as redis-py or valkey-py raise them.
        self._error_replies = with_valkey(ResponseError, "valkey.exceptions", "ResponseError")
        self._timeouts = with_valkey(redis.TimeoutError, "valkey.exceptions", "TimeoutError")
        self._wire = WireCache()
        self._reset()

    def _reset(self) -> None:
        self._pid = process_id()
        self._masters = [MasterHealth(self.probe_interval) for _ in self.clients]
        self._connector: ThreadPoolExecutor | None = None
        self._closed = False

    def _grow(self, size: int) -> None:
        """Tables for the endpoints below ``size`` (nodes routed to for the first time)."""
        if size <= len(self._masters):
            return
        with self._grow_lock:
            while len(self._masters) < size:
                i, node = self._ends.table[len(self._masters)]
                assert node is not None
                client = self._nodes.client(i, node)
                self.clients.append(client)
                self._names.append(f"{self._names[i]} node {node[0]}:{node[1]}")
                self._pools.append(client.connection_pool)
                self._getters.append(connection_getter(client.connection_pool))
                # Last: the endpoint is in use once its health is there.
                self._masters.append(MasterHealth(self.probe_interval))

    def _pool(self) -> ThreadPoolExecutor:
        if self._connector is None:
            self._connector = ThreadPoolExecutor(
                max_workers=2 * len(self.clients), thread_name_prefix="redreentrant-connect"
            )
        return self._connector

    def _connect(self, masters: list[int]) -> list[Any]:
        """New connections to ``masters``, all at once; an exception for each failure."""
        if len(masters) == 1:
            return [self._new_connection(masters[0])]
        return list(self._pool().map(self._new_connection, masters))

    def _new_connection(self, i: int) -> Any:
        try:
            conn = self._getters[i]()
        except Exception as error:
            return error
        commands = preload_commands()
        owed = len(commands)
        try:
            since = time.monotonic()
            conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            while owed:
                if not conn.can_read(timeout=self.timeout):
                    # Kept as behind: once its replies come in, the master rejoins.
                    self._masters[i].behind.append(Behind(conn, owed, since))
                    return redis.TimeoutError(f"{self._names[i]}: no answer to SCRIPT LOAD")
                conn.read_response()
                owed -= 1
        except Exception as error:
            self._drop(i, conn)
            return error
        return conn

    def _give(self, i: int, conn: Any) -> None:
        if self._closed:
            self._pools[i].release(conn)
        else:
            self._masters[i].idle.append(conn)

    def _drop(self, i: int, conn: Any) -> None:
        # Back to the client's pool, not to the idle list: the next connection then
        # comes through _new_connection, which loads the scripts (the master may have
        # restarted without them).
        conn.disconnect()
        self._pools[i].release(conn)

    def fanout(self, fanout: Fanout) -> list[list[Reply]]:
        if self._pid != process_id():
            self._reset()  # a forked child must not share the parent's sockets
        if not self._ends.clustered:
            lone = lone_calls(fanout.calls, self._masters)
            if lone is not None:
                answer = self._lone(lone, fanout.cleanup)
                if answer is not None:
                    return [answer]
            return self._round(fanout.calls, fanout.early, None, fanout.cleanup)
        steps = route(fanout, self._ends, time.monotonic, self.timeout)
        result: object = None
        try:
            while True:
                effect = steps.send(result)
                if isinstance(effect, NodeRound):
                    self._grow(len(effect.calls))
                    result = self._round(effect.calls, effect.early, effect.voters, effect.cleanup)
                elif isinstance(effect, NodeCommands):
                    self._grow(effect.endpoint + 1)
                    deadline = time.monotonic() + self.timeout
                    result = self._run(effect.endpoint, list(effect.commands), deadline)
                elif isinstance(effect, Backoff):
                    time.sleep(effect.seconds)
                    result = None
        except StopIteration as stop:
            replies: list[list[Reply]] = stop.value
            return replies

    def _lone(self, calls: Sequence[Call], cleanup: bool) -> list[Reply] | None:
        """The usual round on one master (see :func:`~redreentrant._core.fanout.lone_calls`),
        on an idle connection: its replies, or None when it must be a full round after
        all (no idle connection; NOSCRIPT: the call did not run)."""
        try:
            conn = self._masters[0].idle.pop()  # list.pop is atomic: safe across threads
        except IndexError:
            return None
        how, pack = _packing(conn)
        now = time.monotonic()
        error = self._send(0, conn, pack_calls(calls, how, pack, None if cleanup else self._wire))
        if error is not None:
            return read_failed([], len(calls), error)
        replies = self._read(0, conn, None, len(calls), now, time.monotonic() + self.timeout)
        if is_noscript(replies[0]):
            return None
        return replies

    def _round(
        self,
        calls: Sequence[Sequence[Call]],
        early: Early | None,
        voters: Collection[int] | None,
        cleanup: bool,
    ) -> list[list[Reply]]:
        """One round over endpoints: ``calls[i]`` to endpoint ``i``."""
        fan = FanoutRound(calls, early, voters, None if cleanup else self._wire)
        now = time.monotonic()
        sent: list[_Pending] = []
        late: list[_Pending] = []
        unconnected: list[int] = []
        for i in fan.targets:
            m = self._masters[i]
            behind = self._take_behind(i, now) if m.behind else None
            if behind is not None and m.lagging(behind, now, self.timeout):
                # Clean-ups are queued behind the owed replies (they reach the master
                # in order), not waited for; nothing else is sent to a suspect.
                send, close = m.queue_for_suspect(behind, fan.count(i), cleanup)
                for b in close:
                    self._drop(i, b.conn)
                for b in send:
                    if self._send(i, b.conn, _packed(fan, i, b.conn)) is None:
                        m.queued(b, fan.count(i), now)
                self._suspect(fan, i, now)
                continue
            if behind is not None:
                error = self._send(i, behind.conn, _packed(fan, i, behind.conn))
                if error is None:
                    late.append((i, behind.conn, behind, now))
                else:
                    fan.failed(i, error)
                continue
            if m.suspect_since is not None:
                self._suspect(fan, i, now)
                continue
            try:
                conn = m.idle.pop()  # list.pop is atomic: safe across threads
            except IndexError:
                unconnected.append(i)
                continue
            error = self._send(i, conn, _packed(fan, i, conn))
            if error is None:
                sent.append((i, conn, None, now))
            else:
                fan.failed(i, error)
        if unconnected:
            for i, conn in zip(unconnected, self._connect(unconnected), strict=True):
                if isinstance(conn, self._timeouts):
                    self._masters[i].timed_out(now)
                error = (
                    conn
                    if isinstance(conn, Exception)
                    else self._send(i, conn, _packed(fan, i, conn))
                )
                if error is None:
                    sent.append((i, conn, None, time.monotonic()))
                else:
                    fan.failed(i, error)
        # The master timeout runs from when the last request went out, so a slow connect
        # to one master does not eat the others' time.
        deadline = time.monotonic() + self.timeout
        if late:
            sent += late
        for i, conn, prior, at in sent:
            count = len(fan.calls[i])
            if fan.decided:
                fan.unread(i)
                self._masters[i].behind.append(Behind.after(prior, conn, count, at))
                continue
            fan.answered(i, self._read(i, conn, prior, count, at, deadline))
        if fan.noscript:
            # A redo is a round trip of its own, with a time-out of its own.
            redo_deadline = time.monotonic() + self.timeout
            for i in fan.targets:
                redo = fan.reload(i)
                if redo is not None:
                    fan.reloaded(i, self._run(i, redo, redo_deadline))
        return fan.results

    def _take_behind(self, i: int, now: float) -> Behind | None:
        """One of master ``i``'s connections that are behind, caught up as far as the
        replies that have come allow (without waiting, and only when due: see
        :meth:`MasterHealth.catch_up_due`); None when there is none, or it caught up
        (its connection is then idle again) or broke."""
        m = self._masters[i]
        if not m.behind:
            return None  # the usual case, checked cheaply
        try:
            behind = m.behind.pop()
        except IndexError:
            return None
        if not m.catch_up_due(behind, now, self.timeout):
            return behind
        conn = behind.conn
        try:
            while behind.owed and conn.can_read(timeout=0):
                with contextlib.suppress(*self._error_replies):  # an error reply is a reply
                    conn.read_response()
                behind.read()
        except Exception:
            self._drop(i, conn)
            return None
        if behind.owed:
            return behind
        m.answered()
        self._give(i, conn)
        return self._take_behind(i, now)

    def _suspect(self, fan: FanoutRound, i: int, now: float) -> None:
        m = self._masters[i]
        since = m.suspect_since if m.suspect_since is not None else now
        fan.failed(i, redis.TimeoutError(suspect_error_text(self._names[i], since, now)))
        if m.start_probe(now) and not self._closed:
            self._pool().submit(self._probe, i)

    def _probe(self, i: int) -> None:
        """PING master ``i`` on a fresh connection (a connector thread): when it answers
        in time, it rejoins at once."""
        m = self._masters[i]
        conn = self._new_connection(i)
        answered = False
        if not isinstance(conn, Exception):
            try:
                conn.send_command("PING", check_health=False)
                answered = conn.can_read(timeout=self.timeout) and bool(conn.read_response())
            except Exception:
                answered = False
            if answered:
                self._give(i, conn)
            else:
                self._drop(i, conn)
        for behind in m.probed(answered):
            self._drop(i, behind.conn)

    def _send(self, i: int, conn: Any, packed: list[bytes]) -> Exception | None:
        """Send ``packed`` commands (pipelined); on failure the connection is dropped."""
        try:
            conn.send_packed_command(packed, check_health=False)
        except Exception as error:
            self._drop(i, conn)
            return error
        except BaseException:
            # Interrupted mid-send (KeyboardInterrupt): the stream is out of step, and
            # no round reads it: back to the pool, or it is lost.
            self._drop(i, conn)
            raise
        return None

    def _run(self, i: int, commands: list[tuple[object, ...]], deadline: float) -> list[Reply]:
        """Send ``commands`` to master ``i`` and read their replies (the NOSCRIPT redo)."""
        try:
            conn = self._masters[i].idle.pop()
        except IndexError:
            conn = self._new_connection(i)
        if isinstance(conn, Exception):
            return read_failed([], len(commands), conn)
        error = self._send(i, conn, _pack(conn, commands))
        if error is not None:
            return read_failed([], len(commands), error)
        return self._read(i, conn, None, len(commands), time.monotonic(), deadline)

    def _read(
        self, i: int, conn: Any, prior: Behind | None, count: int, at: float, deadline: float
    ) -> list[Reply]:
        """Read what ``prior`` owed (dropped), then ``count`` replies to calls sent
        ``at``, by ``deadline``.

        The connection is then idle again, or behind (late), or dropped (broken)."""
        out: list[Reply] = []
        m = self._masters[i]
        # The socket's own time-out serves as the deadline when it ends about then (the
        # connections made from URLs have the master timeout): one blocking read, with
        # no poll before it. Else, or late in the round, a poll bounded by the deadline.
        own = conn.socket_timeout
        slack = SLACK * self.timeout
        while len(out) < count:
            try:
                left = deadline - time.monotonic()
                if own is not None and own <= left + slack:
                    reply: Reply = conn.read_response(disconnect_on_error=False)
                elif conn.can_read(timeout=max(0.0, left)):
                    reply = conn.read_response()
                else:
                    raise redis.TimeoutError(f"no reply within {self.timeout:.3f}s")
            except self._error_replies as error:
                reply = error
            except self._timeouts as error:
                # Late, not broken: the connection stays, behind (its replies are
                # still owed).
                m.timed_out(time.monotonic())
                m.behind.append(Behind.after(prior, conn, count - len(out), at))
                return read_failed(out, count, error)
            except Exception as error:
                # The stream is out of step now: drop the connection, fail the rest.
                self._drop(i, conn)
                return read_failed(out, count, error)
            if prior is not None and prior.owed > 0:
                prior.read()  # an owed reply: dropped
            else:
                out.append(reply)
        m.answered()
        self._give(i, conn)
        return out

    def close(self) -> None:
        """Hand the kept connections back to their pools."""
        self._closed = True
        if self._pid != process_id():
            return
        if self._connector is not None:
            self._connector.shutdown(wait=False)
        for i, m in enumerate(self._masters):
            if self.clients[i] is None:
                continue
            pool = self._pools[i]
            while m.idle:
                pool.release(m.idle.pop())
            while m.behind:
                conn = m.behind.pop().conn
                conn.disconnect()
                pool.release(conn)
