"""The fan-out round (redreentrant._core.fanout), deterministically, through both
transports: each master is an in-memory fake with the part of a redis-py connection
the transports use, answering its scripts at once, late (replies withheld until told),
or never; connections that break, sends and reads that are interrupted, scripts a
master forgot or refuses to load. Every scenario runs with the sync transport and
with the asyncio one, so the one round in the core is checked under both."""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from redreentrant._async.transport import AsyncTransport
from redreentrant._core import fanout as io
from redreentrant._core.effects import UNREAD, Call, Early, Fanout
from redreentrant._core.fanout import FanoutProtocol
from redreentrant._core.health import IDLE_CHECK
from redreentrant._core.scripts import ACQUIRE, LOCK_SCRIPTS, RELEASE
from redreentrant._core.transport import packing
from redreentrant._sync.transport import SyncTransport

TIMEOUT = 0.05  # the master timeout: rounds that wait for a silent master wait this long
SHAS = {s.sha: s.name for s in LOCK_SCRIPTS}


class Encoder:
    # Not UTF-8: the transports then pack with the connection's own pack_commands,
    # which here keeps the commands as they are.
    encoding, encoding_errors, decode_responses = "latin-1", "strict", False


class Master:
    """A fake master: runs what its connections send, answering EVALSHA with
    ``answer(master, call)``; ``mode`` is ``ok``, ``silent`` (replies withheld until
    :meth:`speak`), ``broken`` (sends and reads fail) or ``down`` (no connection)."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.mode = "ok"
        self.scripts: set[str] = set()
        self.refuse_load: str | None = None
        self.answer: Callable[[Master, tuple[object, ...]], object] = lambda m, c: [1, 1]
        #: every EVALSHA run here, as (script name, keys and args), in order
        self.ran: list[tuple[object, ...]] = []
        self.conns: list[Conn] = []
        self.connects = 0
        self.released: list[Conn] = []
        #: raise this inside the next send or read (an interruption)
        self.interrupt: tuple[str, BaseException] | None = None

    def run(self, command: tuple[object, ...]) -> object:
        if command[0] == "SCRIPT":
            if self.refuse_load is not None:
                return ResponseError(self.refuse_load)
            source = str(command[2])
            sha = next(s.sha for s in LOCK_SCRIPTS if s.source == source)
            self.scripts.add(sha)
            return sha
        if command[0] == "PING":
            return b"PONG"
        assert command[0] == "EVALSHA"
        if command[1] not in self.scripts:
            return NoScriptError("NOSCRIPT No matching script.")
        self.ran.append((SHAS[str(command[1])], *command[3:]))
        return self.answer(self, command)

    def speak(self, limit: int | None = None) -> None:
        """A silent master answers: what it withheld comes, in order (at most ``limit``
        replies per connection: the rest is still on its way)."""
        self.mode = "ok"
        for conn in self.conns:
            while conn.held and (limit is None or limit > 0):
                conn.queue.append(conn.held.popleft())
                limit = None if limit is None else limit - 1
            conn.woken()

    def hang_up(self) -> None:
        """The master closes its connections (a restart, an idle time-out): what is
        sent on them is lost, and a read finds the stream closed."""
        for conn in self.conns:
            conn.hung_up = True
            conn.woken()

    def strike(self, where: str) -> None:
        if self.interrupt is not None and self.interrupt[0] == where:
            error = self.interrupt[1]
            self.interrupt = None
            raise error


class Conn:
    encoder = Encoder()
    socket_timeout = None

    def __init__(self, master: Master) -> None:
        self.master = master
        self.queue: collections.deque[object] = collections.deque()
        self.held: collections.deque[object] = collections.deque()
        self.closed = False
        self.hung_up = False
        master.conns.append(self)

    def pack_commands(self, commands: Any) -> list[tuple[object, ...]]:
        return [tuple(c) for c in commands]

    def _send(self, packed: list[tuple[object, ...]]) -> None:
        self.master.strike("send")
        if self.closed or self.master.mode == "broken":
            raise RedisConnectionError("connection broken")
        if self.hung_up:
            return  # into the socket's buffer, never read by the master
        for command in packed:
            reply = self.master.run(command)
            (self.held if self.master.mode == "silent" else self.queue).append(reply)

    def _take(self) -> object:
        self.master.strike("read")
        if self.closed or self.master.mode == "broken":
            raise RedisConnectionError("connection broken")
        if self.hung_up:
            raise RedisConnectionError("Connection closed by server.")
        reply = self.queue.popleft()
        if isinstance(reply, Exception):
            raise reply
        return reply

    def woken(self) -> None:
        pass


class SyncConn(Conn):
    def send_packed_command(self, packed: Any, check_health: bool = True) -> None:
        self._send(packed)

    def can_read(self, timeout: float = 0) -> bool:
        self.master.strike("read")
        return bool(self.queue) or self.closed or self.hung_up or self.master.mode == "broken"

    def read_response(self, disconnect_on_error: bool = True) -> object:
        if not (self.queue or self.closed or self.hung_up or self.master.mode == "broken"):
            raise redis.TimeoutError("no reply")
        return self._take()

    def disconnect(self) -> None:
        self.closed = True


class AsyncConn(Conn):
    def __init__(self, master: Master) -> None:
        super().__init__(master)
        self._waiter: asyncio.Future[None] | None = None

    async def send_packed_command(self, packed: Any, check_health: bool = True) -> None:
        self._send(packed)

    async def read_response(
        self, timeout: float | None = None, disconnect_on_error: bool = True
    ) -> object:
        assert timeout == math.inf  # the transport bounds its reads itself
        while not (self.queue or self.closed or self.hung_up or self.master.mode == "broken"):
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._take()

    def woken(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def disconnect(self, nowait: bool = False) -> None:
        self.closed = True


class Pool:
    def __init__(self, master: Master, conn: type[Conn]) -> None:
        self.master = master
        self.conn = conn
        self.connection_kwargs = {"host": "fake", "port": 6000 + master.number, "db": 0}

    def _get(self) -> Conn:
        if self.master.mode == "down":
            raise redis.TimeoutError("timed out connecting")
        self.master.connects += 1
        return self.conn(self.master)

    def _release(self, conn: Conn) -> None:
        self.master.released.append(conn)


class SyncPool(Pool):
    def get_connection(self) -> Conn:
        return self._get()

    def release(self, conn: Conn) -> None:
        self._release(conn)


class AsyncPool(Pool):
    async def get_connection(self) -> Conn:
        return self._get()

    async def release(self, conn: Conn) -> None:
        self._release(conn)


class Client:
    def __init__(self, pool: Pool) -> None:
        self.connection_pool = pool


class Harness:
    """N fake masters behind one transport of a flavour, driven from plain code."""

    def __init__(self, flavour: str, size: int) -> None:
        self.flavour = flavour
        self.masters = [Master(i) for i in range(size)]
        self.loop: asyncio.AbstractEventLoop | None = None
        self.transport: SyncTransport | AsyncTransport
        if flavour == "sync":
            pools: list[Pool] = [SyncPool(m, SyncConn) for m in self.masters]
            self.transport = SyncTransport([Client(p) for p in pools], TIMEOUT, 0.01)
        else:
            pools = [AsyncPool(m, AsyncConn) for m in self.masters]
            self.loop = asyncio.new_event_loop()
            self.transport = AsyncTransport([Client(p) for p in pools], TIMEOUT, 0.01)

    @property
    def protocol(self) -> FanoutProtocol:
        return self.transport.protocol

    def round(self, fanout: Fanout) -> list[list[object]]:
        if isinstance(self.transport, SyncTransport):
            return self.transport.fanout(fanout)
        assert self.loop is not None
        transport = self.transport

        async def run() -> list[list[object]]:
            return await transport.fanout(fanout)

        return self.loop.run_until_complete(run())

    def cancel_round(self, fanout: Fanout, when: Callable[[], bool]) -> None:
        """Start a round and stop it once ``when()`` (sync: Ctrl-C in a read; asyncio:
        the task cancelled)."""
        if isinstance(self.transport, SyncTransport):
            with pytest.raises(KeyboardInterrupt):
                self.transport.fanout(fanout)
            return
        loop = self.loop
        assert loop is not None

        async def cancel() -> None:
            task = asyncio.ensure_future(self.transport.fanout(fanout))  # type: ignore[arg-type]
            while not when():
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        loop.run_until_complete(cancel())

    def settle(self, until: Callable[[], bool]) -> None:
        """Let background work (probes) go on until ``until()``."""
        for _ in range(500):
            if until():
                return
            if self.loop is not None:
                self.loop.run_until_complete(asyncio.sleep(0.002))
            else:
                import time

                time.sleep(0.002)
        raise AssertionError("background work did not end")

    def close(self) -> None:
        if isinstance(self.transport, SyncTransport):
            self.transport.close()
        else:
            assert self.loop is not None
            self.loop.run_until_complete(self.transport.close())
            self.loop.close()


@pytest.fixture(params=["sync", "asyncio"])
def harness(request: pytest.FixtureRequest) -> Iterator[Callable[[int], Harness]]:
    made: list[Harness] = []

    def make(size: int) -> Harness:
        h = Harness(request.param, size)
        made.append(h)
        return h

    yield make
    for h in made:
        if h.loop is None or not h.loop.is_closed():
            h.close()


def acquire(n: int, owner: str = "o") -> Fanout:
    call = Call(ACQUIRE, ("k", "w", "r"), (owner, 1000, 1, 0))
    return Fanout(tuple((call,) for _ in range(n)), Early(n // 2 + 1, lambda r: r[0] == [1, 1]))


def release(n: int, owner: str = "o") -> Fanout:
    call = Call(RELEASE, ("k", "w", "r"), ("release", owner, 0, "id", 1000, "", "1"))
    return Fanout(tuple((call,) for _ in range(n)), cleanup=True)


def counter(m: Master, command: tuple[object, ...]) -> object:
    """Answers every call with how many calls the master ran so far."""
    return len(m.ran)


def test_a_round_reaches_every_master_and_keeps_its_connections(harness: Any) -> None:
    h = harness(3)
    assert h.round(release(3)) == [[[1, 1]]] * 3
    # A new connection is sent the scripts of the round's calls first, then the calls;
    # a later round on it, the calls only.
    assert all(m.scripts == {RELEASE.sha} for m in h.masters)
    assert h.round(release(3)) == [[[1, 1]]] * 3
    assert h.round(Fanout(acquire(3).calls)) == [[[1, 1]]] * 3
    assert all(m.scripts == {RELEASE.sha, ACQUIRE.sha} for m in h.masters)
    assert [m.connects for m in h.masters] == [1, 1, 1]
    assert [len(m.ran) for m in h.masters] == [3, 3, 3]


def test_a_round_decided_early_reads_past_the_replies_it_left(harness: Any) -> None:
    h = harness(3)
    h.round(release(3))  # connects
    assert h.round(acquire(3)) == [[[1, 1]], [[1, 1]], [UNREAD]]  # decided by two
    for m in h.masters:
        m.answer = counter
    # The third master's reply to the acquire is read, and dropped, before this round's.
    assert h.round(release(3)) == [[3], [3], [3]]
    assert [m.connects for m in h.masters] == [1, 1, 1]


def test_a_silent_master_is_waited_for_once_then_failed_at_once_until_it_answers(
    harness: Any,
) -> None:
    h = harness(3)
    h.round(release(3))
    h.masters[2].mode = "silent"
    first = h.round(acquire(3))  # decided without it: not waited for
    assert first[2] == [UNREAD]
    late = h.round(release(3))  # a clean-up waits for every master: once
    assert isinstance(late[2][0], redis.TimeoutError)
    assert h.protocol.masters[2].suspect
    failed = h.round(release(3))
    assert "has not answered" in str(failed[2][0])
    # The clean-ups went out behind the acquire they clean up after, on its connection.
    h.masters[2].speak()
    assert [r[0] for r in h.masters[2].ran] == ["release", "acquire", "release", "release"]
    # It answered: the next round reads what it owed, and it rejoins.
    assert h.round(release(3))[2] == [[1, 1]]
    assert not h.protocol.masters[2].suspect
    assert h.protocol.masters[2].behind == []


def test_a_master_that_answers_slowly_is_sent_the_next_round_on_another_connection(
    harness: Any,
) -> None:
    h = harness(3)
    h.round(release(3))
    h.masters[2].mode = "silent"
    h.round(release(3))  # waited for, in vain: suspect
    h.round(release(3))  # not waited for: queued behind the first, on its connection
    assert h.protocol.masters[2].suspect
    time.sleep(TIMEOUT)  # what the connection still owes is overdue
    h.masters[2].speak(limit=1)  # the first reply comes; the second is on its way
    # It answers, only late: not suspect. Its connection still owes a reply, overdue:
    # the round goes out on a new connection, and is answered there.
    assert h.round(Fanout(acquire(3).calls))[2] == [[1, 1]]
    assert not h.protocol.masters[2].suspect
    assert h.masters[2].connects == 2 and len(h.protocol.masters[2].behind) == 1
    h.masters[2].speak()
    assert h.round(release(3))[2] == [[1, 1]]


def test_a_suspect_is_sent_no_acquire(harness: Any) -> None:
    h = harness(3)
    h.round(release(3))
    h.masters[1].mode = "silent"
    h.round(release(3))
    assert h.protocol.masters[1].suspect
    h.round(acquire(3))
    h.masters[1].speak()
    assert [r[0] for r in h.masters[1].ran] == ["release", "release"]


def test_a_master_that_forgot_the_scripts_is_sent_them_and_the_calls_again(
    harness: Any,
) -> None:
    h = harness(2)
    h.round(release(2))
    h.masters[0].scripts.clear()  # restarted, or SCRIPT FLUSH
    assert h.round(acquire(2)) == [[[1, 1]], [[1, 1]]]
    assert [r[0] for r in h.masters[0].ran] == ["release", "acquire"]


def test_a_script_the_master_will_not_load_fails_with_the_masters_reason(
    harness: Any,
) -> None:
    h = harness(1)
    h.masters[0].refuse_load = "ERR Error compiling script"
    (replies,) = h.round(release(1))
    assert isinstance(replies[0], ResponseError)
    assert "compiling" in str(replies[0])


def test_a_broken_connection_is_given_back_and_the_next_round_connects_afresh(
    harness: Any,
) -> None:
    h = harness(2)
    h.round(release(2))
    h.masters[1].mode = "broken"
    replies = h.round(release(2))
    assert isinstance(replies[1][0], RedisConnectionError)
    assert [c.closed for c in h.masters[1].released] == [True]
    h.masters[1].mode = "ok"
    assert h.round(release(2)) == [[[1, 1]], [[1, 1]]]
    assert h.masters[1].connects == 2


@pytest.mark.parametrize("size", [1, 3])
def test_connections_the_master_closed_while_idle_are_replaced_before_a_round(
    harness: Any, size: int
) -> None:
    h = harness(size)
    h.round(release(size))
    h.masters[0].hang_up()  # a restart, an idle time-out: the kept connection is dead
    h.protocol.masters[0].answered_at -= IDLE_CHECK  # idle that long
    assert h.round(release(size)) == [[[1, 1]]] * size  # replaced: it keeps its vote
    assert h.masters[0].connects == 2
    assert [c.closed for c in h.masters[0].released] == [True]
    assert h.round(release(size)) == [[[1, 1]]] * size
    assert h.masters[0].connects == 2


def test_an_interrupted_round_leaves_its_connections_behind_in_step(harness: Any) -> None:
    h = harness(2)
    for m in h.masters:
        m.answer = counter
    h.round(release(2))
    if h.flavour == "sync":
        h.masters[0].interrupt = ("read", KeyboardInterrupt())
    else:
        h.masters[0].mode = "silent"  # the read waits; then its task is cancelled
    h.cancel_round(release(2), lambda: any(c.held for c in h.masters[0].conns))
    h.masters[0].speak()
    # Nothing was lost or mixed up: the interrupted round's replies are dropped first.
    assert h.round(release(2)) == [[3], [3]]
    assert [m.connects for m in h.masters] == [1, 1]
    assert all(m.released == [] for m in h.masters)


def test_an_interrupted_send_gives_its_connection_back_and_keeps_the_others(
    harness: Any,
) -> None:
    h = harness(3)
    h.round(release(3))
    error: BaseException = KeyboardInterrupt() if h.flavour == "sync" else asyncio.CancelledError()
    h.masters[1].interrupt = ("send", error)
    with pytest.raises(type(error)):
        h.round(release(3))
    assert [c.closed for c in h.masters[1].released] == [True]
    assert h.masters[2].ran == [h.masters[2].ran[0]]  # never sent: still in step
    assert h.round(release(3)) == [[[1, 1]]] * 3
    assert [m.connects for m in h.masters] == [1, 2, 1]


def test_a_master_down_at_connect_fails_and_a_connect_that_timed_out_is_suspect(
    harness: Any,
) -> None:
    h = harness(3)
    h.masters[0].mode = "down"
    replies = h.round(release(3))
    assert isinstance(replies[0][0], redis.TimeoutError)
    assert h.protocol.masters[0].suspect
    h.masters[0].mode = "ok"
    # Rounds fail it at once; a probe (at most every probe interval) finds it answering.
    h.settle(lambda: h.round(release(3))[0] == [[1, 1]])
    assert not h.protocol.masters[0].suspect


def test_the_usual_round_on_one_master_is_one_send_and_one_read(
    harness: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness(1)
    h.round(acquire(1))  # connects: a full round
    rounds: list[object] = []
    steps = FanoutProtocol.steps

    def counted(self: FanoutProtocol, *args: Any) -> Any:
        rounds.append(args)
        return steps(self, *args)

    monkeypatch.setattr(FanoutProtocol, "steps", counted)
    for _ in range(3):
        assert h.round(acquire(1)) == [[[1, 1]]]
    assert rounds == []
    h.masters[0].scripts.clear()  # NOSCRIPT: the call did not run; a full round loads it
    assert h.round(acquire(1)) == [[[1, 1]]]
    assert len(rounds) == 1
    assert [r[0] for r in h.masters[0].ran] == ["acquire"] * 5


def test_closing_gives_every_connection_back(harness: Any) -> None:
    h = harness(3)
    h.round(release(3))
    h.masters[2].mode = "silent"
    h.round(acquire(3))  # the third left behind, owing its reply
    h.close()
    assert [len(m.released) for m in h.masters] == [1, 1, 1]
    assert [c.closed for c in h.masters[2].released] == [True]  # owed: closed
    assert [c.closed for c in h.masters[0].released] == [False]


def test_a_round_sends_to_kept_connections_before_it_connects_the_missing_ones() -> None:
    # The core alone: which I/O a round asks for, in order.
    masters = [Client(SyncPool(Master(i), SyncConn)) for i in range(3)]
    protocol = FanoutProtocol(masters, TIMEOUT, 1.0, packing, redis.TimeoutError)
    protocol.masters[0].idle.append(SyncConn(Master(0)))
    protocol.masters[0].answered_at = 0.0
    steps = protocol.steps(release(3), lambda: 0.0)
    effect = next(steps)
    assert effect[0] == io.SEND and [s[0] for s in effect[1]] == [0]
    effect = steps.send(None)
    assert effect == (io.CONNECT, [1, 2])
    new = [SyncConn(Master(1)), SyncConn(Master(2))]
    effect = steps.send(new)
    assert effect[0] == io.SEND and [s[0] for s in effect[1]] == [1, 2]
    loads = [c for c in effect[1][0][2] if c[0] == "SCRIPT"]
    # The script of the round's call, ahead of it, in the same send: no round trip
    # of its own, and not every script at once.
    assert loads == [("SCRIPT", "LOAD", RELEASE.source)]
    assert effect[1][0][2][-1][0] == "EVALSHA"
    effect = steps.send(None)
    # A kept connection that this protocol did not make is sent the script too.
    assert effect[0] == io.READ and effect[1] == 0 and effect[3] == 2
    effect = steps.send(([RELEASE.sha, [1, 1]], None))
    # The new connection owes the script's reply, read (and dropped) first.
    assert effect[0] == io.READ and effect[1] == 1 and effect[3] == 2
