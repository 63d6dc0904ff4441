"""Sync transport: carries out a :class:`~.quorum.Fanout` on redis-py clients.

All masters are written to first, then read, so one round costs the slowest master's
round trip rather than the sum. Each master's connections are checked out of its client's
pool once and then kept on a free list (no thread, pool or connection is made per call,
and no pool bookkeeping is paid per round). Replies are read under one deadline (the
master timeout); a connection whose reply did not come in time is closed, so that a late
reply is never read by the next round.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.exceptions import NoScriptError, ResponseError

from .quorum import Call, Reply


def master_name(client: Any) -> str:
    """A readable address of a master, for messages (``host:port/db`` or a socket path)."""
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix:{kw['path']}/{kw.get('db', 0)}"
    return f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


def connection_getter(pool: Any) -> Callable[[], Any]:
    """``pool.get_connection`` across redis-py versions (5.0 needs a command name,
    later versions warn when given one)."""
    params = inspect.signature(pool.get_connection).parameters
    first = next(iter(params.values()), None)
    if first is not None and first.default is inspect.Parameter.empty:
        return lambda: pool.get_connection("EVALSHA")
    return pool.get_connection  # type: ignore[no-any-return]


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
        self._closed = False

    def _take(self, i: int) -> Any:
        if self._pid != os.getpid():
            self._reset()  # a forked child must not share the parent's sockets
        try:
            return self._idle[i].pop()  # list.pop is atomic: safe across threads
        except IndexError:
            return self._getters[i]()

    def _give(self, i: int, conn: Any) -> None:
        if self._closed:
            self.clients[i].connection_pool.release(conn)
        else:
            self._idle[i].append(conn)

    def fanout(self, calls: Sequence[Sequence[Call]]) -> list[list[Reply]]:
        results: list[list[Reply]] = [[] for _ in calls]
        sent: list[tuple[int, Any]] = []
        for i, per_master in enumerate(calls):
            if not per_master:
                continue
            try:
                conn = self._take(i)
            except Exception as error:
                results[i] = [error] * len(per_master)
                continue
            try:
                if len(per_master) == 1:
                    packed = conn.pack_command(*evalsha_args(per_master[0]))
                else:
                    packed = conn.pack_commands([evalsha_args(c) for c in per_master])
                conn.send_packed_command(packed, check_health=False)
            except Exception as error:
                conn.disconnect()
                self._give(i, conn)
                results[i] = [error] * len(per_master)
                continue
            sent.append((i, conn))
        # The master timeout runs from when the last request went out, so a slow connect
        # to one master does not eat the others' time.
        deadline = time.monotonic() + self.timeout
        for i, conn in sent:
            results[i] = self._read(conn, len(calls[i]), deadline)
            self._give(i, conn)
        for i, _ in sent:
            if any(isinstance(r, NoScriptError) for r in results[i]):
                results[i] = self._with_scripts(i, calls[i], results[i], deadline)
        return results

    def _read(self, conn: Any, count: int, deadline: float) -> list[Reply]:
        out: list[Reply] = []
        timed = reads_with_timeout(conn)
        for n in range(count):
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
                out.extend([error] * (count - n))
                break
        return out

    def _with_scripts(
        self, i: int, calls: Sequence[Call], replies: list[Reply], deadline: float
    ) -> list[Reply]:
        """Redo the calls a master answered NOSCRIPT to (it restarted or was flushed):
        SCRIPT LOAD then EVALSHA, pipelined."""
        redo = [c for c, r in zip(calls, replies, strict=True) if isinstance(r, NoScriptError)]
        sources = {c.script.sha: c.script.source for c in redo}
        commands: list[tuple[object, ...]] = [("SCRIPT", "LOAD", s) for s in sources.values()]
        commands += [evalsha_args(c) for c in redo]
        try:
            conn = self._take(i)
        except Exception as error:
            return [error if isinstance(r, NoScriptError) else r for r in replies]
        try:
            conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        except Exception as error:
            conn.disconnect()
            self._give(i, conn)
            return [error if isinstance(r, NoScriptError) else r for r in replies]
        loaded = self._read(conn, len(commands), deadline)
        self._give(i, conn)
        fresh = iter(loaded[len(sources) :])
        return [next(fresh) if isinstance(r, NoScriptError) else r for r in replies]

    def close(self) -> None:
        """Hand the kept connections back to their pools."""
        self._closed = True
        if self._pid != os.getpid():
            return
        for i, idle in enumerate(self._idle):
            while idle:
                self.clients[i].connection_pool.release(idle.pop())


def evalsha_args(call: Call) -> tuple[object, ...]:
    """The EVALSHA command for a call."""
    return ("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
