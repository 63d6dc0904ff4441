"""Sync transport: carries out a :class:`~.quorum.Fanout` on redis-py clients.

All masters are written to first, then read, so one round costs the slowest master's
round trip rather than the sum. It borrows one pooled connection per master for the
round (no thread, pool or connection is created per call), reads under one deadline
(the master timeout), and closes a connection whose reply did not come in time so that
a late reply is never read by the next user of that connection.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.connection import ConnectionPool
from redis.exceptions import NoScriptError, ResponseError

from .quorum import Call, Reply


def master_name(client: Any) -> str:
    """A readable address of a master, for messages (``host:port/db`` or a socket path)."""
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix:{kw['path']}/{kw.get('db', 0)}"
    return f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


def connection_getter(pool: ConnectionPool) -> Callable[[], Any]:
    """``pool.get_connection`` across redis-py versions (5.0 needs a command name,
    later versions warn when given one)."""
    params = inspect.signature(pool.get_connection).parameters
    first = next(iter(params.values()), None)
    if first is not None and first.default is inspect.Parameter.empty:
        return lambda: pool.get_connection("EVALSHA")
    return pool.get_connection


class SyncTransport:
    """Runs script calls on N redis-py clients at once."""

    def __init__(self, clients: Sequence[redis.Redis], timeout: float) -> None:
        self.clients = list(clients)
        self.timeout = timeout
        self._getters = [connection_getter(c.connection_pool) for c in self.clients]

    def fanout(self, calls: Sequence[Sequence[Call]]) -> list[list[Reply]]:
        deadline = time.monotonic() + self.timeout
        results: list[list[Reply]] = [[] for _ in calls]
        sent: list[tuple[int, Any]] = []
        for i, per_master in enumerate(calls):
            if not per_master:
                continue
            pool = self.clients[i].connection_pool
            try:
                conn = self._getters[i]()
            except Exception as error:
                results[i] = [error] * len(per_master)
                continue
            try:
                conn.send_packed_command(
                    conn.pack_commands([_evalsha(c) for c in per_master]), check_health=False
                )
            except Exception as error:
                _discard(pool, conn)
                results[i] = [error] * len(per_master)
                continue
            sent.append((i, conn))
        for i, conn in sent:
            results[i] = self._read(conn, len(calls[i]), deadline)
            self.clients[i].connection_pool.release(conn)
        for i, _ in sent:
            if any(isinstance(r, NoScriptError) for r in results[i]):
                results[i] = self._with_scripts(i, calls[i], results[i], deadline)
        return results

    def _read(self, conn: Any, count: int, deadline: float) -> list[Reply]:
        out: list[Reply] = []
        for n in range(count):
            try:
                if not conn.can_read(timeout=max(0.0, deadline - time.monotonic())):
                    raise redis.TimeoutError(f"no reply within {self.timeout:.3f}s")
                out.append(conn.read_response())
            except ResponseError as error:
                out.append(error)
            except Exception as error:
                # The stream is out of step now: drop the connection, fail the rest.
                conn.disconnect()
                out.extend([error] * (count - n))
                break
        return out

    def _with_scripts(
        self, i: int, calls: Sequence[Call], replies: list[Reply], deadline: float
    ) -> list[Reply]:
        """Redo the calls a master answered NOSCRIPT to (it restarted or was flushed):
        SCRIPT LOAD then EVALSHA, pipelined."""
        pool = self.clients[i].connection_pool
        try:
            conn = self._getters[i]()
        except Exception as error:
            return [error if isinstance(r, NoScriptError) else r for r in replies]
        redo = [c for c, r in zip(calls, replies, strict=False) if isinstance(r, NoScriptError)]
        scripts = {c.script.sha: c.script.source for c in redo}
        commands: list[tuple[object, ...]] = [("SCRIPT", "LOAD", s) for s in scripts.values()]
        commands += [_evalsha(c) for c in redo]
        try:
            conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        except Exception as error:
            _discard(pool, conn)
            return [error if isinstance(r, NoScriptError) else r for r in replies]
        loaded = self._read(conn, len(commands), deadline)
        pool.release(conn)
        fresh = iter(loaded[len(scripts) :])
        return [next(fresh) if isinstance(r, NoScriptError) else r for r in replies]


def _evalsha(call: Call) -> tuple[object, ...]:
    return ("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)


def _discard(pool: ConnectionPool, conn: Any) -> None:
    conn.disconnect()
    pool.release(conn)
