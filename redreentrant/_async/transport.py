"""Asyncio transport: carries out the steps of the fan-out rounds
(:class:`~redreentrant._core.fanout.FanoutProtocol`, which decides everything else) on
``redis.asyncio`` clients: it connects, sends, reads until a deadline and closes.

A round runs in the calling task: no task is made per master or per call. Each
master's connections are checked out of its client's pool once and kept. New
connections to several masters are made at once (a task per connect, only then), and
probes of suspect masters are tasks of their own. The reads of a round are bounded by
one timer for all the rounds under way (:class:`_ReadTimer`); ``redis.asyncio``
reports a read's own time-out by returning ``None`` and keeps the connection (no
script of ours replies nil).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core import fanout as io
from .._core.effects import Fanout, Reply
from .._core.sentinel import demoted
from .._core.transport import FanoutTransport, send_failed
from .cluster import NodeClients
from .wire import wire_pool

if sys.version_info >= (3, 11):
    from asyncio import timeout_at
else:  # redis-py depends on async-timeout there
    from async_timeout import timeout_at

T = TypeVar("T")


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

    def stop(self, read: _Read | None) -> None:
        if read is not None:
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


class AsyncTransport(FanoutTransport):
    """Runs script calls on N members at once (see
    :class:`~redreentrant._core.transport.FanoutTransport`): ``redis.asyncio``
    clients, or Redis Clusters."""

    node_clients = NodeClients
    wire_pool = staticmethod(wire_pool)
    timeout_error = RedisTimeoutError
    reply_error = ResponseError

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timer = _ReadTimer()
        self._probes: set[asyncio.Task[Any]] = set()

    def fanout(self, fanout: Fanout) -> Coroutine[Any, Any, list[list[Reply]]]:
        # Not a coroutine itself: the carrying one is awaited directly (one frame less).
        loop = asyncio.get_running_loop()
        lone = self.protocol.lone(fanout, loop.time)
        if lone is not None:
            return self._lone(fanout, lone, loop)
        return self._carry(self.protocol.steps(fanout, loop.time), loop)

    async def _lone(
        self, fanout: Fanout, lone: tuple[Any, Any, float], loop: asyncio.AbstractEventLoop
    ) -> list[list[Reply]]:
        """The usual round on one master (see :meth:`FanoutProtocol.lone`), its read
        under the transport's timer."""
        conn = lone[0]
        got = None
        sent = await self._send([(0, conn, lone[1])])
        if not sent:
            timed = self._read_timer.start(loop, loop.time() + self.timeout)
            try:
                got = await self._read(0, conn, 1, timed)
            finally:
                self._read_timer.stop(timed)
                if self.protocol.closed:
                    await self._release()
        answer = self.protocol.lone_answer(lone, sent, got, loop.time)
        if answer is not None:
            return answer
        return await self._carry(self.protocol.steps(fanout, loop.time), loop)

    async def _carry(self, steps: io.Steps[T], loop: asyncio.AbstractEventLoop) -> T:
        """Carry out ``steps`` to their end; an exception is thrown into them. Reads
        until a deadline run under the transport's one timer (see :class:`_ReadTimer`),
        registered for the steps' reads and for nothing else."""
        timed: _Read | None = None
        result: object = None
        try:
            effect = next(steps)
            while True:
                try:
                    tag = effect[0]
                    if tag == io.READ:
                        deadline = effect[4]
                        if deadline is None or deadline <= loop.time():  # only what came
                            result = await self._read(effect[1], effect[2], effect[3], None)
                        else:
                            if timed is None or timed.deadline != deadline:
                                self._read_timer.stop(timed)
                                timed = self._read_timer.start(loop, deadline)
                            result = await self._read(effect[1], effect[2], effect[3], timed)
                    else:
                        self._read_timer.stop(timed)  # the timer bounds reads only
                        timed = None
                        result = await self._other(effect, loop)
                except BaseException as error:
                    effect = steps.throw(error)
                    continue
                effect = steps.send(result)
        except StopIteration as stop:
            value: T = stop.value
            return value
        finally:
            self._read_timer.stop(timed)
            if self.protocol.closed:
                await self._release()

    async def _other(self, effect: io.IO, loop: asyncio.AbstractEventLoop) -> object:
        tag = effect[0]
        if tag == io.SEND:
            return await self._send(effect[1])
        if tag == io.CONNECT:
            return await asyncio.gather(*(self._new_connection(i) for i in effect[1]))
        if tag == io.DROP:
            await self._drop(effect[1], effect[2])
        elif tag == io.SPAWN:
            if not self.protocol.closed:
                task = loop.create_task(self._carry(effect[1], loop))
                self._probes.add(task)
                task.add_done_callback(self._probes.discard)
        else:  # SLEEP
            await asyncio.sleep(effect[1])
        return None

    async def _new_connection(self, i: int) -> Any:
        try:
            return await self.pools.getter(i)()
        except Exception as error:
            return io.Failed(error, io.LATE if isinstance(error, self.timeouts) else io.BROKEN)

    async def _send(self, sends: list[tuple[Any, ...]]) -> list[object] | None:
        failures: list[object] | None = None
        for k, send in enumerate(sends):  # (endpoint, connection, packed, ...)
            try:
                await send[1].send_packed_command(send[2], check_health=False)
            except BaseException as error:
                # A cancellation too (a full socket buffer): part of it may have gone.
                await self._drop(send[0], send[1])
                failures = send_failed(failures, len(sends), k, error)
                if not isinstance(error, Exception):
                    break
        return failures

    async def _read(
        self, i: int, conn: Any, count: int, timed: _Read | None
    ) -> tuple[list[Reply], io.Failed | None]:
        """``count`` replies: under the transport's timer (``timed``, the round's
        registration), or (None) only those already there, under one time-out ending
        at once. A cancelled read consumed nothing."""
        out: list[Reply] = []
        try:
            if timed is not None:
                while len(out) < count:
                    try:  # math.inf: no time-out of redis-py's own
                        reply = await conn.read_response(
                            timeout=math.inf, disconnect_on_error=False
                        )
                    except self.error_replies as error:
                        if demoted(conn, error):  # a Sentinel-managed master turned replica
                            raise
                        reply = error
                    out.append(reply)
            else:
                async with timeout_at(asyncio.get_running_loop().time()):
                    while len(out) < count:
                        try:
                            reply = await conn.read_response(
                                timeout=math.inf, disconnect_on_error=False
                            )
                        except self.error_replies as error:
                            if demoted(conn, error):
                                raise
                            reply = error
                        out.append(reply)
        except asyncio.TimeoutError:  # the replies are still owed
            return out, io.Failed(
                RedisTimeoutError(f"no reply within {self.timeout:.3f}s"), io.LATE
            )
        except Exception as error:  # broken: the stream is out of step
            await self._drop(i, conn)
            return out, io.Failed(error, io.BROKEN)
        except BaseException as error:
            if timed is not None and self._read_timer.expired(timed):
                late = RedisTimeoutError(f"no reply within {self.timeout:.3f}s")
                return out, io.Failed(late, io.LATE)
            return out, io.Failed(error, io.STOPPED)
        return out, None

    async def _drop(self, i: int, conn: Any) -> None:
        with contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)
        await self.pools.pool(i).release(conn)

    async def close(self) -> None:
        """Hand the kept connections back to their pools."""
        self.protocol.closed = True
        self._read_timer.close()
        for task in list(self._probes):
            task.cancel()
        await self._release()

    async def _release(self) -> None:
        for i, conn, owes in self.protocol.connections():
            if owes:
                with contextlib.suppress(Exception):
                    await conn.disconnect(nowait=True)
            await self.pools.pool(i).release(conn)
