"""Asyncio transport: carries out a :class:`~redreentrant.quorum.Fanout` on
``redis.asyncio`` clients, all masters concurrently, each under the master timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from ..quorum import Call, Reply


class AsyncTransport:
    """Runs script calls on N ``redis.asyncio`` clients at once."""

    def __init__(self, clients: Sequence[Any], timeout: float) -> None:
        self.clients = list(clients)
        self.timeout = timeout

    async def fanout(self, calls: Sequence[Sequence[Call]]) -> list[list[Reply]]:
        rounds = (self._master(i, c) for i, c in enumerate(calls))
        return list(await asyncio.gather(*rounds))

    async def _master(self, i: int, calls: Sequence[Call]) -> list[Reply]:
        if not calls:
            return []
        try:
            return await asyncio.wait_for(self._send(self.clients[i], calls), self.timeout)
        except Exception as error:  # refused, timed out, broken: this master failed
            return [error] * len(calls)

    async def _send(self, client: Any, calls: Sequence[Call]) -> list[Reply]:
        if len(calls) == 1:
            return [await _evalsha(client, calls[0])]
        async with client.pipeline(transaction=False) as pipe:
            for call in calls:
                pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
            replies: list[Reply] = await pipe.execute(raise_on_error=False)
        # A master that restarted or was flushed lost its scripts: load and redo.
        return [
            await _evalsha(client, c) if isinstance(r, NoScriptError) else r
            for c, r in zip(calls, replies, strict=True)
        ]


async def _evalsha(client: Any, call: Call) -> Reply:
    """One EVALSHA, loading the script on NOSCRIPT; an error reply is returned, not
    raised."""
    args = (call.script.sha, len(call.keys), *call.keys, *call.args)
    try:
        try:
            return await client.evalsha(*args)
        except NoScriptError:
            await client.script_load(call.script.source)
            return await client.evalsha(*args)
    except ResponseError as error:
        return error
