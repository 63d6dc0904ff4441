"""Asyncio transport: carries out a :class:`~redreentrant._core.effects.Fanout` on
``redis.asyncio`` clients, following the same fan-out protocol as the sync transport
(:mod:`redreentrant._core.fanout`).

All masters are written to first, then read, in the calling task: a round costs the
slowest master's round trip, and no task is made per master or per call. Each master's
connections are checked out of its client's pool once and kept on a free list. Masters
that need a new connection are connected all at once (a task per connect, only then),
so k unreachable masters cost one connect time-out, not k. Replies are read under one
deadline (the master timeout, from when the last request went out); a connection whose
reply did not come in time is closed, so a late reply is never read by the next round
(``redis.asyncio`` reports a read time-out by returning ``None``, which is treated as
the time-out it is: no script of ours replies nil).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core.effects import Call, Reply
from .._core.fanout import FanoutRound, connection_getter, read_failed


class AsyncTransport:
    """Runs script calls on N ``redis.asyncio`` clients at once."""

    def __init__(self, clients: Sequence[Any], timeout: float) -> None:
        self.clients = list(clients)
        self.timeout = timeout
        self._getters = [connection_getter(c.connection_pool) for c in self.clients]
        self._idle: list[list[Any]] = [[] for _ in self.clients]
        self._closed = False

    async def _new_connection(self, i: int) -> Any:
        try:
            return await self._getters[i]()
        except Exception as error:
            return error

    async def _give(self, i: int, conn: Any) -> None:
        if self._closed:
            await self.clients[i].connection_pool.release(conn)
        else:
            self._idle[i].append(conn)

    async def fanout(self, calls: Sequence[Sequence[Call]]) -> list[list[Reply]]:
        fan = FanoutRound(calls)
        sent: list[tuple[int, Any]] = []
        try:
            unconnected: list[int] = []
            for i in fan.targets:
                if self._idle[i]:
                    await self._start(fan, i, self._idle[i].pop(), sent)
                else:
                    unconnected.append(i)
            if unconnected:
                conns = await asyncio.gather(*(self._new_connection(i) for i in unconnected))
                for i, conn in zip(unconnected, conns, strict=True):
                    if isinstance(conn, Exception):
                        fan.failed(i, conn)
                    else:
                        await self._start(fan, i, conn, sent)
            deadline = asyncio.get_running_loop().time() + self.timeout
            while sent:
                i, conn = sent[0]
                fan.answered(i, await self._read(conn, fan.count(i), deadline))
                sent.pop(0)
                await self._give(i, conn)
            for i in fan.targets:
                commands = fan.reload(i)
                if commands is not None:
                    fan.reloaded(i, await self._run(i, commands, deadline))
        except BaseException:
            # Cancelled mid-round: replies are still due on these connections.
            for i, conn in sent:
                with contextlib.suppress(Exception):
                    await conn.disconnect(nowait=True)
                await self._give(i, conn)
            raise
        return fan.results

    async def _start(
        self, fan: FanoutRound, i: int, conn: Any, sent: list[tuple[int, Any]]
    ) -> None:
        error = await self._send(i, conn, fan.commands(i))
        if error is None:
            sent.append((i, conn))
        else:
            fan.failed(i, error)

    async def _send(
        self, i: int, conn: Any, commands: list[tuple[object, ...]]
    ) -> Exception | None:
        """Send ``commands`` pipelined; on failure the connection is dropped."""
        try:
            await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        except Exception as error:
            await conn.disconnect(nowait=True)
            await self._give(i, conn)
            return error
        return None

    async def _run(
        self, i: int, commands: list[tuple[object, ...]], deadline: float
    ) -> list[Reply]:
        """Send ``commands`` to master ``i`` and read their replies (the NOSCRIPT redo)."""
        conn = self._idle[i].pop() if self._idle[i] else await self._new_connection(i)
        if isinstance(conn, Exception):
            return read_failed([], len(commands), conn)
        error = await self._send(i, conn, commands)
        if error is not None:
            return read_failed([], len(commands), error)
        replies = await self._read(conn, len(commands), deadline)
        await self._give(i, conn)
        return replies

    async def _read(self, conn: Any, count: int, deadline: float) -> list[Reply]:
        out: list[Reply] = []
        loop = asyncio.get_running_loop()
        while len(out) < count:
            try:
                left = max(deadline - loop.time(), 1e-6)
                reply = await conn.read_response(timeout=left)
                if reply is None:
                    # A time-out (see the module docstring): the reply is still owed,
                    # so this connection must never serve another round.
                    raise RedisTimeoutError(f"no reply within {self.timeout:.3f}s")
                out.append(reply)
            except ResponseError as error:
                out.append(error)
            except Exception as error:  # timed out or broken: the stream is out of step
                await conn.disconnect(nowait=True)
                return read_failed(out, count, error)
        return out

    async def close(self) -> None:
        """Hand the kept connections back to their pools."""
        self._closed = True
        for i, idle in enumerate(self._idle):
            while idle:
                await self.clients[i].connection_pool.release(idle.pop())
