"""Sync transport: carries out the steps of the fan-out rounds
(:class:`~redreentrant._core.fanout.FanoutProtocol`, which decides everything else) on
redis-py clients: it connects, sends, reads until a deadline and closes.

Each master's connections are checked out of its client's pool once and then kept (no
thread, pool or connection is made per call). New connections to several masters are
made at once by a few connector threads, made once per transport and used only then
and for probes of suspect masters.

A read never times out inside redis-py (which would close the connection): the
transport polls with ``can_read`` and reads only what has come, or, where the
connection's own socket time-out ends about at the round's deadline (the wire
connections of :mod:`.wire`), blocks in one read.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import redis
from redis.exceptions import ResponseError

from .._core import fanout as io
from .._core.effects import Fanout, Reply
from .._core.owner import PID
from .._core.sentinel import demoted
from .._core.transport import FanoutTransport, send_failed
from .cluster import NodeClients
from .wire import wire_pool

T = TypeVar("T")

#: how far past the round's deadline (a share of the master timeout) a read may wait
#: when it waits on the socket's own time-out
SLACK = 0.1


class SyncTransport(FanoutTransport):
    """Runs script calls on N members at once (see
    :class:`~redreentrant._core.transport.FanoutTransport`): redis-py clients, or Redis
    Clusters (:class:`~redreentrant._core.cluster.ClusterMember`)."""

    node_clients = NodeClients
    wire_pool = staticmethod(wire_pool)
    timeout_error = redis.TimeoutError
    reply_error = ResponseError
    guard = threading.Lock

    _pid = -1
    _connector: ThreadPoolExecutor | None = None

    def fanout(self, fanout: Fanout) -> list[list[Reply]]:
        protocol = self.protocol
        if self._pid != PID[0]:  # a forked child must not share the parent's sockets
            if self._pid != -1:
                protocol.reset()
            self._pid = PID[0]
            self._connector = None
        try:
            lone = protocol.lone(fanout, time.monotonic)
            if lone is not None:
                conn = lone[0]
                sent = self._send([(0, conn, lone[1])])
                got = None if sent else self._read(0, conn, 1, time.monotonic() + self.timeout)
                answer = protocol.lone_answer(lone, sent, got, time.monotonic)
                if answer is not None:
                    return answer
            return self._carry(protocol.steps(fanout, time.monotonic))
        finally:
            if protocol.closed:  # a round that ended after close(): its connections too
                self._release()

    def _carry(self, steps: io.Steps[T]) -> T:
        """Carry out ``steps`` to their end; an exception is thrown into them."""
        result: object = None
        error: BaseException | None = None
        while True:
            try:
                effect = steps.send(result) if error is None else steps.throw(error)
            except StopIteration as stop:
                end: T = stop.value
                return end
            result = error = None
            try:
                tag = effect[0]
                if tag == io.READ:
                    result = self._read(effect[1], effect[2], effect[3], effect[4])
                elif tag == io.SEND:
                    result = self._send(effect[1])
                elif tag == io.CONNECT:
                    result = self._connect(effect[1])
                elif tag == io.DROP:
                    self._drop(effect[1], effect[2])
                elif tag == io.SPAWN:
                    if not self.protocol.closed:
                        self._threads().submit(self._carry, effect[1])
                else:  # SLEEP
                    time.sleep(effect[1])
            except BaseException as caught:
                error = caught

    def _threads(self) -> ThreadPoolExecutor:
        if self._connector is None:
            self._connector = ThreadPoolExecutor(
                max_workers=2 * len(self.protocol.masters),
                thread_name_prefix="redreentrant-connect",
            )
        return self._connector

    def _connect(self, endpoints: list[int]) -> list[Any]:
        """New connections to ``endpoints``, all at once (a few threads)."""
        if len(endpoints) == 1:
            return [self._new_connection(endpoints[0])]
        return list(self._threads().map(self._new_connection, endpoints))

    def _new_connection(self, i: int) -> Any:
        try:
            return self.pools.getter(i)()
        except Exception as error:
            return io.Failed(error, io.LATE if isinstance(error, self.timeouts) else io.BROKEN)

    def _send(self, sends: list[tuple[Any, ...]]) -> list[object] | None:
        failures: list[object] | None = None
        for k, send in enumerate(sends):  # (endpoint, connection, packed, ...)
            try:
                send[1].send_packed_command(send[2], check_health=False)
            except BaseException as error:  # an interruption too: the stream is out of step
                self._drop(send[0], send[1])
                failures = send_failed(failures, len(sends), k, error)
                if not isinstance(error, Exception):
                    break
        return failures

    def _read(
        self, i: int, conn: Any, count: int, deadline: float | None
    ) -> tuple[list[Reply], io.Failed | None]:
        out: list[Reply] = []
        # The socket's own time-out serves as the deadline when it ends about then (the
        # connections made from URLs have the master timeout): one blocking read, with
        # no poll before it. Else, or late in the round, a poll bounded by the deadline.
        own = conn.socket_timeout
        slack = SLACK * self.timeout
        while len(out) < count:
            try:
                if deadline is None:  # only what came
                    ready = conn.can_read(timeout=0)
                else:
                    left = deadline - time.monotonic()
                    ready = (own is not None and own <= left + slack) or conn.can_read(
                        timeout=max(0.0, left)
                    )
                if not ready:
                    error = redis.TimeoutError(f"no reply within {self.timeout:.3f}s")
                    return out, io.Failed(error, io.LATE)
                reply: Reply = conn.read_response(disconnect_on_error=False)
            except self.error_replies as error:
                if demoted(conn, error):  # a Sentinel-managed master turned replica
                    self._drop(i, conn)
                    return out, io.Failed(error, io.BROKEN)
                reply = error
            except self.timeouts as error:
                return out, io.Failed(error, io.LATE)
            except Exception as error:
                self._drop(i, conn)
                return out, io.Failed(error, io.BROKEN)
            except BaseException as error:
                return out, io.Failed(error, io.STOPPED)
            out.append(reply)
        return out, None

    def _drop(self, i: int, conn: Any) -> None:
        # Back to the client's pool: the next connection is a new one, which the round
        # sends every script first (the master may have restarted without them).
        conn.disconnect()
        self.pools.pool(i).release(conn)

    def close(self) -> None:
        """Hand the kept connections back to their pools."""
        self.protocol.closed = True
        if self._pid == PID[0]:  # not a forked child's: its parent's to close
            if self._connector is not None:
                self._connector.shutdown(wait=False)
            self._release()

    def _release(self) -> None:
        for i, conn, owes in self.protocol.connections():
            if owes:
                conn.disconnect()
            self.pools.pool(i).release(conn)
