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
from collections.abc import Callable, Collection, Coroutine, Sequence
from typing import Any

from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

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
from .._core.wire import round_pools
from .cluster import NodeClients
from .wire import wire_pool

if sys.version_info >= (3, 11):
    from asyncio import timeout_at
else:  # redis-py depends on async-timeout there
    from async_timeout import timeout_at

#: see the sync transport
_Pending = tuple[int, Any, Behind | None, float]


def _packing(conn: Any) -> tuple[object, Callable[[list[tuple[object, ...]]], list[bytes]]]:
    """How ``conn`` packs commands: what the bytes depend on (its class and encoding),
    and the packer (in C where it can be)."""
    enc = conn.encoder
    how = (type(conn), enc.encoding, enc.encoding_errors)
    return how, wire_packer(enc.encoding, enc.encoding_errors) or conn.pack_commands


def _packed(fan: FanoutRound, i: int, conn: Any) -> list[bytes]:
    """Master ``i``'s commands, packed once per round for every master with the same
    calls and the same connection class and encoding."""
    how, pack = _packing(conn)
    return fan.packed(i, how, pack)


async def _no_connection() -> Any:
    raise RuntimeError("a cluster member is reached through its nodes")


class _Read:
    """One round's reads under way: the task reading, and their deadline."""

    __slots__ = ("cancelling", "deadline", "expired", "task")

    def __init__(self, task: asyncio.Task[Any], deadline: float) -> None:
        self.task = task
        self.deadline = deadline
        # Cancellations asked for before the reads began (a release carried on after
        # one): not the timer's, and not undone by it.
        cancelling = getattr(task, "cancelling", None)  # Python 3.11+
        self.cancelling: int = cancelling() if cancelling is not None else 0
        #: the timer cancelled the task: the deadline passed
        self.expired = False


class _ReadTimer:
    """The master timeout of the rounds' reads, on one timer for all of them.

    A timer per round (``asyncio.timeout``) costs a large share of a round's time.
    Instead a round registers its deadline and the task reading; one timer, armed for
    the earliest deadline when none is armed, cancels the tasks whose deadline passed
    when it fires, and is armed again for the next deadline. Each read ends within a
    master timeout, so the timer fires about once per master timeout, not per round.
    A cancellation of its own becomes a time-out of the round, as ``asyncio.timeout``
    turns its own into ``TimeoutError`` (not when the task was cancelled otherwise too).
    """

    def __init__(self) -> None:
        self._reads: set[_Read] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: when the timer fires (inf: none armed)
        self._at = math.inf

    def start(self, loop: asyncio.AbstractEventLoop, deadline: float) -> _Read:
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("a round reads inside a task")
        read = _Read(task, deadline)
        self._reads.add(read)
        # A timer of another loop (an earlier asyncio.run) would never fire here.
        if deadline < self._at or loop is not self._loop:
            self._arm(loop, deadline)
        return read

    def stop(self, read: _Read) -> None:
        self._reads.discard(read)

    def expired(self, read: _Read) -> bool:
        """Whether the task's cancellation was the timer's alone (then taken back)."""
        if not read.expired:
            return False
        uncancel = getattr(read.task, "uncancel", None)  # Python 3.11+
        return uncancel is None or uncancel() <= read.cancelling

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._fire)
        self._loop = loop
        self._at = when

    def _fire(self) -> None:
        self._timer = None
        self._at = math.inf
        loop = self._loop
        assert loop is not None
        now = loop.time()
        nearest = math.inf
        for read in self._reads:
            if read.expired:
                continue
            if read.deadline <= now:
                read.expired = True
                read.task.cancel()
            elif read.deadline < nearest:
                nearest = read.deadline
        if nearest < math.inf:
            self._arm(loop, nearest)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._at = math.inf


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
        wired: Collection[int] = (),
    ) -> None:
        """``wired``: the members whose rounds may run on wire connections (see
        :mod:`.wire`) rather than on their clients' own: the clients made from URLs."""
        self.timeout = timeout
        self.probe_interval = probe_interval
        self._ends = Endpoints(members, probe_interval)
        self._nodes = nodes or NodeClients(members, timeout)
        #: per endpoint: its client (None for a cluster member's own number), name, the
        #: pool its connections come from and go back to, and that pool's getter
        self.clients, self._names, self._pools = round_pools(
            members, lambda i: self._ends.cluster(i) is None, wired, wire_pool
        )
        self._getters: list[Any] = [
            _no_connection if pool is None else connection_getter(pool) for pool in self._pools
        ]
        # An error reply, and a connect that timed out, as redis-py or valkey-py raise them.
        self._error_replies = with_valkey(ResponseError, "valkey.exceptions", "ResponseError")
        self._timeouts = with_valkey(RedisTimeoutError, "valkey.exceptions", "TimeoutError")
        self._masters = [MasterHealth(probe_interval) for _ in self.clients]
        self._probes: set[asyncio.Task[None]] = set()
        self._wire = WireCache()
        self._read_timer = _ReadTimer()
        self._closed = False

    def _grow(self, size: int) -> None:
        """Tables for the endpoints below ``size`` (nodes routed to for the first time)."""
        while len(self._masters) < size:
            i, node = self._ends.table[len(self._masters)]
            assert node is not None
            client = self._nodes.client(i, node)
            self.clients.append(client)
            self._names.append(f"{self._names[i]} node {node[0]}:{node[1]}")
            self._pools.append(client.connection_pool)
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
        except BaseException:  # cancelled: as in _send
            await self._drop(i, conn)
            raise
        return conn

    async def _give(self, i: int, conn: Any) -> None:
        if self._closed:
            await self._pools[i].release(conn)
        else:
            self._masters[i].idle.append(conn)

    async def _drop(self, i: int, conn: Any) -> None:
        # Back to the client's pool (see the sync transport): the next connection
        # comes through _new_connection, which loads the scripts.
        with contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)
        await self._pools[i].release(conn)

    def fanout(self, fanout: Fanout) -> Coroutine[Any, Any, list[list[Reply]]]:
        # Not a coroutine itself: the round's is awaited directly (one frame less).
        if not self._ends.clustered:
            lone = lone_calls(fanout.calls, self._masters)
            if lone is not None:
                return self._lone(fanout, lone)
            return self._round(fanout.calls, fanout.early, None, fanout.cleanup)
        return self._routed(fanout)

    async def _lone(self, fanout: Fanout, calls: Sequence[Call]) -> list[list[Reply]]:
        """The usual round on one master (see :func:`~redreentrant._core.fanout.lone_calls`
        and the sync transport), on an idle connection; a full round when NOSCRIPT
        says the call did not run."""
        m = self._masters[0]
        if not m.idle:  # none to take (the first round connects): a full round
            return await self._round(fanout.calls, fanout.early, None, fanout.cleanup)
        conn = m.idle.pop()
        how, pack = _packing(conn)
        wire = None if fanout.cleanup else self._wire
        loop = asyncio.get_running_loop()
        now = loop.time()
        error = await self._send(0, conn, pack_calls(calls, how, pack, wire))
        if error is not None:
            return [read_failed([], len(calls), error)]
        # Under the transport's one timer, as a full round's reads (see _ReadTimer).
        read = self._read_timer.start(loop, loop.time() + self.timeout)
        try:
            replies = await self._read(0, conn, None, len(calls), now, None)
        except asyncio.CancelledError:
            if not self._read_timer.expired(read):
                raise
            m.timed_out(loop.time())  # the read left the connection behind
            error = RedisTimeoutError(f"no reply within {self.timeout:.3f}s")
            replies = read_failed([], len(calls), error)
        finally:
            self._read_timer.stop(read)
        if is_noscript(replies[0]):
            return await self._round(fanout.calls, fanout.early, None, fanout.cleanup)
        return [replies]

    async def _routed(self, fanout: Fanout) -> list[list[Reply]]:
        """A round over members some of which are Redis Clusters (see the sync transport)."""
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
        fan = FanoutRound(calls, early, voters, None if cleanup else self._wire)
        loop = asyncio.get_running_loop()
        now = loop.time()
        # Connections whose replies this round still reads (or leaves behind).
        pending: list[_Pending] = []
        late: list[_Pending] = []
        try:
            unconnected: list[int] = []
            for i in fan.targets:
                m = self._masters[i]
                behind = await self._take_behind(i, now) if m.behind else None
                if behind is not None and m.lagging(behind, now, self.timeout):
                    # As the sync transport: clean-ups only, queued, not waited for.
                    send, close = m.queue_for_suspect(behind, fan.count(i), cleanup)
                    for b in close:
                        await self._drop(i, b.conn)
                    for b in send:
                        if await self._send(i, b.conn, _packed(fan, i, b.conn)) is None:
                            m.queued(b, fan.count(i), now)
                    self._suspect(fan, i, now)
                    continue
                if behind is not None:
                    error = await self._send(i, behind.conn, _packed(fan, i, behind.conn))
                    if error is None:
                        late.append((i, behind.conn, behind, now))
                    else:
                        fan.failed(i, error)
                    continue
                if m.suspect:
                    self._suspect(fan, i, now)
                    continue
                if m.idle:
                    conn = m.idle.pop()
                    error = await self._send(i, conn, _packed(fan, i, conn))
                    if error is None:
                        pending.append((i, conn, None, now))
                    else:
                        fan.failed(i, error)
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
            # One time-out for the whole read, not one per read, on the transport's one
            # timer (see _ReadTimer).
            reading = -1
            timed_out = False
            read = self._read_timer.start(loop, loop.time() + self.timeout)
            try:
                while pending:
                    i, conn, prior, at = pending.pop(0)
                    if fan.decided:
                        fan.unread(i)
                        self._left_behind(i, prior, conn, fan.count(i), at)
                        continue
                    reading = i
                    count = fan.count(i)
                    replies = await self._read(i, conn, prior, count, at, None, fan)
                    fan.answered(i, replies)
            except asyncio.CancelledError:
                if not self._read_timer.expired(read):
                    raise
                timed_out = True
            finally:
                self._read_timer.stop(read)
            if timed_out:
                if reading >= 0:
                    self._masters[reading].timed_out(loop.time())
                # The deadline passed while one master was read: what the others sent
                # meanwhile is read without waiting.
                while pending:
                    i, conn, prior, at = pending.pop(0)
                    if fan.decided:
                        fan.unread(i)
                        self._left_behind(i, prior, conn, fan.count(i), at)
                    else:
                        count = fan.count(i)
                        replies = await self._read(i, conn, prior, count, at, loop.time())
                        fan.answered(i, replies)
            if fan.noscript:
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
            for i, conn, prior, at in pending + late:
                self._left_behind(i, prior, conn, fan.count(i), at)
            raise
        return fan.results

    def _left_behind(self, i: int, prior: Behind | None, conn: Any, count: int, at: float) -> None:
        self._masters[i].behind.append(Behind.after(prior, conn, count, at))

    async def _take_behind(self, i: int, now: float) -> Behind | None:
        """As the sync transport's: a connection behind, caught up without waiting as
        far as the replies that came allow (when due); None when none is (still)
        behind."""
        m = self._masters[i]
        while m.behind:
            behind = m.behind.pop()
            if not m.catch_up_due(behind, now, self.timeout):
                return behind
            conn = behind.conn
            try:
                # One time-out for the replies read here, rather than one per reply (a
                # timer each): none is waited for, the first that has not come yet ends
                # the catch-up (a read cancelled before its reply came consumed nothing).
                with contextlib.suppress(asyncio.TimeoutError):
                    async with timeout_at(asyncio.get_running_loop().time()):
                        while behind.owed:
                            with contextlib.suppress(*self._error_replies):  # a reply too
                                await conn.read_response(
                                    timeout=math.inf, disconnect_on_error=False
                                )
                            behind.read()
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
            pending.append((i, conn, None, now))
        else:
            fan.failed(i, error)

    async def _send(self, i: int, conn: Any, packed: list[bytes]) -> Exception | None:
        """Send ``packed`` commands (pipelined); on failure the connection is dropped."""
        try:
            await conn.send_packed_command(packed, check_health=False)
        except Exception as error:
            await self._drop(i, conn)
            return error
        except BaseException:
            # Cancelled while the send waited (a full socket buffer): part of it may
            # have gone out. No round reads it now: back to the pool, or it is lost.
            await self._drop(i, conn)
            raise
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
        return await self._read(i, conn, None, len(commands), now, deadline)

    async def _read(
        self,
        i: int,
        conn: Any,
        prior: Behind | None,
        count: int,
        at: float,
        deadline: float | None,
        fan: FanoutRound | None = None,
    ) -> list[Reply]:
        """Read what ``prior`` owed (dropped), then ``count`` replies to calls sent
        ``at``, by ``deadline``
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
                    m.behind.append(Behind.after(prior, conn, count - len(out), at))
                    if fan is not None:
                        error = RedisTimeoutError(f"no reply within {self.timeout:.3f}s")
                        fan.answered(i, read_failed(out, count, error))
                    raise
                if reply is None:
                    # A time-out (see the module docstring): the replies are still owed.
                    m.timed_out(loop.time())
                    m.behind.append(Behind.after(prior, conn, count - len(out), at))
                    error = RedisTimeoutError(f"no reply within {self.timeout:.3f}s")
                    return read_failed(out, count, error)
            except self._error_replies as error:
                reply = error
            except Exception as error:  # broken: the stream is out of step
                await self._drop(i, conn)
                return read_failed(out, count, error)
            if prior is not None and prior.owed > 0:
                prior.read()  # an owed reply: dropped
            else:
                out.append(reply)
        m.answered()
        if self._closed:
            await self._give(i, conn)
        else:
            m.idle.append(conn)  # as _give does, without a coroutine per read
        return out

    async def close(self) -> None:
        """Hand the kept connections back to their pools."""
        self._closed = True
        self._read_timer.close()
        for task in list(self._probes):
            task.cancel()
        for i, m in enumerate(self._masters):
            if self.clients[i] is None:
                continue
            pool = self._pools[i]
            while m.idle:
                await pool.release(m.idle.pop())
            while m.behind:
                conn = m.behind.pop().conn
                with contextlib.suppress(Exception):
                    await conn.disconnect(nowait=True)
                await pool.release(conn)
