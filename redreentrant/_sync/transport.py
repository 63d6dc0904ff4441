"""Sync transport: carries out a :class:`~redreentrant._core.effects.Fanout` on redis-py
clients, following the fan-out protocol of :mod:`redreentrant._core.fanout`.

All masters are written to first, then read, so one round costs the slowest master's
round trip rather than the sum. Each master's connections are checked out of its
client's pool once and then kept on a free list (no thread, pool or connection is made
per call). Masters with a kept connection are sent to first; masters that need a new
connection are connected all at once (a few connector threads, made once per transport
and used only then), so k unreachable masters cost one connect time-out, not k. Replies
are read under one deadline (the master timeout, from when the last request went out);
a connection whose reply did not come in time is closed, so a late reply is never read
by the next round.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
from redis.exceptions import ResponseError

from .._core.effects import Call, Reply
from .._core.fanout import FanoutRound, connection_getter, read_failed

_timed_reads: dict[type, bool] = {}


def reads_with_timeout(conn: Any) -> bool:
    """Whether ``conn.read_response`` takes a ``timeout`` (newer redis-py)."""
    kind = type(conn)
    if kind not in _timed_reads:
        params = inspect.signature(kind.read_response).parameters
        _timed_reads[kind] = "timeout" in params
    return _timed_reads[kind]


class SyncTransport:
    """Runs script calls on N redis-py clients at once."""

    def __init__(self, clients: Sequence[redis.Redis], timeout: float) -> None:
        self.clients = list(clients)
        self.timeout = timeout
        self._getters = [connection_getter(c.connection_pool) for c in self.clients]
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._idle: list[list[Any]] = [[] for _ in self.clients]
        self._connector: ThreadPoolExecutor | None = None
        self._closed = False

    def _connect(self, masters: list[int]) -> list[Any]:
        """New connections to ``masters``, all at once; an exception for each failure."""
        if len(masters) == 1:
            return [self._new_connection(masters[0])]
        if self._connector is None:
            self._connector = ThreadPoolExecutor(
                max_workers=len(self.clients), thread_name_prefix="redreentrant-connect"
            )
        return list(self._connector.map(self._new_connection, masters))

    def _new_connection(self, i: int) -> Any:
        try:
            return self._getters[i]()
        except Exception as error:
            return error

    def _give(self, i: int, conn: Any) -> None:
        if self._closed:
            self.clients[i].connection_pool.release(conn)
        else:
            self._idle[i].append(conn)

    def fanout(self, calls: Sequence[Sequence[Call]]) -> list[list[Reply]]:
        if self._pid != os.getpid():
            self._reset()  # a forked child must not share the parent's sockets
        fan = FanoutRound(calls)
        sent: list[tuple[int, Any]] = []
        unconnected: list[int] = []
        idle = self._idle
        for i in fan.targets:
            try:
                conn = idle[i].pop()  # list.pop is atomic: safe across threads
            except IndexError:
                unconnected.append(i)
                continue
            error = self._send(i, conn, fan.commands(i))
            if error is None:
                sent.append((i, conn))
            else:
                fan.failed(i, error)
        if unconnected:
            for i, conn in zip(unconnected, self._connect(unconnected), strict=True):
                error = (
                    conn if isinstance(conn, Exception) else self._send(i, conn, fan.commands(i))
                )
                if error is None:
                    sent.append((i, conn))
                else:
                    fan.failed(i, error)
        # The master timeout runs from when the last request went out, so a slow connect
        # to one master does not eat the others' time.
        deadline = time.monotonic() + self.timeout
        results = fan.results
        for i, conn in sent:
            results[i] = self._read(conn, len(calls[i]), deadline)
            self._give(i, conn)
        for i, _ in sent:
            commands = fan.reload(i)
            if commands is not None:
                fan.reloaded(i, self._run(i, commands, deadline))
        return results

    def _send(self, i: int, conn: Any, commands: list[tuple[object, ...]]) -> Exception | None:
        """Send ``commands`` pipelined; on failure the connection is dropped."""
        try:
            if len(commands) == 1:
                packed = conn.pack_command(*commands[0])
            else:
                packed = conn.pack_commands(commands)
            conn.send_packed_command(packed, check_health=False)
        except Exception as error:
            conn.disconnect()
            self._give(i, conn)
            return error
        return None

    def _run(self, i: int, commands: list[tuple[object, ...]], deadline: float) -> list[Reply]:
        """Send ``commands`` to master ``i`` and read their replies (the NOSCRIPT redo)."""
        conn = self._idle[i].pop() if self._idle[i] else self._new_connection(i)
        if isinstance(conn, Exception):
            return read_failed([], len(commands), conn)
        error = self._send(i, conn, commands)
        if error is not None:
            return read_failed([], len(commands), error)
        replies = self._read(conn, len(commands), deadline)
        self._give(i, conn)
        return replies

    def _read(self, conn: Any, count: int, deadline: float) -> list[Reply]:
        out: list[Reply] = []
        timed = reads_with_timeout(conn)
        while len(out) < count:
            try:
                left = max(0.0, deadline - time.monotonic())
                if timed:
                    # One blocking read bounded by the round's deadline.
                    out.append(conn.read_response(timeout=max(left, 1e-6)))
                    continue
                if not conn.can_read(timeout=left):
                    raise redis.TimeoutError(f"no reply within {self.timeout:.3f}s")
                out.append(conn.read_response())
            except ResponseError as error:
                out.append(error)
            except Exception as error:
                # The stream is out of step now: drop the connection, fail the rest.
                conn.disconnect()
                return read_failed(out, count, error)
        return out

    def close(self) -> None:
        """Hand the kept connections back to their pools."""
        self._closed = True
        if self._pid != os.getpid():
            return
        if self._connector is not None:
            self._connector.shutdown(wait=False)
        for i, idle in enumerate(self._idle):
            while idle:
                self.clients[i].connection_pool.release(idle.pop())
