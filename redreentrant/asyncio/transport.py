"""Asyncio transport: carries out a :class:`~redreentrant.quorum.Fanout` on
``redis.asyncio`` clients, the way the sync transport does it on redis-py.

All masters are written to first, then read, in the calling task: a round costs the
slowest master's round trip, and no task is made per master or per call. Each master's
connections are checked out of its client's pool once and kept on a free list. Replies
are read under one deadline (the master timeout, from when the last request went out);
a connection whose reply did not come in time is closed, so a late reply is never read
by the next round (``redis.asyncio`` reports a read time-out by returning ``None``,
which is treated as the time-out it is).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..quorum import Call, Reply
from ..transport import connection_getter, evalsha_args


class AsyncTransport:
    """Runs script calls on N ``redis.asyncio`` clients at once."""

    def __init__(self, clients: Sequence[Any], timeout: float) -> None:
        self.clients = list(clients)
        self.timeout = timeout
        self._getters = [connection_getter(c.connection_pool) for c in self.clients]
        self._idle: list[list[Any]] = [[] for _ in self.clients]
        self._closed = False

    async def _take(self, i: int) -> Any:
        if self._idle[i]:
            return self._idle[i].pop()
        return await self._getters[i]()

    async def _give(self, i: int, conn: Any) -> None:
        if self._closed:
            await self.clients[i].connection_pool.release(conn)
        else:
            self._idle[i].append(conn)

    async def fanout(self, calls: Sequence[Sequence[Call]]) -> list[list[Reply]]:
        results: list[list[Reply]] = [[] for _ in calls]
        sent: list[tuple[int, Any]] = []
        try:
            for i, per_master in enumerate(calls):
                if per_master:
                    conn = await self._send(i, per_master, results)
                    if conn is not None:
                        sent.append((i, conn))
            deadline = asyncio.get_running_loop().time() + self.timeout
            while sent:
                i, conn = sent[0]
                results[i] = await self._read(conn, len(calls[i]), deadline)
                sent.pop(0)
                await self._give(i, conn)
        except BaseException:
            # Cancelled mid-round: replies are still due on these connections.
            for i, conn in sent:
                with contextlib.suppress(Exception):
                    await conn.disconnect(nowait=True)
                await self._give(i, conn)
            raise
        for i, per_master in enumerate(calls):
            if any(isinstance(r, NoScriptError) for r in results[i]):
                results[i] = await self._with_scripts(i, per_master, results[i])
        return results

    async def _send(self, i: int, calls: Sequence[Call], results: list[list[Reply]]) -> Any | None:
        try:
            conn = await self._take(i)
        except Exception as error:  # refused, unreachable: this master failed
            results[i] = [error] * len(calls)
            return None
        try:
            commands = [evalsha_args(c) for c in calls]
            await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        except Exception as error:
            await conn.disconnect(nowait=True)
            await self._give(i, conn)
            results[i] = [error] * len(calls)
            return None
        return conn

    async def _read(self, conn: Any, count: int, deadline: float) -> list[Reply]:
        out: list[Reply] = []
        loop = asyncio.get_running_loop()
        for n in range(count):
            try:
                left = max(deadline - loop.time(), 1e-6)
                reply = await conn.read_response(timeout=left)
                if reply is None:
                    # redis.asyncio answers a time-out with None instead of raising
                    # (no script of ours replies nil): the reply is still owed, so
                    # this connection must never serve another round.
                    raise RedisTimeoutError(f"no reply within {self.timeout:.3f}s")
                out.append(reply)
            except ResponseError as error:
                out.append(error)
            except Exception as error:  # timed out or broken: the stream is out of step
                await conn.disconnect(nowait=True)
                out.extend([error] * (count - n))
                break
        return out

    async def _with_scripts(
        self, i: int, calls: Sequence[Call], replies: list[Reply]
    ) -> list[Reply]:
        """Redo the calls a master answered NOSCRIPT to (it restarted or was flushed):
        load the script, then run it again (a rare path: a task per call is fine)."""
        client = self.clients[i]

        async def load_and_run(call: Call) -> Reply:
            await client.script_load(call.script.source)
            return await client.evalsha(*evalsha_args(call)[1:])

        out: list[Reply] = []
        for call, reply in zip(calls, replies, strict=True):
            if not isinstance(reply, NoScriptError):
                out.append(reply)
                continue
            try:
                out.append(await asyncio.wait_for(load_and_run(call), self.timeout))
            except Exception as error:  # an error reply, a time-out: this call failed
                out.append(error)
        return out

    async def close(self) -> None:
        """Hand the kept connections back to their pools."""
        self._closed = True
        for i, idle in enumerate(self._idle):
            while idle:
                await self.clients[i].connection_pool.release(idle.pop())
