"""Asyncio transport: carries out a :class:`~redreentrant._core.effects.Fanout` on
``redis.asyncio`` clients, following the same fan-out protocol as the sync transport
(:mod:`redreentrant._core.fanout`, which also says how a round stops once decided, and
what becomes of a master that stops answering).

All masters are written to first, then read, in the calling task: a round costs the
slowest master's round trip that it needs, and no task is made per master or per call.
Each master's connections are checked out of its client's pool once and kept. Masters
that need a new connection are connected all at once (a task per connect, only then),
so k unreachable masters cost one connect time-out, not k. Replies are read under one
deadline (the master timeout, from when the last request went out). ``redis.asyncio``
reports a read time-out by returning ``None`` and keeps the connection, which then stays
behind (no script of ours replies nil). Probes of suspect masters are tasks of their own.
A member that is a Redis Cluster is routed by the core, as in the sync transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
from collections.abc import Collection, Sequence
from typing import Any

from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core.cluster import Backoff, Endpoints, NodeCommands, NodeRound, route
from .._core.effects import Call, Early, Fanout, Reply
from .._core.fanout import (
    Behind,
    FanoutRound,
    MasterHealth,
    connection_getter,
    preload_commands,
    read_failed,
    suspect_error_text,
    wire_packer,
)
from .._core.masters import master_name, with_valkey
from .cluster import NodeClients

if sys.version_info >= (3, 11):
    from asyncio import timeout_at
else:  # redis-py depends on async-timeout there
    from async_timeout import timeout_at

#: see the sync transport
_Pending = tuple[int, Any, int, float]


def _packed(fan: FanoutRound, i: int, conn: Any) -> list[bytes]:
    """Master ``i``'s commands, packed once per round for every master with the same
    calls and the same connection class and encoding (in C where it can be)."""
    enc = conn.encoder
    how = (type(conn), enc.encoding, enc.encoding_errors)
    pack = wire_packer(enc.encoding, enc.encoding_errors) or conn.pack_commands
    return fan.packed(i, how, pack)


async def _no_connection() -> Any:
    raise RuntimeError("a cluster member is reached through its nodes")


class AsyncTransport:
    """Runs script calls on N members at once: ``redis.asyncio`` clients, or Redis
    Clusters whose nodes' clients come from ``nodes``; its tables are per endpoint (see
    the sync transport)."""

    def __init__(
        self,
        members: Sequence[Any],
        timeout: float,
        probe_interval: float = 1.0,
        nodes: NodeClients | None = None,
    ) -> None:
        self.timeout = timeout
        self.probe_interval = probe_interval
        self._ends = Endpoints(members, probe_interval)
        self._nodes = nodes or NodeClients(members, timeout)
        #: per endpoint: its client (None for a cluster member's own number), name, getter
        self.clients: list[Any] = []
        self._names: list[str] = []
        self._getters: list[Any] = []
        for i, member in enumerate(members):
            plain = self._ends.cluster(i) is None
            self.clients.append(member if plain else None)
            self._names.append(master_name(member))
            self._getters.append(
                connection_getter(member.connection_pool) if plain else _no_connection
            )
        # An error reply, and a connect that timed out, as redis-py or valkey-py raise them.
        self._error_replies = with_valkey(ResponseError, "valkey.exceptions", "ResponseError")
        self._timeouts = with_valkey(RedisTimeoutError, "valkey.exceptions", "TimeoutError")
        self._masters = [MasterHealth(probe_interval) for _ in self.clients]
        self._probes: set[asyncio.Task[None]] = set()
        self._closed = False

    def _grow(self, size: int) -> None:
        """Tables for the endpoints below ``size`` (nodes routed to for the first time)."""
        while len(self._masters) < size:
            i, node = self._ends.table[len(self._masters)]
            assert node is not None
            client = self._nodes.client(i, node)
            self.clients.append(client)
            self._names.append(f"{self._names[i]} node {node[0]}:{node[1]}")
            self._getters.append(connection_getter(client.connection_pool))
            self._masters.append(MasterHealth(self.probe_interval))

    async def _new_connection(self, i: int) -> Any:
        try:
            conn = await self._getters[i]()
        except Exception as error:
            return error
        commands = preload_commands()
        owed = len(commands)
        loop = asyncio.get_running_loop()
        since = loop.time()
        try:
            await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            async with timeout_at(since + self.timeout):
                while owed:
                    await conn.read_response(timeout=math.inf, disconnect_on_error=False)
                    owed -= 1
        except asyncio.TimeoutError:
            # Kept as behind: once its replies come in, the master rejoins.
            self._masters[i].behind.append(Behind(conn, owed, since))
            return RedisTimeoutError(f"{self._names[i]}: no answer to SCRIPT LOAD")
        except Exception as error:
            await self._drop(i, conn)
            return error
        return conn

    async def _give(self, i: int, conn: Any) -> None:
        if self._closed:
            await self.clients[i].connection_pool.release(conn)
        else:
            self._masters[i].idle.append(conn)

    async def _drop(self, i: int, conn: Any) -> None:
        # Back to the client's pool (see the sync transport): the next connection
        # comes through _new_connection, which loads the scripts.
        with contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)
        await self.clients[i].connection_pool.release(conn)

    async def fanout(self, fanout: Fanout) -> list[list[Reply]]:
        if not self._ends.clustered:
            return await self._round(fanout.calls, fanout.early, None, fanout.cleanup)
        loop = asyncio.get_running_loop()
        steps = route(fanout, self._ends, loop.time, self.timeout)
        result: object = None
        try:
            while True:
                effect = steps.send(result)
                if isinstance(effect, NodeRound):
                    self._grow(len(effect.calls))
                    result = await self._round(
                        effect.calls, effect.early, effect.voters, effect.cleanup
                    )
                elif isinstance(effect, NodeCommands):
                    self._grow(effect.endpoint + 1)
                    deadline = loop.time() + self.timeout
                    result = await self._run(effect.endpoint, list(effect.commands), deadline)
                elif isinstance(effect, Backoff):
                    await asyncio.sleep(effect.seconds)
                    result = None
        except StopIteration as stop:
            replies: list[list[Reply]] = stop.value
            return replies

    async def _round(
        self,
        calls: Sequence[Sequence[Call]],
        early: Early | None,
        voters: Collection[int] | None,
        cleanup: bool,
    ) -> list[list[Reply]]:
        """One round over endpoints: ``calls[i]`` to endpoint ``i``."""
        fan = FanoutRound(calls, early, voters)
        loop = asyncio.get_running_loop()
        now = loop.time()
        # Connections whose replies this round still reads (or leaves behind).
        pending: list[_Pending] = []
        late: list[_Pending] = []
        try:
            unconnected: list[int] = []
            for i in fan.targets:
                m = self._masters[i]
                behind = await self._take_behind(i)
                if behind is not None and m.lagging(behind, now, self.timeout):
                    # As the sync transport: clean-ups only, queued, not waited for.
                    send, close = m.queue_for_suspect(behind, fan.count(i), cleanup)
                    for b in close:
                        await self._drop(i, b.conn)
                    for b in send:
                        if await self._send(i, b.conn, _packed(fan, i, b.conn)) is None:
                            m.queued(b, fan.count(i))
                    self._suspect(fan, i, now)
                    continue
                if behind is not None:
                    error = await self._send(i, behind.conn, _packed(fan, i, behind.conn))
                    if error is None:
                        late.append((i, behind.conn, behind.owed, behind.since))
                    else:
                        fan.failed(i, error)
                    continue
                if m.suspect:
                    self._suspect(fan, i, now)
                    continue
                if m.idle:
                    await self._start(fan, i, m.idle.pop(), pending, now)
                else:
                    unconnected.append(i)
            if unconnected:
                conns = await asyncio.gather(*(self._new_connection(i) for i in unconnected))
                for i, conn in zip(unconnected, conns, strict=True):
                    if isinstance(conn, Exception):
                        if isinstance(conn, self._timeouts):
                            self._masters[i].timed_out(now)
                        fan.failed(i, conn)
                    else:
                        await self._start(fan, i, conn, pending, loop.time())
            pending += late
            late = []
            # One time-out for the whole read, not one per read (each costs a timer).
            deadline = loop.time() + self.timeout
            reading = -1
            try:
                async with timeout_at(deadline):
                    while pending:
                        i, conn, skip, since = pending.pop(0)
                        if fan.decided:
                            fan.unread(i)
                            self._masters[i].behind.append(Behind(conn, skip + fan.count(i), since))
                            continue
                        reading = i
                        count = fan.count(i)
                        replies = await self._read(i, conn, skip, count, since, None, fan)
                        fan.answered(i, replies)
            except asyncio.TimeoutError:
                if reading >= 0:
                    self._masters[reading].timed_out(loop.time())
                # The deadline passed while one master was read: what the others sent
                # meanwhile is read without waiting.
                while pending:
                    i, conn, skip, since = pending.pop(0)
                    if fan.decided:
                        fan.unread(i)
                        self._masters[i].behind.append(Behind(conn, skip + fan.count(i), since))
                    else:
                        count = fan.count(i)
                        replies = await self._read(i, conn, skip, count, since, loop.time())
                        fan.answered(i, replies)
            # A redo is a round trip of its own, with a time-out of its own.
            redo_deadline = loop.time() + self.timeout
            for i in fan.targets:
                redo = fan.reload(i)
                if redo is not None:
                    fan.reloaded(i, await self._run(i, redo, redo_deadline))
        except BaseException:
            # Cancelled mid-round: the replies still due on these connections are read
            # later (they stay behind), so what follows, an undo, reaches each master
            # after this round's calls, on the same connection.
            for i, conn, skip, since in pending + late:
                self._masters[i].behind.append(Behind(conn, skip + fan.count(i), since))
            raise
        return fan.results

    async def _take_behind(self, i: int) -> Behind | None:
        """As the sync transport's: a connection behind, caught up without waiting as
        far as the replies that came allow; None when none is (still) behind."""
        m = self._masters[i]
        while m.behind:
            behind = m.behind.pop()
            conn = behind.conn
            try:
                while behind.owed:
                    try:
                        reply = await conn.read_response(timeout=0, disconnect_on_error=False)
                        if reply is None:
                            break  # nothing more has come
                    except self._error_replies:
                        pass  # an error reply is a reply
                    behind.owed -= 1
            except Exception:
                await self._drop(i, conn)
                continue
            if behind.owed:
                return behind
            m.answered()
            await self._give(i, conn)
        return None

    def _suspect(self, fan: FanoutRound, i: int, now: float) -> None:
        m = self._masters[i]
        since = m.suspect_since if m.suspect_since is not None else now
        fan.failed(i, RedisTimeoutError(suspect_error_text(self._names[i], since, now)))
        if m.start_probe(now) and not self._closed:
            task = asyncio.ensure_future(self._probe(i))
            self._probes.add(task)
            task.add_done_callback(self._probes.discard)

    async def _probe(self, i: int) -> None:
        """PING master ``i`` on a fresh connection: when it answers in time, it rejoins
        at once."""
        m = self._masters[i]
        conn = await self._new_connection(i)
        answered = False
        if not isinstance(conn, Exception):
            try:
                await conn.send_command("PING", check_health=False)
                answered = bool(await conn.read_response(timeout=self.timeout))
            except Exception:
                answered = False
            if answered:
                await self._give(i, conn)
            else:
                await self._drop(i, conn)
        for behind in m.probed(answered):
            await self._drop(i, behind.conn)

    async def _start(
        self, fan: FanoutRound, i: int, conn: Any, pending: list[_Pending], now: float
    ) -> None:
        error = await self._send(i, conn, _packed(fan, i, conn))
        if error is None:
            pending.append((i, conn, 0, now))
        else:
            fan.failed(i, error)

    async def _send(self, i: int, conn: Any, packed: list[bytes]) -> Exception | None:
        """Send ``packed`` commands (pipelined); on failure the connection is dropped."""
        try:
            await conn.send_packed_command(packed, check_health=False)
        except Exception as error:
            await self._drop(i, conn)
            return error
        return None

    async def _run(
        self, i: int, commands: list[tuple[object, ...]], deadline: float
    ) -> list[Reply]:
        """Send ``commands`` to master ``i`` and read their replies (the NOSCRIPT redo)."""
        m = self._masters[i]
        conn = m.idle.pop() if m.idle else await self._new_connection(i)
        if isinstance(conn, Exception):
            return read_failed([], len(commands), conn)
        error = await self._send(i, conn, conn.pack_commands(commands))
        if error is not None:
            return read_failed([], len(commands), error)
        now = asyncio.get_running_loop().time()
        return await self._read(i, conn, 0, len(commands), now, deadline)

    async def _read(
        self,
        i: int,
        conn: Any,
        skip: int,
        count: int,
        since: float,
        deadline: float | None,
        fan: FanoutRound | None = None,
    ) -> list[Reply]:
        """Read ``skip`` owed replies (dropped), then ``count`` replies, by ``deadline``
        (None: under the caller's time-out, which cancels the read; what was read by
        then is recorded in ``fan``).

        The connection is then idle again, or behind (late), or dropped (broken)."""
        out: list[Reply] = []
        m = self._masters[i]
        loop = asyncio.get_running_loop()
        while len(out) < count:
            try:
                # ``math.inf``: no time-out of redis-py's own for this read.
                left = math.inf if deadline is None else max(deadline - loop.time(), 0.0)
                try:
                    reply = await conn.read_response(timeout=left, disconnect_on_error=False)
                except asyncio.CancelledError:
                    # A cancelled read consumed nothing: the replies are still owed.
                    m.behind.append(Behind(conn, skip + count - len(out), since))
                    if fan is not None:
                        error = RedisTimeoutError(f"no reply within {self.timeout:.3f}s")
                        fan.answered(i, read_failed(out, count, error))
                    raise
                if reply is None:
                    # A time-out (see the module docstring): the replies are still owed.
                    m.timed_out(loop.time())
                    m.behind.append(Behind(conn, skip + count - len(out), since))
                    error = RedisTimeoutError(f"no reply within {self.timeout:.3f}s")
                    return read_failed(out, count, error)
            except self._error_replies as error:
                reply = error
            except Exception as error:  # broken: the stream is out of step
                await self._drop(i, conn)
                return read_failed(out, count, error)
            if skip:
                skip -= 1
            else:
                out.append(reply)
        m.answered()
        await self._give(i, conn)
        return out

    async def close(self) -> None:
        """Hand the kept connections back to their pools."""
        self._closed = True
        for task in list(self._probes):
            task.cancel()
        for i, m in enumerate(self._masters):
            if self.clients[i] is None:
                continue
            pool = self.clients[i].connection_pool
            while m.idle:
                await pool.release(m.idle.pop())
            while m.behind:
                conn = m.behind.pop().conn
                with contextlib.suppress(Exception):
                    await conn.disconnect(nowait=True)
                await pool.release(conn)
