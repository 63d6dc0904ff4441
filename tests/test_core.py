"""The core, deterministically: a fake clock, an in-memory transport answering like
the masters' scripts (a model of them, which tests/test_lua_model.py checks against the
real scripts on a real server), and the real drivers of both flavours: every scenario
that goes through a driver runs with the sync driver and with the asyncio driver. Slow
rounds, validity running out mid-round, drift, jitter, split votes and their undo, and
the watchdog's verdicts."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import importlib.util
import json
import math
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import fakeredis
import pytest
import redis

from redreentrant._async.driver import AsyncDriver
from redreentrant._async.waker import AsyncWaker
from redreentrant._core import replies as decode
from redreentrant._core.effects import Call, Fanout, Handover, Notify, Pause, Reply, Steps, Wait
from redreentrant._core.engine import Engine
from redreentrant._core.errors import LockLostError, QuorumUnavailableError
from redreentrant._core.holds import Hold, Holds
from redreentrant._core.keys import (
    PREFIX,
    aux_key,
    home_channel,
    key_slot,
    lock_key,
    reserved_key,
    waiters_key,
    wake_channel,
)
from redreentrant._core.kinds import EXCLUSIVE, FAIR, Try
from redreentrant._core.mock import AsyncMockTransport, FakeClock, MockTransport
from redreentrant._core.packing import evalsha_args
from redreentrant._core.quorum import Quorum, decoded, lease_ms, tally_grants, tally_holds
from redreentrant._core.rounds import next_tag
from redreentrant._core.settings import Settings
from redreentrant._core.subscriptions import Subscriptions
from redreentrant._core.turns import COURTESY_MS, GRACE, TENURE, Due
from redreentrant._core.watchdog import (
    RENEW_CHUNK,
    SPREAD,
    RoundTimes,
    WatchdogBase,
    renew_chunk,
    tick_steps,
    verdict_margin,
)
from redreentrant._sync.driver import SyncDriver
from redreentrant._sync.waker import Waker

LEASE = 3.0
#: how long (ms) a woken waiter keeps its place at most (KEEP_MS of lua/release.lua)
KEEP_MS = 1000
#: how far (ms) beyond its own end of a registration a master takes a proposed place
#: (PLACE_SKEW_MS of lua/acquire.lua)
PLACE_SKEW_MS = 1000
DRIFT = LEASE * 0.01 + 0.002


#: when set, a path: every call the model (:class:`Master`) answers, and every change a
#: test makes to its state directly, is written there, a line of JSON per scenario, for
#: tests/test_lua_model.py to replay on a real server running the real scripts
LOG_ENV = "REDREENTRANT_MODEL_LOG"


class Recording:
    """What the model answered in one scenario, in order: each call (its script, keys,
    arguments and reply, the master's state after it, the fake time, and which managers'
    home channels a subscriber hears) and each change a test made to a master's state
    directly. Every change between two events must be one of these: an unrecorded one
    fails the scenario."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.worlds = 0
        #: per master: its state after the last event, to catch unrecorded changes
        self._after: dict[tuple[int, int], dict[str, Any]] = {}

    def event(self, master: Master, kind: str, **fields: Any) -> None:
        where = (master.world, master.index)
        if where in self._after:
            now = master.now()
            assert live(master.raw(), now) == live(self._after[where], now), (
                f"master {master.index} changed without a record before this {kind}: "
                "change the model's state through its methods (hold, set_waiters, ...)"
            )
        self.events.append(
            {"kind": kind, "world": master.world, "master": master.index}
            | {"now": master.clock(), **fields}
        )

    def after(self, master: Master) -> None:
        self._after[(master.world, master.index)] = copy.deepcopy(master.raw())


RECORDING: Recording | None = None


def server_ms(seconds: float) -> int:
    """A time on the fake clock as a server's scripts see theirs: whole milliseconds
    (a float's error, a millionth of a ms, is not a ms less)."""
    return math.floor(seconds * 1000 + 1e-6)


def live(raw: dict[str, Any], now: int) -> dict[str, Any]:
    """What a master stores (:meth:`Master.raw`), the keys past their expiry at ``now``
    (ms) left out, as a server would."""
    expires, waiters_expire = raw["expires"], raw["waiters_expire"]
    hashes = {k: v for k, v in raw["hashes"].items() if v and expires[k] > now}
    zsets = {k: v for k, v in raw["waiters"].items() if v and waiters_expire[k] > now}
    return {
        "hashes": hashes,
        "expires": {k: expires[k] for k in hashes},
        "waiters": zsets,
        "waiters_expire": {k: waiters_expire[k] for k in zsets},
        "reserved": {k: v for k, v in raw["reserved"].items() if v[1] > now},
    }


class Master:
    """One master, answering the plain lock's scripts as lua/acquire.lua, release.lua
    and renew.lua do, step by step, on the fake clock in whole ms as a server's clock:
    a lock hash and its expiry, the sorted set of registered waiters (owner -> end of
    its registration, in ms) and that key's own expiry, and reservations. A key is gone
    from its expiry ms on (as PEXPIREAT has it; a read within that very ms would still
    find it on a server, a tie no replay can set up). ``listening`` says whose home
    channel a subscriber hears (a PUBLISH there reaches someone).

    Tests change its state only through :meth:`hold`, :meth:`set_waiters`,
    :meth:`drop_holds` and :meth:`drop_reservations` (recorded, so that a replay makes
    the same changes: tests/test_lua_model.py)."""

    def __init__(
        self,
        clock: FakeClock,
        listening: Callable[[str], bool],
        index: int = 0,
        world: int = 0,
        managers: Callable[[], list[str]] = list,
    ) -> None:
        self.clock = clock
        self.listening = listening
        self.index = index
        self.world = world
        #: the managers whose home channel a subscriber hears (for the record)
        self.managers = managers
        #: lock hashes (owner -> hold, "<count>:<tag>") and their expiries (ms)
        self.hashes: dict[str, dict[str, str]] = {}
        self.expires: dict[str, int] = {}
        #: registered waiters per waiters key (owner -> end of registration, ms), and
        #: the expiry of each such key (ms)
        self.waiters: dict[str, dict[str, int]] = {}
        self.waiters_expire: dict[str, int] = {}
        #: reservations per key: (owner, expiry ms)
        self.reserved: dict[str, tuple[str, int]] = {}

    def now(self) -> int:
        return server_ms(self.clock())

    def raw(self) -> dict[str, Any]:
        """Everything stored (see :func:`live`)."""
        return {
            "hashes": self.hashes,
            "expires": self.expires,
            "waiters": self.waiters,
            "waiters_expire": self.waiters_expire,
            "reserved": self.reserved,
        }

    def state(self) -> dict[str, Any]:
        """The state as tests/test_lua_model.py reads a server's: each lock hash with
        the ms left of its lease, the registrations not ended in the order a release
        wakes them (each with the ms left of it), each reservation with its ms left."""
        now = self.now()
        return {
            "holds": {
                key: {"fields": dict(self._hash(key)), "ttl": self.expires[key] - now}
                for key in list(self.hashes)
                if self._hash(key)
            },
            "waiting": {
                key: [[owner, self.waiters[key][owner] - now] for owner in live]
                for key in list(self.waiters)
                if (live := self.registered(key))
            },
            "reserved": {
                key: [owner, self.reserved[key][1] - now]
                for key in list(self.reserved)
                if (owner := self.reservation(key)) is not None
            },
        }

    # -- changes a test makes directly (as another client, or time, would) --------------

    def _change(self, kind: str, change: Callable[[], None], **fields: Any) -> None:
        if RECORDING is not None:
            RECORDING.event(self, kind, **fields)
        change()
        if RECORDING is not None:
            RECORDING.after(self)

    def hold(self, key: str, fields: dict[str, int | str], ttl: float) -> None:
        """The lock hash ``key`` is ``fields`` (owner -> hold: a count, or
        "<count>:<tag>") for ``ttl`` seconds."""
        ttl_ms = round(ttl * 1000)
        fields = {owner: str(hold) for owner, hold in fields.items()}

        def change() -> None:
            self.hashes[key] = dict(fields)
            self.expires[key] = self.now() + ttl_ms

        self._change("hold", change, key=key, fields=fields, ttl=ttl_ms)

    def set_waiters(self, key: str, ends: dict[str, float]) -> None:
        """The waiters registered under ``key`` are ``ends`` (owner -> end of its
        registration on the fake clock), and no others; the key lives as long as the
        last of them (as lua/acquire.lua keeps it)."""
        ends_ms = {owner: server_ms(end) for owner, end in ends.items()}

        def change() -> None:
            self._drop_zset(key)
            if ends_ms and max(ends_ms.values()) > self.now():
                self.waiters[key] = dict(ends_ms)
                self.waiters_expire[key] = max(ends_ms.values())

        self._change("waiters", change, key=key, ends=ends_ms)

    def drop_holds(self) -> None:
        """Every lock hash is gone (their leases ran out)."""

        def change() -> None:
            self.hashes.clear()
            self.expires.clear()

        self._change("drop_holds", change)

    def drop_reservations(self) -> None:
        """Every reservation is gone (it ran out)."""
        self._change("drop_reservations", self.reserved.clear)

    # -- what the scripts see -------------------------------------------------------------

    def _hash(self, key: str) -> dict[str, str]:
        """The lock hash ``key`` (empty: no such key)."""
        if key in self.hashes and (not self.hashes[key] or self.now() >= self.expires[key]):
            del self.hashes[key], self.expires[key]
        return self.hashes.get(key, {})

    def _zset(self, key: str) -> dict[str, int]:
        """The sorted set ``key``, ended registrations and all (empty: no such key)."""
        if key in self.waiters and (
            not self.waiters[key] or self.now() >= self.waiters_expire[key]
        ):
            self._drop_zset(key)
        return self.waiters.get(key, {})

    def _drop_zset(self, key: str) -> None:
        self.waiters.pop(key, None)
        self.waiters_expire.pop(key, None)

    def _purge(self, key: str, now: int) -> None:
        """ZREMRANGEBYSCORE key -inf now: the registrations ended."""
        zset = self._zset(key)
        for owner in [o for o, end in zset.items() if end <= now]:
            del zset[owner]
        self._zset(key)

    def _zrem(self, key: str, owner: str) -> None:
        self._zset(key).pop(owner, None)
        self._zset(key)

    def ends(self, key: str) -> dict[str, int]:
        """The registrations not ended under ``key``: owner -> end (ms)."""
        now = self.now()
        return {o: end for o, end in self._zset(key).items() if end > now}

    def registered(self, key: str) -> list[str]:
        """The registrations not ended under ``key``, in the order a release wakes them
        (the one ending first first; ties by owner id, as in a sorted set)."""
        ends = self.ends(key)
        return sorted(ends, key=lambda o: (ends[o], o))

    def reservation(self, key: str) -> str | None:
        """Whom the lock is reserved for, if anyone."""
        owner, end = self.reserved.get(key, ("", 0))
        if owner and self.now() >= end:
            del self.reserved[key]
            return None
        return owner or None

    def pttl(self, key: str) -> int:
        """PTTL of a lock hash: ms left, -2 for no such key."""
        return self.expires[key] - self.now() if self._hash(key) else -2

    # -- the scripts ----------------------------------------------------------------------

    def run(self, call: Call) -> Reply:
        if RECORDING is None:
            return self._run(call)
        RECORDING.event(
            self,
            "call",
            script=call.script.name,
            keys=list(call.keys),
            args=list(call.args),
            listening=sorted(self.managers()),
        )
        reply = self._run(call)
        RECORDING.events[-1].update(reply=reply, state=self.state())
        RECORDING.after(self)
        return reply

    def _run(self, call: Call) -> Reply:
        name, keys, args = call.script.name, call.keys, call.args
        if name == "acquire":
            return self._acquire(keys, args)
        if name == "release":
            return self._release(keys, args)
        if name == "renew":
            out: list[int] = []
            for key, owner, hold in zip(keys, args[1::2], args[2::2], strict=True):
                count, tag = parse_hold(hold)
                mine = tag_in(self._hash(key), str(owner))
                if mine == tag:
                    self.expires[key] = self.now() + int(args[0])
                    out.append(1)
                elif count > 0 and (
                    not self._hash(key)
                    or (mine is not None and mine < tag and len(self._hash(key)) == 1)
                ):
                    self.hashes.setdefault(key, {})[str(owner)] = str(hold)
                    self.expires[key] = self.now() + int(args[0])
                    out.append(2)
                else:
                    out.append(0)
            return [*out, self.now()]
        raise AssertionError(f"unexpected script {name}")

    def _acquire(self, keys: Sequence[str], args: Sequence[Any]) -> Reply:
        """lua/acquire.lua."""
        key, waiters, reserved = keys
        owner, lease, hold, wait = str(args[0]), int(args[1]), str(args[2]), int(args[3])
        count, tag = parse_hold(hold)
        polite = int(args[4]) if len(args) > 4 else 0
        now = self.now()
        free, pttl = False, -2
        mine = tag_in(self._hash(key), owner)
        if count == 1 and mine is None and not self._hash(key):
            holder = self.reservation(reserved)
            if holder is not None and holder != owner:
                pttl = self.reserved[reserved][1] - now
            else:
                free = True
                if polite > 0 and self._zset(waiters):
                    self._purge(waiters, now)
                    ends = self._zset(waiters)
                    for other in sorted(ends, key=lambda o: (ends[o], o))[:2]:
                        if other != owner:
                            free = False
                            pttl = max(1, min(polite, ends[other] - now))
                            break
                if free and holder is not None:
                    del self.reserved[reserved]
        if free or (mine is not None and (mine == tag or (count == 1 and mine < tag))):
            self.hashes.setdefault(key, {})[owner] = hold
            self.expires[key] = now + lease
            # The registration stays until the final release (lua/acquire.lua).
            return [1, count, now]
        if pttl == -2:
            pttl = self.pttl(key)
        if count == 1 and wait > 0 and mine is None:
            self._purge(waiters, now)
            ends_at = now + wait
            place = int(args[5]) if len(args) > 5 else 0
            if now < place <= ends_at + PLACE_SKEW_MS:  # a place proposed, and plausible
                ends_at = place
            zset = self.waiters.setdefault(waiters, {})
            zset.setdefault(owner, ends_at)  # NX: one registered already keeps its place
            self.waiters_expire[waiters] = now + max(1, max(zset.values()) - now)
        return [0, pttl, now]

    def _release(self, keys: Sequence[str], args: Sequence[Any]) -> Reply:
        """lua/release.lua."""
        key, waiters, reserved = keys
        op = args[0]
        if op == "force":
            if not self._hash(key):
                return [0, ""]
            del self.hashes[key], self.expires[key]
            self.reserved.pop(reserved, None)
            return [1, self._wake_next(keys, 0, "", "", 0, False)[0]]
        if op == "abandon":
            owner = str(args[1])
            self._zrem(waiters, owner)
            mine = tag_in(self._hash(key), owner)
            if mine is not None and mine <= (int(args[5]) if len(args) > 5 else 0):
                self._hash(key).pop(owner, None)
            if self.reservation(reserved) == owner:
                del self.reserved[reserved]
            if self._hash(key):
                return [0, ""]
            return [0, self._wake_next(keys, 0, "", "", 0, False)[0]]
        if op == "wake":
            if self._hash(key):
                return [0, ""]
            return [0, self._wake_next(keys, 0, "", "", int(args[4]), False)[0]]
        owner, hold, leave = str(args[1]), str(args[2]), args[6]
        left, tag = parse_hold(hold)
        if leave == "1":
            self._zrem(waiters, owner)
        held = self._hash(key)
        mine = tag_in(held, owner)
        if mine is None or mine > tag or (left > 0 and mine != tag):
            return [-1, ""]
        if left > 0:
            held[owner] = hold
            return [1, ""]
        del held[owner]
        if self._hash(key) or leave == "0":  # an undo wakes no registered waiter
            return [0, "", 0, 0]
        handover, _, handed_tag = str(args[7] if len(args) > 7 else "0").partition(":")
        reserve = int(args[9]) if len(args) > 9 else 0
        defer = len(args) > 8 and args[8] == "1"
        woken, handed, deferred = self._wake_next(
            keys, int(handover), handed_tag, owner.rpartition(":")[0], reserve, defer
        )
        return [0, woken, handed, deferred]

    def _wake_next(
        self,
        keys: Sequence[str],
        handover: int,
        handed_tag: str,
        manager: str,
        reserve: int,
        defer: bool,
    ) -> tuple[str, int, int]:
        """``wake_next`` of lua/release.lua: wake (or hand the lock to) the registered
        waiter whose registration ends first; a woken one keeps its place, its end
        brought forward to KEEP_MS from now at the latest."""
        key, waiters, reserved = keys
        now = self.now()
        if self._zset(waiters):
            if defer:
                return "", 0, 1
            self._purge(waiters, now)
        while ends := self._zset(waiters):
            owner = min(ends, key=lambda o: (ends[o], o))
            if handover > 0 and owner.rpartition(":")[0] == manager:
                self._zrem(waiters, owner)
                self.hashes.setdefault(key, {})[owner] = f"1:{handed_tag}"
                self.expires[key] = now + handover
                return owner, handover, 0
            if self.listening(owner):
                if reserve > 0 and owner.rpartition(":")[0] != manager:
                    self.reserved[reserved] = (owner, now + reserve)
                ends[owner] = min(ends[owner], now + KEEP_MS)  # ZADD XX LT
                return owner, 0, 0
            self._zrem(waiters, owner)  # its manager hears nothing: the next one
        return "", 0, 0


def parse_hold(hold: object) -> tuple[int, int]:
    """A hold "<count>:<tag>" (a bare count: tag 0), as the scripts read it."""
    count, _, tag = str(hold).partition(":")
    return int(count), int(tag or 0)


def tag_in(fields: dict[str, str], owner: str) -> int | None:
    """The tag of ``owner``'s hold in a lock hash, or None."""
    hold = fields.get(owner)
    return None if hold is None else parse_hold(hold)[1]


class Hub:
    """Wake-ups on the fake clock: a wait lasts its whole time-out (nobody releases),
    unless ``wakes`` says it ends with a wake-up (then it returns at once, or after its
    whole time-out if ``slow``); every call is recorded."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.waits: list[float] = []
        self.pauses: list[float] = []
        self.watches: list[tuple[str, str, bool, bool]] = []
        self.notices: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
        self.relays: list[tuple[str, str]] = []
        #: the waiters handed the lock over to (as a hub hears it)
        self.handed_over: dict[str, Handover] = {}
        #: per notice: whether every local waiter was to be woken
        self.everyone: list[bool] = []
        #: how many of the next waits end with a wake-up
        self.wakes = 0
        self.slow = False
        #: called at the start of every wait
        self.on_wait: Callable[[], None] = lambda: None

    def watch(
        self, channel: str, owner: str, broadcast: bool = False, targeted: bool = False
    ) -> int:
        self.watches.append((channel, owner, broadcast, targeted))
        return 0

    def unwatch(self, channel: str, owner: str) -> None:
        pass

    def wait(self, channel: str, owner: str, generation: int, timeout: float) -> int:
        self.on_wait()
        self.waits.append(timeout)
        if self.wakes:
            self.wakes -= 1
            if self.slow:
                self.clock.advance(timeout)
            return generation + 1
        self.clock.advance(timeout)
        return generation

    def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.clock.advance(seconds)

    def notify(self, notice: Notify) -> None:
        self.notices.append((notice.channels, notice.woken))
        self.handed_over.update(notice.handovers)
        self.everyone.append(notice.everyone)

    def handed(self, channel: str, owner: str) -> Handover | None:
        return self.handed_over.pop(owner, None)

    def relay(self, channel: str, owner: str) -> None:
        self.relays.append((channel, owner))

    def close(self) -> None:
        pass


class AsyncHub:
    """A :class:`Hub` as the asyncio driver awaits it: the same records and fake-clock
    waits, each wait and pause a suspension on the event loop."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    async def watch(
        self, channel: str, owner: str, broadcast: bool = False, targeted: bool = False
    ) -> int:
        return self.hub.watch(channel, owner, broadcast, targeted)

    def unwatch(self, channel: str, owner: str) -> None:
        self.hub.unwatch(channel, owner)

    async def wait(self, channel: str, owner: str, generation: int, timeout: float) -> int:
        await asyncio.sleep(0)
        return self.hub.wait(channel, owner, generation, timeout)

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(0)
        self.hub.pause(seconds)

    def notify(self, notice: Notify) -> None:
        self.hub.notify(notice)

    def handed(self, channel: str, owner: str) -> Handover | None:
        return self.hub.handed(channel, owner)

    def relay(self, channel: str, owner: str) -> None:
        self.hub.relay(channel, owner)

    async def close(self) -> None:
        self.hub.close()


class FakeTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose time is the fake clock: its timers (the asyncio waker's)
    are due when the fake clock says so, never by real time passing."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.fake_clock = clock

    def time(self) -> float:
        return self.fake_clock()


#: the flavours whose drivers a :class:`World` runs the core with
FLAVOURS = ["sync", "asyncio"]


class World:
    """Five masters, a fake clock and an engine driven by a flavour's real driver: the
    sync driver, or the asyncio driver on an event loop of the world's own."""

    def __init__(
        self,
        size: int = 5,
        uniform: Callable[[float, float], float] | None = None,
        flavour: str = "sync",
    ):
        self.flavour = flavour
        self.clock = FakeClock()
        #: the managers whose home channel a subscriber hears
        self.listening = {"m-other"}
        number = 0
        if RECORDING is not None:
            RECORDING.worlds += 1
            number = RECORDING.worlds
        self.masters = [
            Master(self.clock, self.is_listening, i, number, lambda: list(self.listening))
            for i in range(size)
        ]
        if RECORDING is not None:
            for m in self.masters:
                RECORDING.after(m)
        #: per master: an exception to answer with instead (a failure, a time-out)
        self.failing: dict[int, BaseException] = {}
        #: seconds each round takes (the clock moves during the round)
        self.round_time = 0.01
        #: called before a master answers a call
        self.on_call: Callable[[int, Call], None] = lambda master, call: None
        self.hub = Hub(self.clock)
        self.uniforms: list[tuple[float, float]] = []

        def pick(a: float, b: float) -> float:
            self.uniforms.append((a, b))
            return b if uniform is None else uniform(a, b)

        settings = Settings.check(LEASE, 0.01, 0.2, 0.05, None)
        self.engine = Engine(
            settings,
            [f"m{i}" for i in range(size)],
            lambda: "t1",
            threading.Lock,
            self.clock,
            pick,
            wall=self.clock,
        )
        self.transport: MockTransport | AsyncMockTransport
        if flavour == "sync":
            self.transport = MockTransport(self.answer)
            self.driver: SyncDriver | AsyncDriver = SyncDriver(
                self.transport, self.hub, self.engine.check_open
            )
            #: how a waiting owner is interrupted: Ctrl-C in its thread...
            self.interruption: type[BaseException] = KeyboardInterrupt
        else:
            self.loop = FakeTimeLoop(self.clock)
            self.transport = AsyncMockTransport(self.answer)
            self.driver = AsyncDriver(self.transport, AsyncHub(self.hub), self.engine.check_open)
            self.interruption = asyncio.CancelledError  # ... or its task cancelled

    def close(self) -> None:
        if self.flavour == "asyncio" and not self.loop.is_closed():
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.wait(pending))
            self.loop.close()

    def is_listening(self, owner: str) -> bool:
        return owner.rsplit(":", 1)[0] in self.listening

    def answer(self, master: int, call: Call) -> Reply:
        if master == 0:
            self.clock.advance(self.round_time)  # once per round: the round's duration
        if master in self.failing:
            return self.failing[master]
        self.on_call(master, call)
        return self.masters[master].run(call)

    def run(self, steps: Steps[Any]) -> Any:
        """Run ``steps`` to their end with the flavour's driver."""
        if isinstance(self.driver, SyncDriver):
            return self.driver.run(steps)
        return self.loop.run_until_complete(self.driver.run(steps))

    def waker(self) -> Callable[[], None]:
        """The flavour's sender of deferred wake-ups, armed by the engine; a function
        that stops it (as its manager closes)."""
        if isinstance(self.driver, SyncDriver):
            waker = Waker(self.engine, self.run)
            self.engine.on_deferred_wake = waker.arm
            return waker.stop
        async_waker = AsyncWaker(self.engine, self.driver.run)
        self.engine.on_deferred_wake = async_waker.arm
        return lambda: self.loop.run_until_complete(async_waker.stop())

    def acquire(self, blocking: bool = False, timeout: float = -1) -> bool:
        owner = self.engine.owner_id()
        steps = self.engine.acquire(EXCLUSIVE, "x", owner, blocking, timeout, None)
        return bool(self.run(steps))

    def hold(self) -> Hold | None:
        return self.engine.hold(EXCLUSIVE, "x")

    def scripts(self, round_index: int) -> set[str]:
        return {c.script.name for per in self.transport.rounds[round_index] for c in per}

    def take_elsewhere(self, masters: Iterable[int], ttl: float = 2.0) -> None:
        for i in masters:
            self.masters[i].hold(lock_key("x"), {"someone-else": 1}, ttl)


class Worlds(Protocol):
    """Makes :class:`World` s of one flavour (the ``world`` fixture)."""

    def __call__(
        self, size: int = 5, uniform: Callable[[float, float], float] | None = None
    ) -> World: ...


@pytest.fixture(params=FLAVOURS)
def world(request: pytest.FixtureRequest) -> Iterator[Worlds]:
    """Worlds of the flavour under test: every scenario that goes through a driver runs
    with the sync driver and with the asyncio driver."""
    made: list[World] = []

    def make(size: int = 5, uniform: Callable[[float, float], float] | None = None) -> World:
        made.append(World(size, uniform, request.param))
        return made[-1]

    yield make
    for w in made:
        w.close()


@pytest.fixture(autouse=True)
def _recording(request: pytest.FixtureRequest) -> Iterator[None]:
    """With ``$REDREENTRANT_MODEL_LOG`` set, the scenario's record is added there."""
    global RECORDING
    path = os.environ.get(LOG_ENV)
    if not path:
        yield
        return
    RECORDING = Recording()
    try:
        yield
    finally:
        recording, RECORDING = RECORDING, None
        if recording.events:
            line = {"scenario": request.node.nodeid, "events": recording.events}
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")


def test_validity_is_the_lease_less_the_round_and_the_drift(world: Worlds) -> None:
    w = world()
    w.round_time = 0.25
    started = w.clock()
    assert w.acquire()
    hold = w.hold()
    assert hold is not None
    assert hold.valid_until == pytest.approx(started + LEASE - DRIFT)
    assert w.engine.remaining(hold) == pytest.approx(LEASE - 0.25 - DRIFT)


def test_validity_that_runs_out_mid_round_is_no_grant_and_is_undone_everywhere(
    world: Worlds,
) -> None:
    w = world()
    w.round_time = LEASE  # every master granted, but the validity is spent
    assert not w.acquire()
    assert w.hold() is None
    assert w.scripts(1) == {"release"} and all(w.transport.rounds[1])  # undo on all five
    assert all(not m._hash(lock_key("x")) for m in w.masters)


def test_a_round_slower_than_the_lease_never_grants_however_long_one_waits(world: Worlds) -> None:
    w = world()
    w.round_time = LEASE + 0.5
    assert not w.acquire(blocking=True, timeout=4 * LEASE)
    grants = [r for r in range(len(w.transport.rounds)) if w.scripts(r) == {"acquire"}]
    assert len(grants) >= 2  # it kept trying, and every try was undone
    for r in grants:
        assert w.scripts(r + 1) == {"release"}
    assert w.hold() is None


def test_a_split_vote_is_undone_everywhere_and_backs_off_for_a_bounded_time(world: Worlds) -> None:
    w = world()
    w.take_elsewhere([2, 3, 4], ttl=60.0)  # two grants of five: a split
    assert not w.acquire(blocking=True, timeout=3.0)
    splits = [r for r in range(len(w.transport.rounds)) if w.scripts(r) == {"acquire"}]
    assert len(splits) >= 5
    for r in splits:
        assert w.scripts(r + 1) == {"release"} and all(w.transport.rounds[r + 1])
    # A real pause after each split (no release cuts it short), its bound doubling once
    # from retry_jitter, then staying there.
    bounds = [b for _, b in w.uniforms]
    assert bounds[:5] == [0.05, 0.1, 0.1, 0.1, 0.1]
    assert w.hub.pauses and not w.hub.waits
    assert all(not m._hash(lock_key("x")).get(w.engine.owner_id()) for m in w.masters)


def test_a_refused_waiter_sleeps_no_longer_than_the_holders_ttl(world: Worlds) -> None:
    w = world()
    w.take_elsewhere([0, 1, 2, 3, 4], ttl=1.5)
    assert w.acquire(blocking=True, timeout=10)  # granted once the holder's lease ended
    assert w.hub.waits and max(w.hub.waits) <= 1.5 + 0.002


# -- waiters registered on the masters (the plain lock) ---------------------------------------


def waiters_of(w: World) -> list[list[str]]:
    """Per master: the waiters registered for lock ``x``, in the order a release wakes
    them (a woken waiter among them: it keeps its place, see :func:`woken`)."""
    return [m.registered(waiters_key("x")) for m in w.masters]


def woken(m: Master, owner: str) -> bool:
    """``owner`` was woken on ``m`` (lock ``x``): it keeps its place, but for KEEP_MS
    from its wake-up at most (lua/release.lua), not to the end of its registration."""
    end = m.ends(waiters_key("x")).get(owner)
    return end is not None and end <= m.now() + KEEP_MS


def test_a_refused_waiter_registers_on_the_masters_and_subscribes_no_lock_channel(
    world: Worlds,
) -> None:
    w = world()
    owner = w.engine.owner_id()
    w.take_elsewhere(range(5), ttl=1.5)
    seen: list[list[list[str]]] = []
    w.hub.on_wait = lambda: seen.append(waiters_of(w))
    assert w.acquire(blocking=True, timeout=10)
    # One watch, targeted: its wake-ups come by name on the manager's home channel.
    assert w.hub.watches == [(wake_channel("x"), owner, False, True)]
    first = w.transport.rounds[0][0][0]
    assert first.script.name == "acquire" and first.args[3] == lease_ms(LEASE)
    assert seen and all(per == [[owner]] * 5 for per in seen)  # registered while it waits
    # The registration stays while it holds (a split vote's undo keeps its place), and
    # its release ends it.
    assert waiters_of(w) == [[owner]] * 5
    w.run(w.engine.release(EXCLUSIVE, "x", owner, False))
    assert waiters_of(w) == [[]] * 5


def test_a_waiter_that_gives_up_takes_its_registration_back(world: Worlds) -> None:
    w = world()
    w.take_elsewhere(range(5), ttl=60.0)
    assert not w.acquire(blocking=True, timeout=1.0)
    last = w.transport.rounds[-1]
    assert all(per[0].script.name == "release" and per[0].args[0] == "abandon" for per in last)
    assert waiters_of(w) == [[]] * 5
    assert w.hub.relays == []  # it was never woken: nothing to pass on


def test_a_try_that_cannot_wait_neither_registers_nor_takes_anything_back(world: Worlds) -> None:
    w = world()
    w.take_elsewhere(range(5), ttl=60.0)
    assert not w.acquire()
    assert len(w.transport.rounds) == 1 and w.transport.rounds[0][0][0].args[3] == 0
    assert w.hub.watches == [] and waiters_of(w) == [[]] * 5


def test_a_release_tells_the_hub_which_waiter_the_masters_woke(world: Worlds) -> None:
    w = world()
    assert w.acquire()
    w.clock.advance(TENURE * 1.1)  # the turn is over: the release wakes (see the turns below)
    for m in w.masters:
        # A waiter whose manager hears nothing (it died) is skipped for the next one.
        m.set_waiters(waiters_key("x"), {"gone:t1": w.clock() + 5, "m-other:t7": w.clock() + 6})
    w.run(w.engine.release(EXCLUSIVE, "x", w.engine.owner_id(), False))
    assert w.hub.notices == [((wake_channel("x"),), ("m-other:t7",))]
    # The dead one's registration is gone; the woken one keeps its place for a while.
    assert waiters_of(w) == [["m-other:t7"]] * 5
    assert all(woken(m, "m-other:t7") for m in w.masters)


def test_force_unlock_wakes_one_registered_waiter(world: Worlds) -> None:
    w = world()
    w.take_elsewhere(range(5))
    for m in w.masters:
        m.set_waiters(waiters_key("x"), {"m-other:t7": w.clock() + 5, "m-other:t8": w.clock() + 6})
    assert w.run(w.engine.force_unlock_families((EXCLUSIVE,), "x")) is True
    assert w.hub.notices == [((wake_channel("x"),), ("m-other:t7",))]
    assert waiters_of(w) == [["m-other:t7", "m-other:t8"]] * 5
    assert all(woken(m, "m-other:t7") and not woken(m, "m-other:t8") for m in w.masters)


@pytest.mark.parametrize("lock_free_on_abandon", [False, True])
def test_a_woken_waiter_that_gives_up_relays_here_only_if_the_masters_woke_nobody(
    lock_free_on_abandon: bool, world: Worlds
) -> None:
    w = world()
    owner = w.engine.owner_id()
    w.take_elsewhere(range(5), ttl=60.0)
    for m in w.masters:
        m.set_waiters(waiters_key("x"), {"m-other:t7": w.clock() + 30})
    w.hub.wakes, w.hub.slow = 1, True  # woken as its time runs out

    def on_call(master: int, call: Call) -> None:
        if lock_free_on_abandon and call.args[0] == "abandon":
            w.masters[master].drop_holds()  # the holder's lease ran out meanwhile

    w.on_call = on_call
    assert not w.acquire(blocking=True, timeout=1.0)
    if lock_free_on_abandon:
        # The masters passed the wake-up on to the next registered waiter.
        assert w.hub.relays == [] and waiters_of(w) == [["m-other:t7"]] * 5
        assert all(woken(m, "m-other:t7") for m in w.masters)
    else:
        assert w.hub.relays == [(wake_channel("x"), owner)]
        assert waiters_of(w) == [["m-other:t7"]] * 5
        assert not any(woken(m, "m-other:t7") for m in w.masters)


# -- hand-over on one master ---------------------------------------------------------------


def test_a_release_on_one_master_hands_the_lock_to_its_managers_next_waiter(world: Worlds) -> None:
    w = world(size=1)
    w.listening.add(w.engine.id)
    waiter = f"{w.engine.id}:t2"
    assert w.acquire()
    w.masters[0].set_waiters(waiters_key("x"), {waiter: w.clock() + 10.0})
    w.clock.advance(TENURE * 1.1)  # the manager's turn is over (see .turns)
    started = w.clock()
    w.run(w.engine.release(EXCLUSIVE, "x", w.engine.owner_id(), False))
    # Granted to the waiter in the release's own call, and told to it with the lease and
    # a moment before the grant.
    handed = w.hub.handed_over[waiter]
    assert w.masters[0]._hash(lock_key("x")) == {waiter: f"1:{handed.tag}"}
    assert w.hub.notices[-1] == ((wake_channel("x"),), (waiter,))
    assert handed == Handover(lease_ms(LEASE), frozenset({0}), started, handed.tag)
    # The hand-over's hold has a tag of its own, later than the releasing hold's.
    assert handed.tag > 0


def test_a_release_whose_reply_is_lost_wakes_every_local_waiter(world: Worlds) -> None:
    w = world(size=1)
    armed: list[float] = []
    w.engine.on_deferred_wake = armed.append
    assert w.acquire()
    w.failing[0] = redis.TimeoutError("no reply")  # the master may have handed it over
    with pytest.raises(QuorumUnavailableError):
        w.run(w.engine.release(EXCLUSIVE, "x", w.engine.owner_id(), False))
    assert w.hub.everyone == [True] and not w.hub.handed_over
    # Early in the turn, the master may also have deferred the wake-up: it is sent.
    assert len(armed) == 1


def test_a_release_on_several_masters_only_wakes(world: Worlds) -> None:
    w = world()
    w.listening.add(w.engine.id)
    waiter = f"{w.engine.id}:t2"
    assert w.acquire()
    w.clock.advance(TENURE * 1.1)  # the turn is over
    for m in w.masters:
        m.set_waiters(waiters_key("x"), {waiter: w.clock() + 10.0})
    w.run(w.engine.release(EXCLUSIVE, "x", w.engine.owner_id(), False))
    assert all(not m._hash(lock_key("x")) for m in w.masters)  # free everywhere
    assert w.hub.notices[-1] == ((wake_channel("x"),), (waiter,)) and not w.hub.handed_over


# -- turns ---------------------------------------------------------------


def contended(world: Worlds, size: int = 1) -> tuple[World, str, list[float]]:
    """A world whose lock ``x`` has a registered waiter of another manager (its home
    channel heard), with rounds much shorter than a turn; and the deferral times the
    engine asked its timer for."""
    w = world(size=size)
    w.round_time = TENURE / 50
    armed: list[float] = []
    w.engine.on_deferred_wake = armed.append
    other = "m-other:t9"
    for m in w.masters:
        m.set_waiters(waiters_key("x"), {other: w.clock() + 10.0})
    return w, other, armed


def release(w: World) -> None:
    w.run(w.engine.release(EXCLUSIVE, "x", w.engine.owner_id(), False))


def test_a_release_early_in_a_turn_defers_its_wake_up_and_a_quick_retake_keeps_the_turn(
    world: Worlds,
) -> None:
    w, other, armed = contended(world)
    assert w.acquire()
    release(w)
    # Free, but the other manager's waiter was not woken: it keeps its place.
    assert not w.masters[0]._hash(lock_key("x"))
    assert w.masters[0].registered(waiters_key("x")) == [other]
    assert not woken(w.masters[0], other)
    assert armed == [pytest.approx(w.clock() + GRACE)]
    assert w.acquire()  # taken again within the grace: the turn goes on
    w.clock.advance(GRACE)
    assert w.engine.turns.due() == ([], None)  # nothing left to send


def test_a_deferred_wake_up_is_sent_once_its_grace_passed_and_reserves_the_lock(
    world: Worlds,
) -> None:
    w, other, armed = contended(world)
    assert w.acquire()
    release(w)
    w.clock.advance(GRACE / 2)
    assert w.engine.turns.due() == ([], armed[0])  # not yet
    w.clock.advance(GRACE)
    due, later = w.engine.turns.due()
    assert due == [Due(EXCLUSIVE, "x")] and later is None
    w.run(w.engine.send_wakes(due))
    assert w.masters[0].registered(waiters_key("x")) == [other]  # it keeps its place...
    assert woken(w.masters[0], other)  # ... woken
    assert w.masters[0].reservation(reserved_key("x")) == other
    assert not w.acquire()  # reserved for the woken waiter


def test_a_release_once_the_turn_is_over_wakes_the_next_waiter_with_a_reservation(
    world: Worlds,
) -> None:
    w, other, armed = contended(world)
    assert w.acquire()
    w.clock.advance(TENURE * 1.1)
    release(w)
    assert armed == [] and w.hub.notices[-1][1] == (other,)
    assert w.masters[0].reservation(reserved_key("x")) == other
    assert not w.acquire()  # the releasing owner coming back is refused
    # A later grant begins a new turn: its first release defers again.
    w.masters[0].drop_reservations()
    assert w.acquire()
    w.masters[0].set_waiters(waiters_key("x"), {other: w.clock() + 10.0})
    release(w)
    assert len(armed) == 1


def test_on_several_masters_a_release_early_in_a_turn_defers_and_nothing_is_reserved(
    world: Worlds,
) -> None:
    w, other, armed = contended(world, size=5)
    assert w.acquire()
    release(w)
    assert armed == [pytest.approx(w.clock() + GRACE)] and w.hub.notices == []
    assert all(m.registered(waiters_key("x")) == [other] for m in w.masters)
    assert not any(woken(m, other) for m in w.masters)  # asleep
    w.clock.advance(GRACE * 1.5)
    due, _ = w.engine.turns.due()
    w.run(w.engine.send_wakes(due))
    assert all(m.registered(waiters_key("x")) == [other] for m in w.masters)
    assert all(woken(m, other) for m in w.masters)
    assert all(not m.reserved for m in w.masters)  # masters could reserve for different ones
    assert w.acquire()  # the owner may still take it: the waiter may be gone


def test_on_several_masters_the_owner_lets_the_waiter_woken_at_its_turns_end_go_first(
    world: Worlds,
) -> None:
    w, other, armed = contended(world, size=5)
    assert w.acquire()
    w.clock.advance(TENURE * 1.1)
    release(w)
    assert armed == [] and w.hub.notices[-1][1] == (other,)
    assert all(not m.reserved for m in w.masters)
    # The releasing owner's next try is polite: refused although the lock is free, while
    # the woken waiter keeps its place, however long that waiter takes to come; the
    # owner registers too, and waits no longer than the courtesy.
    me = w.engine.owner_id()
    seen: list[list[tuple[set[str], bool]]] = []

    def waiter_comes() -> None:
        if not seen:
            assert all(not m._hash(lock_key("x")) for m in w.masters)  # still free
            seen.append([(set(m.registered(waiters_key("x"))), woken(m, other)) for m in w.masters])
            for m in w.masters:
                granted = m.run(EXCLUSIVE.acquire(Try("x", other, lease_ms(LEASE), "1:1", 0)))
                assert isinstance(granted, list) and granted[:2] == [1, 1]

    w.hub.on_wait = waiter_comes
    assert not w.acquire(blocking=True, timeout=COURTESY_MS / 1000 + 0.1)
    assert seen == [[({me, other}, True)] * 5]  # registered; the woken one keeps its place
    assert w.hub.pauses == [] and w.hub.waits[0] == pytest.approx(COURTESY_MS / 1000 + 0.001)
    # Once only: when the lock is free again, the owner's next acquire is a plain one.
    for m in w.masters:
        m.run(EXCLUSIVE.release("x", other, "0:1", "r1"))
    w.hub.on_wait = lambda: None
    assert w.acquire(blocking=True, timeout=1.0)
    assert [c.args[4] for per in w.transport.rounds[-1] for c in per] == [0] * 5


def test_a_polite_try_that_no_woken_waiter_answers_waits_the_courtesy_then_takes_the_lock(
    world: Worlds,
) -> None:
    w, other, _ = contended(world, size=5)
    assert w.acquire()
    w.clock.advance(TENURE * 1.1)
    release(w)
    w.hub.waits.clear()
    me = w.engine.owner_id()
    # The woken waiter never comes: the owner's polite try is refused, it waits the
    # courtesy, and its next (plain) try takes the free lock.
    assert w.acquire(blocking=True, timeout=10.0)
    assert w.hub.waits == [pytest.approx(COURTESY_MS / 1000 + 0.001, abs=0.002)]
    release(w)
    # Its own place ended; the woken waiter's is kept (KEEP_MS from its wake-up).
    assert all(m.registered(waiters_key("x")) == [other] for m in w.masters)
    assert all(woken(m, other) for m in w.masters) and me != other


def test_on_several_masters_a_turn_ended_by_a_deferred_wake_up_is_courteous_too(
    world: Worlds,
) -> None:
    # The owner did not come back within the grace, so its manager sent the wake-up: the
    # owner's next acquire lets the waiter woken go first, as after a release that woke
    # it (the waiter never comes here: the owner waits the courtesy, then takes it).
    w, other, _ = contended(world, size=5)
    assert w.acquire()
    release(w)
    w.clock.advance(GRACE * 1.5)
    due, _ = w.engine.turns.due()
    w.run(w.engine.send_wakes(due))
    assert waiters_of(w) == [[other]] * 5 and all(woken(m, other) for m in w.masters)
    w.hub.waits.clear()
    rounds = len(w.transport.rounds)
    assert w.acquire(blocking=True, timeout=10.0)
    first = w.transport.rounds[rounds]
    assert [c.args[4] for per in first for c in per] == [COURTESY_MS] * 5  # polite
    assert w.hub.waits == [pytest.approx(COURTESY_MS / 1000 + 0.001, abs=0.002)]


def test_an_owner_back_while_its_deferred_wake_up_is_sent_owes_no_courtesy_later(
    world: Worlds,
) -> None:
    # The manager's timer decided to send the wake-up just as the owner came back and
    # took the lock again: the owner holds it, its turn goes on, and a later acquire of
    # it is a plain one (a courtesy left over would have it refused, its turn lost).
    w, _, _ = contended(world, size=5)
    assert w.acquire()
    release(w)
    w.clock.advance(GRACE * 1.5)
    due: list[list[Due]] = []

    def timer_fires(master: int, call: Call) -> None:
        if not due:
            due.append(w.engine.turns.due()[0])

    w.on_call = timer_fires
    assert w.acquire()  # back: its try went out as the timer fired
    w.on_call = lambda master, call: None
    w.run(w.engine.send_wakes(due[0]))  # held there: it wakes nobody
    release(w)
    w.hub.waits.clear()
    rounds = len(w.transport.rounds)
    assert w.acquire(blocking=True, timeout=10.0)
    assert [c.args[4] for per in w.transport.rounds[rounds] for c in per] == [0] * 5
    assert w.hub.waits == []


def test_every_try_of_an_acquire_proposes_the_same_place_to_every_master(world: Worlds) -> None:
    # So that the masters order their waiters alike, whatever order the tries reach
    # them in (lua/acquire.lua): the place ends a wait after the first try began.
    w = world()
    w.take_elsewhere(range(5), ttl=0.5)
    began = w.clock()
    assert w.acquire(blocking=True, timeout=10)
    tries = [
        [c.args[5] for per in r for c in per]
        for r in w.transport.rounds
        if r[0][0].script.name == "acquire"
    ]
    place = int(began * 1000) + lease_ms(LEASE)
    assert len(tries) >= 2 and all(t == [place] * 5 for t in tries)


@pytest.mark.parametrize("size", [5, 1])
def test_a_waiter_renews_its_registration_when_its_place_ends_not_a_wait_later(
    size: int, world: Worlds
) -> None:
    # The place proposed at the first try ends a lease after it; a later try keeps it
    # (the masters keep the first registration). The waiter must try again when that
    # place ends, not a whole wait after its latest try: in between it would be
    # registered nowhere, and a release would wake the others, never it. One master is
    # proposed no place, but keeps its first registration alike.
    w = world(size)
    w.round_time = 1.0
    w.take_elsewhere(range(size), ttl=10.0)
    w.hub.wakes = 1  # the first wait ends at once, with a wake-up the others took
    assert w.acquire(blocking=True, timeout=-1)
    # First try: [0, 1] s, its place ends at 3 s. Second try: [1, 2] s: one second left.
    assert w.hub.waits[:2] == [pytest.approx(LEASE - 1.0), pytest.approx(LEASE - 2.0)]


def test_on_one_master_no_place_is_proposed_and_each_try_has_a_tag_of_its_own(
    world: Worlds,
) -> None:
    # One master orders its waiters by itself: no place is proposed. Each try's hold has
    # a tag greater than every one before (nothing sent for it changes a later hold).
    w = world(1)
    for _ in range(2):
        assert w.acquire(blocking=True, timeout=10)
        w.run(w.engine.release(EXCLUSIVE, "x", w.engine.owner_id(), False))
        w.clock.advance(0.5)
    acquires = [r[0][0] for r in w.transport.rounds if r[0][0].script.name == "acquire"]
    assert len(acquires) == 2 and len(acquires[0].args) < 6  # no place
    first, second = (parse_hold(call.args[2]) for call in acquires)
    assert first[0] == second[0] == 1 and first[1] < second[1]


def test_a_deferred_wake_up_and_a_force_unlock_name_their_manager_in_their_release_id(
    world: Worlds,
) -> None:
    # A manager counts each wake-up once per release id: ids that two processes could
    # both make (their counts are their own) would drop one's wake-up as a repeat of
    # the other's, and leave its waiter asleep, its place on the masters taken.
    w, _, _ = contended(world)
    assert w.acquire()
    release(w)
    w.clock.advance(GRACE * 1.5)
    due, _ = w.engine.turns.due()
    w.run(w.engine.send_wakes(due))
    w.run(w.engine.force_unlock_families((EXCLUSIVE,), "x"))
    wake, force = (w.transport.rounds[i][0][0] for i in (-2, -1))
    assert wake.args[0] == "wake" and force.args[0] == "force"
    for call in (wake, force):
        assert str(call.args[2]).startswith(f"{w.engine.id}:"), call.args


def test_the_waker_stopping_sends_the_wake_ups_still_deferred(world: Worlds) -> None:
    w, other, _ = contended(world)
    stop = w.waker()
    assert w.acquire()
    release(w)  # deferred; the fake clock never lets the grace pass
    assert w.masters[0].registered(waiters_key("x")) == [other]
    assert not woken(w.masters[0], other)
    stop()  # as the manager closes, after its last runs ended
    assert w.masters[0].registered(waiters_key("x")) == [other]  # it keeps its place...
    assert woken(w.masters[0], other)  # ... woken
    assert w.masters[0].reservation(reserved_key("x")) == other


def test_a_closing_manager_takes_every_deferred_wake_up_to_send_at_once(world: Worlds) -> None:
    w, _, _ = contended(world)
    assert w.acquire()
    release(w)
    assert w.engine.turns.flush() == [Due(EXCLUSIVE, "x")]
    assert w.engine.turns.due() == ([], None)


def handed_to(w: World, lease: int, since: float | None = None) -> Callable[[], None]:
    """A wait during which a release of the lock, which went out at ``since`` (default:
    as the wait begins), hands it over to the waiter."""

    def on_wait() -> None:
        owner = w.engine.owner_id()
        w.masters[0].hold(lock_key("x"), {owner: 1}, lease / 1000)
        sent = w.clock() if since is None else since
        w.hub.handed_over[owner] = Handover(lease, frozenset({0}), sent)
        w.hub.wakes = 1
        w.hub.on_wait = lambda: None

    return on_wait


def test_a_waiter_handed_the_lock_holds_it_without_a_round_of_its_own(world: Worlds) -> None:
    w = world(size=1)
    w.take_elsewhere([0], ttl=20.0)
    released: list[float] = []
    hand = handed_to(w, lease_ms(LEASE))

    def on_wait() -> None:
        released.append(w.clock())
        hand()

    w.hub.on_wait = on_wait
    assert w.acquire(blocking=True, timeout=10)
    assert len(w.transport.rounds) == 1  # the refused try only
    hold = w.hold()
    # Valid from when the release went out (before the grant), less the drift.
    assert hold is not None and hold.valid_until == pytest.approx(released[0] + LEASE - DRIFT)


def test_a_hand_over_told_late_is_not_taken_for_a_later_acquire(world: Worlds) -> None:
    w = world(size=1)
    w.take_elsewhere([0], ttl=20.0)
    owner = w.engine.owner_id()
    before = w.clock() - 0.001  # a release that went out before this acquire began

    def on_wait() -> None:
        # Told only now, and meant for an earlier acquire of this owner: the lock is
        # someone else's (the earlier acquire's hold was given back long ago).
        w.hub.handed_over[owner] = Handover(lease_ms(LEASE), frozenset({0}), before)
        w.hub.wakes = 1
        w.hub.on_wait = lambda: None

    w.hub.on_wait = on_wait
    assert not w.acquire(blocking=True, timeout=0.5)
    assert len(w.transport.rounds) >= 2 and w.hold() is None  # it asked the master


def test_a_lock_handed_over_with_another_lease_is_taken_by_a_try(world: Worlds) -> None:
    w = world(size=1)
    w.take_elsewhere([0], ttl=20.0)
    w.hub.on_wait = handed_to(w, lease_ms(LEASE) + 1000)
    assert w.acquire(blocking=True, timeout=10)
    assert len(w.transport.rounds) == 2  # the handed lock is confirmed by its own round
    assert w.masters[0].pttl(lock_key("x")) == pytest.approx(LEASE * 1000, abs=20)


def test_a_waiter_giving_up_after_a_hand_over_gives_the_lock_back(world: Worlds) -> None:
    w = world(size=1)
    w.take_elsewhere([0], ttl=20.0)
    owner = w.engine.owner_id()
    steps = w.engine.acquire(EXCLUSIVE, "x", owner, True, 10, None)
    with pytest.raises(w.interruption):
        w.run(interrupt_at_wait(steps, handed_to(w, lease_ms(LEASE)), w.interruption))
    assert not w.masters[0]._hash(lock_key("x"))  # the abandon took it back


def interrupt_at_wait(
    steps: Steps[bool], before: Callable[[], None], interruption: type[BaseException]
) -> Steps[bool]:
    """``steps``, with ``before()`` and then ``interruption`` at its first wait."""
    effect = next(steps)
    while True:
        if isinstance(effect, Wait):
            before()
            effect = steps.throw(interruption())
        else:
            result = yield effect
            effect = steps.send(result)


def test_too_many_failures_raise_quorum_unavailable_and_undo(world: Worlds) -> None:
    w = world()
    for i in (0, 2, 4):
        w.failing[i] = redis.TimeoutError("no reply")
    with pytest.raises(QuorumUnavailableError) as raised:
        w.acquire(blocking=True, timeout=10)
    assert sorted(raised.value.errors) == ["m0", "m2", "m4"]
    assert w.scripts(1) == {"release"} and all(w.transport.rounds[1])


def test_a_quorum_is_a_strict_majority_and_nothing_less_grants(world: Worlds) -> None:
    for size in (1, 2, 3, 4, 5, 6, 7):
        needed = size // 2 + 1
        assert Quorum(tuple("m" * size), 0.01, 0.05).needed == needed
        w = world(size)
        w.take_elsewhere(range(needed - 1, size))  # grants on needed - 1 masters only
        assert not w.acquire()
        w = world(size)
        w.take_elsewhere(range(needed, size))  # grants on exactly a quorum
        assert w.acquire()


# -- the watchdog's verdicts ----------------------------------------------------------------


def managed_hold(w: World) -> Hold:
    assert w.acquire()
    hold = w.hold()
    assert hold is not None and hold.managed
    return hold


def test_the_deadline_clock_calls_a_hold_lost_one_margin_before_validity_ends(
    world: Worlds,
) -> None:
    w = world()
    hold = managed_hold(w)
    margin = verdict_margin(LEASE / 3)
    holds = w.engine.holds
    assert holds.next_deadline(margin) == pytest.approx(hold.valid_until - margin)
    assert holds.overdue(hold.valid_until - margin - 0.001, margin) == []
    assert hold.lost is None
    assert holds.overdue(hold.valid_until - margin, margin) == [hold]
    assert hold.lost is not None and w.engine.remaining(hold) == 0.0
    assert holds.overdue(hold.valid_until, margin) == []  # reported once
    assert 0 < margin < LEASE / 3


def test_a_renewal_on_a_quorum_moves_the_validity_on(world: Worlds) -> None:
    w = world()
    hold = managed_hold(w)
    w.clock.advance(LEASE / 3)
    w.failing = {0: redis.TimeoutError("late"), 1: redis.TimeoutError("late")}
    started = w.clock()
    lost = w.run(tick_steps(w.engine.quorum, w.engine.holds, LEASE, set(), lambda _: True))
    assert lost == [] and hold.lost is None
    assert hold.valid_until == pytest.approx(started + LEASE - DRIFT)


def test_a_failed_renewal_is_retried_and_left_to_the_deadline_clock(world: Worlds) -> None:
    w = world()
    hold = managed_hold(w)
    before = hold.valid_until
    w.failing = {i: redis.TimeoutError("late") for i in (0, 1, 2)}
    lost = w.run(tick_steps(w.engine.quorum, w.engine.holds, LEASE, set(), lambda _: True))
    assert lost == [] and hold.lost is None and hold.valid_until == before


def test_a_final_release_goes_out_after_a_renewal_of_its_hold_under_way() -> None:
    # The renewal, sent on a connection of its own, could reach a master after the
    # release and take the hold again there until its lease ended: the release waits.
    w = World()
    hold = managed_hold(w)
    renewal = tick_steps(w.engine.quorum, w.engine.holds, LEASE, set(), lambda _: True)
    assert isinstance(next(renewal), Fanout)  # the renewal round is out
    release = w.engine.release(EXCLUSIVE, "x", hold.owner, quiet_if_lost=False)
    assert isinstance(next(release), Pause) and isinstance(release.send(None), Pause)
    renewal.close()  # its replies read (or the round given up)
    effect = release.send(None)
    assert isinstance(effect, Fanout) and effect.calls[0][0].script.name == "release"
    release.close()


def test_a_hold_gone_from_a_majority_is_lost_at_once(world: Worlds) -> None:
    w = world()
    hold = managed_hold(w)
    for i in (0, 1, 2):
        w.masters[i].drop_holds()
    lost = w.run(tick_steps(w.engine.quorum, w.engine.holds, LEASE, set(), lambda _: True))
    assert lost == [hold] and hold.lost is not None
    with pytest.raises(LockLostError):
        w.run(w.engine.release(EXCLUSIVE, "x", hold.owner, quiet_if_lost=False))


def test_a_renewal_takes_the_hold_again_where_it_is_gone_and_the_lock_is_free(
    world: Worlds,
) -> None:
    # Masters 3 and 4 forgot the hold (a restart, an early expiry): the owner, still on
    # a quorum, takes it again there, so it stands on every master, not a bare quorum.
    w = world()
    hold = managed_hold(w)
    for i in (3, 4):
        w.masters[i].drop_holds()
    w.masters[4].hold(lock_key("x"), {"someone-else": 1}, LEASE)  # taken meanwhile there
    before = hold.valid_until
    lost = w.run(tick_steps(w.engine.quorum, w.engine.holds, LEASE, set(), lambda _: True))
    assert lost == [] and hold.lost is None and hold.valid_until > before
    fields = [m._hash(lock_key("x")) for m in w.masters]
    assert fields[:4] == [{hold.owner: f"1:{hold.tag}"}] * 4
    assert fields[4] == {"someone-else": "1"}  # never another's hold


def test_a_renewal_whose_hold_stood_on_a_bare_quorum_only_is_not_renewed(world: Worlds) -> None:
    # Only masters 0 and 1 kept the hold: those taken again (2, 3, 4) do not count, for
    # the hold was not on a quorum meanwhile. Not renewed; the deadline clock reports it.
    w = world()
    hold = managed_hold(w)
    for i in (2, 3, 4):
        w.masters[i].drop_holds()
    before = hold.valid_until
    lost = w.run(tick_steps(w.engine.quorum, w.engine.holds, LEASE, set(), lambda _: True))
    assert lost == [hold] and hold.valid_until == before  # gone from 3: lost at once


def test_a_release_that_a_quorum_neither_confirms_nor_refuses_is_not_a_loss() -> None:
    from redreentrant._core.rounds import release_steps

    q = Quorum(tuple(f"m{i}" for i in range(5)), 0.01, 0.05, FakeClock())
    held, none = [0, "", 0, 0], [-1, ""]

    def release(replies: list[list[object]]) -> None:
        steps = release_steps(q, EXCLUSIVE, "x", "o", 0, 1)
        assert isinstance(next(steps), Fanout)
        with contextlib.suppress(StopIteration):
            assert isinstance(steps.send(replies), Notify)  # wake local waiters
            steps.send(None)

    # Two held it, two did not, one did not answer: it may be on a quorum.
    release([[held], [held], [none], [none], [ConnectionError()]])
    # Three did not: it was not on a quorum any more.
    with pytest.raises(LockLostError):
        release([[held], [held], [none], [none], [none]])


def test_a_master_whose_clock_steps_is_counted_out_for_the_quarantine_and_reported() -> None:
    from redreentrant._core.clockwatch import ClockWatch

    clock = FakeClock()  # the client's monotonic clock, at 1000 s
    watch = ClockWatch(3, 0.01, clock, quarantine=lambda: 3.0)
    steps: list[tuple[int, float]] = []
    watch.on_step = lambda master, seconds: steps.append((master, seconds))
    offset = 1_700_000_000_000 - 1_000_000  # the masters' wall clock, ms, less the client's

    def observe(jump_ms: int = 0, took: float = 0.002) -> None:
        sent = clock()
        clock.advance(took)
        at = offset + server_ms(sent + took / 2)
        times = [at + (jump_ms if i == 1 else 0) for i in range(3)]
        watch.observe([decode.attempt([1, 1, t]) for t in times], sent, clock())

    for _ in range(5):  # in step, over 50 s (well within the drift allowance)
        observe()
        clock.advance(10.0)
    assert steps == [] and all(watch.counts(i) for i in range(3))
    observe(jump_ms=10_000)  # master 1's clock stepped 10 s forward
    assert [m for m, _ in steps] == [1] and 9.8 < steps[0][1] <= 10.0  # beyond the drift
    assert [watch.counts(i) for i in range(3)] == [True, False, True]
    clock.advance(2.0)
    observe(jump_ms=10_000)  # in step with its new self: still out for the quarantine
    assert not watch.counts(1) and len(steps) == 1
    clock.advance(1.5)
    assert watch.counts(1)  # the quarantine is over
    # A grant from a master counted out is a refusal.
    q = Quorum(("a", "b", "c"), 0.01, 0.05, clock)
    q.watch.out_until[2] = clock() + 1.0
    q.watch.anyone_out = True
    tally = tally_grants(q, str, "k", [[[1, 1, 0]]] * 3, [decode.attempt([1, 1, 0])] * 3)
    assert tally.granted == [0, 1] and tally.refused == [2]
    # ... so a round that may end early waits for one more vote, until it counts again.
    assert q.until_granted.needed == q.until_held.needed == 3
    clock.advance(1.0)
    assert q.watch.counts(2) and q.until_granted.needed == q.until_held.needed == 2


def test_a_quorum_votes_once_the_needed_th_master_counted_out_counts_again() -> None:
    clock = FakeClock()
    q = Quorum(("a", "b", "c", "d", "e"), 0.01, 0.05, clock)
    assert q.votes_at() == float("-inf")  # none counted out, ever
    now = clock()
    q.watch.out_until[:] = [now + 3.0, now + 1.0, now - 5.0, now + 2.0, now + 4.0]
    assert q.votes_at() == now + 2.0  # then three count: c, b and d
    clock.advance(2.0)
    assert q.votes_at() == now + 2.0 <= clock()  # past: a quorum counts now


def test_a_master_seen_seldom_may_drift_by_the_allowance_of_the_time_between() -> None:
    from redreentrant._core.clockwatch import ClockWatch

    clock = FakeClock()
    watch = ClockWatch(1, 0.01, clock, quarantine=lambda: 3.0)
    steps: list[float] = []
    watch.on_step = lambda master, seconds: steps.append(seconds)
    drift = 0.0  # ms the master's clock ran ahead: 0.5 % of the time passed (a slew)

    def observe(jump_ms: float = 0.0) -> None:
        sent = clock()
        clock.advance(0.002)
        at = 1_700_000_000_000 + round(server_ms(sent + 0.001) + drift + jump_ms)
        watch.observe([decode.attempt([1, 1, at])], sent, clock())

    for _ in range(5):  # once a minute: 300 ms ahead each time, within 1 % of a minute
        observe()
        clock.advance(60.0)
        drift += 300.0
    assert steps == [] and watch.counts(0)
    observe(jump_ms=2_000)  # a step beyond a minute's allowance is still seen
    assert len(steps) == 1 and 1.0 < steps[0] < 2.0 and not watch.counts(0)


def test_a_dead_owners_hold_is_released_everywhere_and_reported(world: Worlds) -> None:
    w = world()
    hold = managed_hold(w)
    lost = w.run(tick_steps(w.engine.quorum, w.engine.holds, LEASE, set(), lambda _: False))
    assert lost == [hold] and "owner ended" in str(hold.lost)
    assert w.hold() is None
    assert w.scripts(len(w.transport.rounds) - 1) == {"release"}
    assert all(not m._hash(lock_key("x")) for m in w.masters)


def test_the_cluster_slot_of_keys_matches_redis() -> None:
    from redis.crc import key_slot as redis_key_slot

    for key in [lock_key("orders:42"), PREFIX + "{}x", "{a}{b}", "", "}{", "no-tag"]:
        assert key_slot(key) == redis_key_slot(key.encode())


def test_a_plain_locks_view_shows_a_registered_holder_as_the_holder_only() -> None:
    # A grant keeps the owner's registration until its final release (lua/acquire.lua):
    # a probe reads it among the waiters, and the view does not show it waiting.
    view = EXCLUSIVE.view([30000, [b"a:t1", b"1"], [b"a:t1", b"b:t2"]])
    assert view is not None and view.holders == {"a:t1": 1} and view.queue == ["b:t2"]
    waiting = EXCLUSIVE.view([-2, [], [b"b:t2"]])  # free, with a waiter registered
    assert waiting is not None and waiting.holders == {} and waiting.queue == ["b:t2"]
    assert EXCLUSIVE.view([-2, [], []]) is None
    assert not EXCLUSIVE.is_locked(waiting)


def test_holds_are_keyed_by_kind_name_and_owner() -> None:
    holds = Holds(threading.Lock())
    a = Hold(EXCLUSIVE, "x", "o1", 1, LEASE, True, 10.0)
    holds.add(a)
    assert holds.get(EXCLUSIVE, "x", "o1") is a and holds.get(EXCLUSIVE, "x", "o2") is None
    holds.remove(a)
    assert holds.all() == []


def test_an_owner_that_ends_while_the_holds_table_is_locked_deadlocks_nothing() -> None:
    # The cyclic garbage collector ends an ``owner=`` object wherever it runs: here while
    # the same thread holds the table's lock (``alive`` is called under it).
    holds = Holds(threading.Lock())
    fixed = Hold(EXCLUSIVE, "x", "o1", 1, LEASE, False, 10.0)
    holds.add(fixed)
    told: list[bool] = []
    worker = threading.Thread(
        target=holds.take_dead, args=(lambda token: told.append(holds.ended(token)) or False,)
    )
    worker.daemon = True
    worker.start()
    worker.join(5)
    assert not worker.is_alive(), "deadlocked"
    assert told == [True] and holds.all() == []  # the ended owner's hold is forgotten


# -- the subscription state machine ----------------------------------------------------------


def message(kind: str, channel: str, data: str = "") -> dict[str, object]:
    return {"type": kind, "channel": channel.encode(), "data": data.encode()}


def test_a_channel_watched_while_a_master_connects_is_sent_next() -> None:
    subs = Subscriptions(2, "home")
    assert subs.connected(0) == ["home"]  # the connect's SUBSCRIBE is under way...
    subs.watch("c", "o1")  # ... when a waiter watches a channel
    assert subs.changes(0) == (["c"], [])  # not skipped: sent next on that connection
    assert subs.changes(0) == ([], [])
    assert subs.changes(1) == ([], [])  # not connected yet: it gets all of it then
    assert subs.connected(1) == ["home", "c"]


def test_a_stale_unsubscribe_never_removes_a_fresh_subscription() -> None:
    subs = Subscriptions(1, "home")
    subs.connected(0)
    subs.watch("c", "o1")
    assert subs.changes(0) == (["c"], [])
    subs.unwatch("c", "o1")
    subs.watch("c", "o2")  # watched again before the unsubscribe was sent
    assert subs.changes(0) == ([], [])  # so none is sent
    subs.unwatch("c", "o2")
    assert subs.changes(0) == ([], ["c"])
    assert "c" not in subs.channels  # forgotten once no connection has it


def test_a_release_counts_once_however_many_masters_announce_it() -> None:
    subs = Subscriptions(3, "home")
    subs.watch("c", "o1")
    chan = subs.channels["c"]
    for i in range(3):
        subs.connected(i)
        assert subs.on_message(i, message("subscribe", "c")) == ([], True)
    assert subs.settled(chan)
    woken = [subs.on_message(i, message("message", "c", "release-1"))[0] for i in range(3)]
    assert [len(w) for w in woken] == [1, 0, 0]
    assert subs.waiter("c", "o1").wakes == 1
    assert subs.released_here("c", "release-1") == []  # the local notice of the same
    assert subs.released_here("c", "release-2") == [subs.waiter("c", "o1")]
    assert subs.waiter("c", "o1").wakes == 2


def test_one_waiter_at_a_time_in_turn_or_all_of_a_broadcast_channel() -> None:
    subs = Subscriptions(1, "home")
    for owner in ("o1", "o2", "o3"):
        subs.watch("w", owner)
        subs.watch("r", owner, broadcast=True)
    subs.connected(0)
    turns = [subs.on_message(0, message("message", "w", f"r{n}"))[0] for n in range(4)]
    assert [w.owner for ws in turns for w in ws] == ["o1", "o2", "o3", "o1"]
    readers = subs.on_message(0, message("message", "r", "x"))[0]
    assert sorted(w.owner for w in readers) == ["o1", "o2", "o3"]


def test_a_lost_master_is_not_waited_for_and_rejoins_on_reconnect() -> None:
    subs = Subscriptions(2, "home")
    subs.watch("c", "o1")
    chan = subs.channels["c"]
    subs.connected(0)
    subs.connected(1)
    subs.on_message(0, message("subscribe", "c"))
    assert not subs.settled(chan)
    subs.lost(1)
    assert subs.settled(chan)  # a failed master does not hold a waiter up
    assert subs.changes(1) == ([], [])
    assert subs.connected(1) == ["home", "c"]
    assert not subs.settled(chan)  # back: its confirmation counts again


def home_ready(size: int, home: str = "home") -> Subscriptions:
    """A state machine whose masters all confirmed the home channel."""
    subs = Subscriptions(size, home)
    for i in range(size):
        subs.connected(i)
        assert subs.on_message(i, message("subscribe", home)) == ([], True)
    return subs


def wake(release: str, owner: str, channel: str = "lock\nx") -> str:
    return f"{release}\n{owner}\n{channel}"


def test_a_targeted_channel_is_subscribed_nowhere_and_wakes_only_the_named_waiter() -> None:
    subs = home_ready(3)
    for owner in ("o1", "o2"):
        assert subs.watch("lock\nx", owner, targeted=True) == 0
    assert subs.settled(subs.channels["lock\nx"])
    assert subs.wanted() == {"home"} and subs.changes(0) == ([], [])
    assert subs.waiter("lock\nx", "o2").wakes == 0  # asleep: nothing was missed
    woken = [subs.on_message(i, message("message", "home", wake("r1", "o2")))[0] for i in range(3)]
    assert [[w.owner for w in ws] for ws in woken] == [["o2"], [], []]  # counted once
    assert subs.waiter("lock\nx", "o1").wakes == 0
    subs.unwatch("lock\nx", "o2")
    # Late word of the same release from another master, the waiter gone: still once.
    assert subs.on_message(2, message("message", "home", wake("r1", "o2"))) == ([], False)
    subs.watch("lock\nx", "o2", targeted=True)
    assert subs.waiter("lock\nx", "o2").wakes == 0
    assert subs.on_message(0, message("message", "home", "no payload")) == ([], False)


def test_a_targeted_wake_up_before_the_watch_is_kept_for_it() -> None:
    subs = home_ready(1)
    # The try registered the owner, and the release came before its watch.
    assert subs.on_message(0, message("message", "home", wake("r1", "o1"))) == ([], False)
    assert subs.watch("lock\nx", "o1", targeted=True) == 0
    assert subs.waiter("lock\nx", "o1").wakes == 1  # the wait ends at once: try again
    subs.unwatch("lock\nx", "o1")
    subs.watch("lock\nx", "o1", targeted=True)
    assert subs.waiter("lock\nx", "o1").wakes == 0  # used up


def test_a_local_hand_over_wakes_its_waiter_with_the_lock_and_no_one_else() -> None:
    subs = home_ready(1)
    for owner in ("m:o1", "m:o2"):
        subs.watch("lock\nx", owner, targeted=True)
    handover = Handover(7000, frozenset({0}), 1.0)
    woken = subs.released_here("lock\nx", "r1", ("m:o2",), {"m:o2": handover})
    assert [w.owner for w in woken] == ["m:o2"]
    assert subs.take_handover("lock\nx", "m:o2") == handover
    assert subs.take_handover("lock\nx", "m:o2") is None  # taken
    assert subs.take_handover("lock\nx", "m:o1") is None


def test_a_hand_over_whose_reply_was_lost_wakes_every_local_waiter() -> None:
    subs = home_ready(1)
    for owner in ("m:o1", "m:o2"):
        subs.watch("lock\nx", owner, targeted=True)
    woken = subs.released_here("lock\nx", "r1", (), None, everyone=True)
    assert sorted(w.owner for w in woken) == ["m:o1", "m:o2"]


def test_a_local_hand_over_before_the_watch_is_kept_for_it_as_a_wake_up() -> None:
    subs = home_ready(1, home=home_channel("m"))  # manager m's
    handover = Handover(7000, frozenset({0}), 1.0)
    assert subs.released_here("lock\nx", "r1", ("m:o1",), {"m:o1": handover}) == []
    # The watch that follows the try is woken at once, without the lock: that watch may
    # be a later acquire's, so its try finds out whether the lock is its own.
    subs.watch("lock\nx", "m:o1", targeted=True)
    assert subs.waiter("lock\nx", "m:o1").wakes == 1
    assert subs.take_handover("lock\nx", "m:o1") is None


def test_masters_that_disagree_on_whom_a_release_wakes_each_wake_their_waiter() -> None:
    # Each master takes the place of the waiter it wakes: every one must be told, or it
    # sleeps until its wait ends while the lock is free.
    subs = home_ready(3, home=home_channel("m"))
    for owner in ("m:o1", "m:o2"):
        subs.watch("lock\nx", owner, targeted=True)
    woken = [
        subs.on_message(i, message("message", home_channel("m"), wake("r1", owner)))[0]
        for i, owner in enumerate(("m:o1", "m:o2", "m:o2"))
    ]
    assert [[w.owner for w in ws] for ws in woken] == [["m:o1"], ["m:o2"], []]


def test_a_local_release_wakes_each_local_waiter_the_masters_chose() -> None:
    subs = home_ready(2, home=home_channel("m"))
    for owner in ("m:o1", "m:o2", "m:o3"):
        subs.watch("lock\nx", owner, targeted=True)
    woken = subs.released_here("lock\nx", "r1", ("m:o2", "m:o1"))
    assert sorted(w.owner for w in woken) == ["m:o1", "m:o2"]
    # The masters' own word of the same wake-ups counts for nothing more.
    for i, owner in enumerate(("m:o2", "m:o1")):
        msg = message("message", home_channel("m"), wake("r1", owner))
        assert subs.on_message(i, msg) == ([], False)
    assert subs.waiter("lock\nx", "m:o3").wakes == 0


def test_a_local_release_that_wakes_one_of_ours_before_its_watch_is_kept_for_it() -> None:
    # The owner's try registered it, and this manager's release woke it before the
    # watch that follows the try: the wake-up is kept for that watch.
    subs = home_ready(1, home=home_channel("m"))
    subs.watch("lock\nx", "m:o2", targeted=True)  # another waiter watches already
    assert subs.released_here("lock\nx", "r1", ("m:o1",)) == []
    assert subs.on_message(0, message("message", home_channel("m"), wake("r1", "m:o1"))) == (
        [],
        False,
    )
    subs.watch("lock\nx", "m:o1", targeted=True)
    assert subs.waiter("lock\nx", "m:o1").wakes == 1
    assert subs.waiter("lock\nx", "m:o2").wakes == 0


def test_a_targeted_watch_before_the_home_channel_is_heard_counts_as_woken() -> None:
    subs = Subscriptions(2, "home")
    subs.watch("lock\nx", "o1", targeted=True)
    assert subs.waiter("lock\nx", "o1").wakes == 1  # a wake-up may have been missed
    assert not subs.settled(subs.channels["lock\nx"])
    subs.connected(0)
    subs.connected(1)
    subs.on_message(0, message("subscribe", "home"))
    subs.lost(1)
    assert subs.settled(subs.channels["lock\nx"])
    subs.watch("lock\nx", "o2", targeted=True)
    assert subs.waiter("lock\nx", "o2").wakes == 0


def test_targeted_waiters_try_again_when_a_masters_connection_comes_back() -> None:
    subs = home_ready(2)
    subs.watch("lock\nx", "o1", targeted=True)
    subs.watch("c", "o2")
    subs.lost(1)  # while it is down, that master's wake-ups reach nobody
    assert subs.on_message(0, message("subscribe", "home")) == ([], True)
    subs.connected(1)
    woken, confirmed = subs.on_message(1, message("subscribe", "home"))
    assert confirmed and [w.owner for w in woken] == ["o1"]
    assert subs.waiter("lock\nx", "o1").wakes == 1 and subs.waiter("c", "o2").wakes == 0


def test_a_local_release_wakes_the_waiter_the_masters_chose_if_it_waits_here() -> None:
    subs = home_ready(1)
    for owner in ("o1", "o2"):
        subs.watch("lock\nx", owner, targeted=True)
    assert [w.owner for w in subs.released_here("lock\nx", "r1", ("o2",))] == ["o2"]
    assert subs.released_here("lock\nx", "r2", ("elsewhere",)) == []  # woken elsewhere
    # The masters woke nobody (none registered, or none listened): one local waiter.
    assert [w.owner for w in subs.released_here("lock\nx", "r3", ())] == ["o1"]
    assert [w.owner for w in subs.relay("lock\nx", "o1")] == ["o2"]
    # The masters' word on r1 comes after the local notice: not counted again.
    assert subs.on_message(0, message("message", "home", wake("r1", "o2"))) == ([], False)


def test_many_holds_are_renewed_in_chunks_each_with_its_own_validity(world: Worlds) -> None:
    w = world()
    owner = w.engine.owner_id()
    chunk = renew_chunk(5)
    count = 2 * chunk + 10
    w.round_time = 0.0  # taking them costs no (fake) time
    for n in range(count):
        steps = w.engine.acquire(EXCLUSIVE, f"x{n}", owner, False, -1, None)
        assert w.run(steps)
    holds = w.engine.holds.managed()
    w.clock.advance(LEASE / 3)
    w.round_time = 0.01
    before = len(w.transport.rounds)
    lost = w.run(tick_steps(w.engine.quorum, w.engine.holds, LEASE, set(), lambda _: True))
    rounds = w.transport.rounds[before:]
    assert lost == [] and len(rounds) == 3  # two full chunks and the rest
    assert all(len(call.keys) <= chunk for r in rounds for per in r for call in per)
    ends = sorted({h.valid_until for h in holds})
    assert len(ends) == 3  # each chunk's validity runs from its own round's start
    # The chunks are spread over the first half of the renewal interval.
    gap = SPREAD * LEASE / 3 / 3
    assert ends[1] - ends[0] == pytest.approx(gap) and ends[2] - ends[1] == pytest.approx(gap)
    assert w.hub.pauses == [pytest.approx(gap - 0.01), pytest.approx(gap - 0.01)]


@pytest.mark.parametrize(
    ("size", "chunk"), [(1, RENEW_CHUNK), (3, 2 * RENEW_CHUNK), (5, 2 * RENEW_CHUNK)]
)
def test_renewal_chunks_are_larger_on_several_masters(size: int, chunk: int, world: Worlds) -> None:
    # A chunk costs a round trip per master: on several masters, fewer and larger ones.
    assert renew_chunk(size) == chunk
    w = world(size)
    w.round_time = 0.0
    owner = w.engine.owner_id()
    for n in range(chunk + 1):
        assert w.run(w.engine.acquire(EXCLUSIVE, f"x{n}", owner, False, -1, None))
    w.clock.advance(LEASE / 3)
    before = len(w.transport.rounds)
    assert w.run(tick_steps(w.engine.quorum, w.engine.holds, LEASE, set(), lambda _: True)) == []
    rounds = w.transport.rounds[before:]
    assert [len(r[0][0].keys) for r in rounds] == [chunk, 1]


def test_the_verdict_margin_grows_with_how_long_renewal_rounds_take(world: Worlds) -> None:
    interval = LEASE / 3
    times = RoundTimes()
    assert verdict_margin(interval, times.slowest) == pytest.approx(0.1)
    w = world()
    w.run(w.engine.acquire(EXCLUSIVE, "x", w.engine.owner_id(), False, -1, None))
    w.round_time = 0.2  # slow renewal rounds
    tick = tick_steps(w.engine.quorum, w.engine.holds, LEASE, set(), lambda _: True, True, times)
    assert w.run(tick) == []
    assert times.slowest == pytest.approx(0.2)
    assert verdict_margin(interval, times.slowest) == pytest.approx(0.4)
    assert verdict_margin(interval, 10.0) == interval / 2  # never more than half


def test_an_owner_that_ends_mid_tick_is_swept_before_the_next_chunk(world: Worlds) -> None:
    w = world()
    w.round_time = 0.0
    owner = w.engine.owner_id()
    for n in range(renew_chunk(5) + 1):
        assert w.run(w.engine.acquire(EXCLUSIVE, f"x{n}", owner, False, -1, None))
    alive = [True]
    checks = iter([False, True])  # the owner ends after the first chunk

    def sweep_due() -> bool:
        due = next(checks, False)
        if due:
            alive[0] = False
        return due

    tick = tick_steps(
        w.engine.quorum, w.engine.holds, LEASE, set(), lambda _: alive[0], True, None, sweep_due
    )
    lost = w.run(tick)
    assert len(lost) == renew_chunk(5) + 1  # all of them freed, not left to the next tick
    assert all(not m.hashes.get(lock_key("x0")) for m in w.masters)


# -- rounds that end once decided; suspect masters --------------------------------------


def test_an_acquire_round_ends_once_a_quorum_granted(world: Worlds) -> None:
    w = world()
    assert w.acquire()
    # Every master carried the call out, but only the first three replies were needed.
    assert all(m._hash(lock_key("x")) for m in w.masters)
    rounds = len(w.transport.rounds)
    w.run(w.engine.release(EXCLUSIVE, "x", w.engine.owner_id(), False))
    assert len(w.transport.rounds) == rounds + 1
    assert all(not m._hash(lock_key("x")) for m in w.masters)


def test_a_round_decided_without_some_masters_leaves_them_unread_and_undoes_there(
    world: Worlds,
) -> None:
    w = world()
    w.round_time = LEASE  # decided by three grants, but the validity is spent
    assert not w.acquire()
    # The undo goes everywhere, the unread masters too (they may have granted), and is
    # not waited for.
    assert w.scripts(1) == {"release"} and all(w.transport.rounds[1])
    assert all(not m._hash(lock_key("x")) for m in w.masters)


def test_unread_replies_are_neither_grants_refusals_nor_failures() -> None:
    from redreentrant._core.effects import UNREAD

    q = Quorum(("a", "b", "c", "d", "e"), 0.01, 0.05)
    replies = [[[1, 1]], [[1, 1]], [[1, 1]], [UNREAD], [UNREAD]]
    t = tally_grants(q, str, "k", replies, decoded(decode.attempt, replies))
    assert t.granted == [0, 1, 2] and t.unread == [3, 4] and not t.failed and not t.refused
    replies = [[0], [UNREAD], [-1], [0], [UNREAD]]
    t = tally_holds(q, str, "k", replies, decoded(decode.release, replies))
    assert t.granted == [0, 3] and t.refused == [2] and t.unread == [1, 4] and not t.failed


def test_the_fanout_round_is_decided_by_votes_and_a_no_wait_round_at_once() -> None:
    from redreentrant._core.effects import UNREAD, Early
    from redreentrant._core.fanout import FanoutRound
    from redreentrant._core.quorum import NO_WAIT, first_granted

    call = Call(EXCLUSIVE.acquire(Try("x", "o", 1000, "1", 0)).script, ("k",), ())
    fan = FanoutRound([(call,)] * 5, Early(3, first_granted))
    for i, reply in enumerate([[1, 1], [0, 5], [1, 1]]):
        assert not fan.decided
        fan.answered(i, [reply])
    assert not fan.decided
    fan.answered(3, [[1, 1]])
    assert fan.decided
    fan.unread(4)
    assert fan.results[4] == [UNREAD]
    assert FanoutRound([(call,)] * 5, NO_WAIT).decided
    assert not FanoutRound([(call,)] * 5).decided  # without early: every master is read


def test_a_master_health_record_turns_suspect_is_probed_at_intervals_and_rejoins() -> None:
    from redreentrant._core.health import MAX_OWED, Behind, MasterHealth

    m = MasterHealth(probe_interval=0.5)
    behind = Behind(conn=object(), owed=2, since=10.0)
    assert not m.overdue(behind, 10.1, timeout=0.2)  # late, not overdue: still waited for
    assert m.overdue(behind, 10.25, timeout=0.2)  # overdue: a round makes it suspect
    m.timed_out(10.25)
    # A suspect is sent no new acquire: the connection goes back, nothing is sent.
    assert m.queue_behind(behind, 1, cleanup=False) == ([], []) and m.behind == [behind]
    # A clean-up goes on every connection behind; one that would owe too much is closed.
    full = Behind(conn=object(), owed=MAX_OWED, since=10.0)
    m.behind.append(full)
    taken = m.behind.pop(0)
    assert m.queue_behind(taken, 1, cleanup=True) == ([behind], [full]) and not m.behind
    m.queued(behind, 1, 10.3)
    assert behind.owed == 3 and m.behind == [behind]
    m.behind.clear()
    assert not m.start_probe(10.3)  # not before the probe interval
    assert m.start_probe(10.8) and not m.start_probe(10.9)  # one at a time
    m.behind.append(behind)
    assert m.probed(False) == [] and m.suspect
    assert m.start_probe(11.3)
    assert m.probed(True) == [behind] and not m.suspect and not m.behind


def test_a_connection_behind_knows_when_its_oldest_owed_reply_went_out() -> None:
    from redreentrant._core.health import Behind

    behind = Behind(conn=object(), owed=2, since=10.0)
    assert Behind.after(behind, behind.conn, 1, 10.1) is behind and behind.owed == 3
    behind.read()
    assert behind.since == 10.0  # one of the first two replies is still owed
    behind.read()
    assert behind.owed == 1 and behind.since == 10.1  # only the later one is
    behind.read()
    assert behind.owed == 0
    behind.sent(2, 10.5)
    assert behind.owed == 2 and behind.since == 10.5
    fresh = Behind.after(None, object(), 1, 11.0)
    assert fresh.owed == 1 and fresh.since == 11.0


def test_a_round_looks_for_owed_replies_only_once_they_are_due_or_the_master_is_suspect() -> None:
    from redreentrant._core.health import CATCH_UP_AFTER, Behind, MasterHealth

    m = MasterHealth(probe_interval=0.5)
    behind = Behind(conn=object(), owed=1, since=10.0)
    due = 10.0 + CATCH_UP_AFTER * 0.2 + 1e-6
    # Sent a moment ago by a master that answers: the round sends behind it, unread.
    assert not m.catch_up_due(behind, 10.001, timeout=0.2)
    assert m.catch_up_due(behind, due, timeout=0.2)
    # Once read up to a later batch, that batch's age counts.
    behind.sent(1, due)
    behind.read()
    assert not m.catch_up_due(behind, due + 0.001, timeout=0.2)
    assert not m.overdue(behind, 10.0 + 0.2, timeout=0.2)  # the oldest owed is young now
    # A suspect is looked at every round: it rejoins as soon as its replies came.
    m.timed_out(due)
    assert m.catch_up_due(behind, due + 0.001, timeout=0.2)


def test_the_probe_interval_is_a_third_of_the_lease_at_most_one_second() -> None:
    assert Settings.check(30.0, 0.01, None, 0.05, None).probe_interval == 1.0
    assert Settings.check(1.5, 0.01, None, 0.05, None).probe_interval == pytest.approx(0.5)


def test_the_deadline_clock_follows_renewals_and_releases_without_scanning(world: Worlds) -> None:
    w = world()
    w.round_time = 0.0
    owner = w.engine.owner_id()
    for n in range(3):
        assert w.run(w.engine.acquire(EXCLUSIVE, f"x{n}", owner, False, -1, None))
        w.clock.advance(0.1)
    holds = w.engine.holds
    first, second, third = (holds.get(EXCLUSIVE, f"x{n}", owner) for n in range(3))
    assert first is not None and second is not None and third is not None
    margin = verdict_margin(LEASE / 3)
    assert holds.next_deadline(margin) == pytest.approx(first.valid_until - margin)
    # A renewal moves the first hold's deadline behind the others.
    holds.renewed(first, first.valid_until + 1.0)
    assert holds.next_deadline(margin) == pytest.approx(second.valid_until - margin)
    # A released hold no longer counts.
    w.run(w.engine.release(EXCLUSIVE, "x1", owner, False))
    assert holds.next_deadline(margin) == pytest.approx(third.valid_until - margin)
    assert holds.overdue(third.valid_until - margin, margin) == [third]
    assert holds.next_deadline(margin) == pytest.approx(first.valid_until - margin)


def test_the_deadline_clock_looks_in_small_steps_however_many_holds_were_renewed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """10,000 managed holds, renewed a round of 64 at a time as the watchdog does: no
    look of the deadline clock may go over the queue in one go with the table's lock
    held (every acquire and release needs that lock), and the looks still find the one
    hold left unrenewed before its validity ends, and no other."""
    import heapq

    import redreentrant._core.holds as holds_module

    steps: list[int] = [0]

    def counted(f: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            steps[0] += 1
            return f(*args)

        return call

    monkeypatch.setattr(
        holds_module,
        "heapq",
        type("CountedHeapq", (), {n: staticmethod(counted(getattr(heapq, n))) for n in
              ("heappush", "heappop", "heapreplace", "heapify")}),
    )  # fmt: skip
    lease = 3.0
    margin = verdict_margin(lease / 3)
    holds = Holds(threading.Lock())
    now = 1000.0
    taken = [
        Hold(EXCLUSIVE, f"x{n}", "m:p:u:t1", 1, lease, True, now + lease) for n in range(10_000)
    ]
    for hold in taken:
        holds.add(hold)
    forgotten = taken[5_000]
    # Two ticks: each renews every hold but one, in rounds of 64 spread over the tick.
    for tick in range(1, 3):
        start = now + tick * (lease / 3)
        for k in range(0, len(taken), 64):
            at = start + k / len(taken) * 0.9 * (lease / 3)
            chunk = [h for h in taken[k : k + 64] if h is not forgotten]
            holds.renewed_all(chunk, at + lease)
    # The clock's looks from the first tick on, each when the last one said.
    clock = now + lease / 3
    lost: list[Hold] = []
    looks = 0
    while not lost and looks < 10_000:
        looks += 1
        steps[0] = 0
        lost = holds.overdue(clock, margin)
        due = holds.next_deadline(margin)
        assert steps[0] < 2_000, steps[0]  # a few hundred entries, never the 10,000
        assert due is not None
        clock = max(clock, due)
    assert lost == [forgotten]
    assert clock <= forgotten.valid_until - margin  # found before its validity ends
    assert all(h.lost is None for h in taken if h is not forgotten)


def test_the_deadline_clock_is_woken_only_by_a_hold_due_before_its_next_look(world: Worlds) -> None:
    w = world()
    w.round_time = 0.0
    watchdog = WatchdogBase(w.run, w.engine, lambda hold: None)
    woken: list[Hold] = []
    w.engine.on_managed_hold = lambda hold: (
        woken.append(hold) if watchdog.clock_needed(hold) else None
    )
    # Idle (no hold): it looks again one renewal interval later, not only when woken.
    lost, wait = watchdog._overdue()
    assert lost == [] and wait == pytest.approx(LEASE / 3)
    # A usual hold is due about a lease later: the clock needs no wake-up for it.
    assert w.acquire()
    assert woken == []
    # A hold due before the next look (a short validity left) is told to it.
    now = w.clock()
    soon = Hold(EXCLUSIVE, "soon", "m:t2", 1, LEASE, True, now + 0.5)
    late = Hold(EXCLUSIVE, "late", "m:t2", 1, LEASE, True, now + LEASE)
    assert watchdog.clock_needed(soon) and not watchdog.clock_needed(late)
    # While it looks, any new hold wakes it (it may have looked before the hold came).
    watchdog.clock_looks_at = float("inf")
    assert watchdog.clock_needed(late)


def test_released_holds_are_not_kept_alive_by_the_deadline_clock(world: Worlds) -> None:
    w = world(size=1)
    w.round_time = 0.0
    owner = w.engine.owner_id()
    released: list[weakref.ref[Hold]] = []
    for _ in range(500):  # a lock taken and released in a loop, well within a lease
        assert w.run(w.engine.acquire(EXCLUSIVE, "x", owner, False, -1, None))
        hold = w.hold()
        assert hold is not None
        released.append(weakref.ref(hold))
        w.run(w.engine.release(EXCLUSIVE, "x", owner, False))
        del hold
    gc.collect()
    # The queue of deadlines drops released holds as it grows, rather than keeping
    # every one of them (and its hold) until its validity would have ended.
    assert sum(1 for ref in released if ref() is not None) < 100


def test_the_c_packer_packs_a_round_as_redis_py_would() -> None:
    from redreentrant._core.packing import wire_packer

    pack = wire_packer("utf-8", "strict")
    assert wire_packer("latin-1", "strict") is None  # the client's own packer then
    if importlib.util.find_spec("hiredis") is None:
        assert pack is None  # without hiredis the client's own packer serves
        return
    assert pack is not None  # hiredis is installed with the dev extra
    call = EXCLUSIVE.acquire(Try("n\u00e9e}x", "host:1:uuid:t", 30000, "1", 0))
    commands = [evalsha_args(call), ("SCRIPT", "LOAD", "return 1")]
    conn = redis.Connection()  # packs without connecting
    assert b"".join(pack(commands)) == b"".join(conn.pack_commands(commands))


# -- lease control (no server) ------------------------------------------------------------


def _drive_once(steps: Steps[object], replies: list[list[object]]) -> object:
    effect = next(steps)
    assert isinstance(effect, Fanout)
    try:
        steps.send(replies)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("more than one round")


def test_an_extension_is_valid_while_a_quorum_keeps_the_hold() -> None:
    from redreentrant._core.rounds import extend_steps

    clock = FakeClock()
    q = Quorum(tuple(f"m{i}" for i in range(5)), 0.01, 0.05, clock)
    steps = extend_steps(q, EXCLUSIVE, "x", "o", 3000, True, 1)
    # Masters left with 9, 8, 7, 2 s and one that held nothing: the hold stays on a
    # quorum (3) for 7 s, from before the round, less the drift allowance.
    valid_until = _drive_once(steps, [[9000], [8000], [0], [7000], [2000]])
    assert valid_until == pytest.approx(1000.0 + 7 - (7 * 0.01 + 0.002))


@pytest.mark.parametrize(
    ("replies", "error"),
    [
        ([[0], [0], [0], [5000], [5000]], LockLostError),
        ([[ConnectionError()]] * 3 + [[5000], [5000]], QuorumUnavailableError),
    ],
)
def test_an_extension_short_of_a_quorum_raises(
    replies: list[list[object]], error: type[Exception]
) -> None:
    from redreentrant._core.rounds import extend_steps

    q = Quorum(tuple(f"m{i}" for i in range(5)), 0.01, 0.05)
    with pytest.raises(error):
        _drive_once(extend_steps(q, EXCLUSIVE, "x", "o", 3000, False, 1), replies)


def _take_over() -> tuple[Engine, Steps[bool], Fanout]:
    """A take-over of a hand-off ticket (lock "x", count 2, token 42) on three masters:
    the engine, the steps, and their first round (the move), not answered yet."""
    from redreentrant._core.handoff import Ticket

    settings = Settings.check(5.0, 0.01, 0.2, 0.05, None)
    clock = FakeClock()
    engine = Engine(settings, ["m0", "m1", "m2"], lambda: "t1", threading.Lock, clock, max)
    ticket = Ticket("x", "lock", "sender:o1", 7, 2, 42).encode()
    steps = engine.take_over(EXCLUSIVE, "x", engine.owner_id(), ticket, None)
    move = next(steps)
    assert isinstance(move, Fanout)
    return engine, steps, move


def test_a_take_over_moves_the_ticket_s_hold_to_the_new_owner() -> None:
    engine, steps, move = _take_over()
    owner = engine.owner_id()
    (call,) = move.calls[0]
    # Only the hold of the ticket's owner and tag moves, to this owner with a new tag.
    assert call.args[:4] == ("sender:o1", 5000, "set", 7)
    assert call.args[4] == owner and call.args[5].startswith("2:")
    with pytest.raises(StopIteration):
        steps.send([[5000], [0], [5000]])  # on a quorum: held
    hold = engine.holds.get(EXCLUSIVE, "x", owner)
    assert hold is not None
    assert (hold.count, hold.fencing_token, hold.managed) == (2, 42, True)
    assert str(hold.tag) == call.args[5].split(":")[1]


def test_a_take_over_short_of_a_quorum_is_undone_everywhere_and_holds_nothing() -> None:
    engine, steps, move = _take_over()
    owner = engine.owner_id()
    tag = move.calls[0][0].args[5].split(":")[1]
    undo = steps.send([[0], [0], [5000]])  # gone from two of three masters
    assert isinstance(undo, Fanout) and undo.cleanup
    # The master that moved it releases the new owner's hold of the new tag.
    assert all(calls[0].args[1:3] == (owner, f"0:{tag}") for calls in undo.calls)
    steps.send([[ConnectionError()]] * 3)  # the undo's replies lost
    with pytest.raises(LockLostError, match="the hold handed off is gone"):
        while True:  # its wake-ups, then the verdict
            steps.send(None)
    assert engine.holds.get(EXCLUSIVE, "x", owner) is None


def test_a_ticket_of_another_lock_or_kind_is_refused_before_any_round() -> None:
    from redreentrant._core.handoff import Ticket
    from redreentrant._core.kinds import READ

    settings = Settings.check(5.0, 0.01, 0.2, 0.05, None)
    engine = Engine(settings, ["m0"], lambda: "t1", threading.Lock, FakeClock(), max)
    ticket = Ticket("x", "lock", "sender:o1", 7, 1, None).encode()
    with pytest.raises(ValueError, match="not for lock 'y'"):
        next(engine.take_over(EXCLUSIVE, "y", engine.owner_id(), ticket, None))
    read = Ticket("x", READ.label, "sender:o1", 7, 1, None).encode()
    with pytest.raises(ValueError, match="cannot be handed off"):
        next(engine.take_over(READ, "x", engine.owner_id(), read, None))
    for text in ("", "[]", '{"v": 1}', ticket.replace('"count":1', '"count":0')):
        with pytest.raises(ValueError, match="not a hand-off ticket"):
            Ticket.decode(text)


def test_max_hold_stops_renewals_and_names_itself_in_the_verdict() -> None:
    holds = Holds(threading.Lock())
    capped = Hold(EXCLUSIVE, "a", "m:1", 1, 3.0, True, 103.0, renew_until=101.0)
    free = Hold(EXCLUSIVE, "b", "m:1", 1, 3.0, True, 103.0)
    holds.add(capped)
    holds.add(free)
    assert set(holds.managed(100.0)) == {capped, free}
    assert holds.managed(101.0) == [free]  # not renewed past its max_hold
    told: list[str] = []

    class Told:
        def notify_lost(self) -> None:
            told.append("lost")

    capped.signal = Told()
    assert holds.overdue(102.8, 0.5) == [capped, free]
    assert capped.lost is not None and "max_hold" in capped.lost
    assert free.lost is not None and "max_hold" not in free.lost
    assert told == ["lost"]


def test_a_semaphore_try_sends_every_slot_in_an_order_drawn_from_the_injected_source() -> None:
    from redreentrant._core.kinds import semaphore_kind

    draws = iter([0.2, 3.9, 1.5])  # j for i = 3, 2, 1 (Fisher-Yates)
    q = Quorum(("a", "b", "c"), 0.01, 0.1, FakeClock(), lambda lo, hi: next(draws))
    call = semaphore_kind(4).attempt(q, Try("s", "o", 1000, "1:1", 0))
    order = call.args[6:]
    assert sorted(order) == [1, 2, 3, 4]  # positions of the four slots' keys
    assert order == (4, 2, 3, 1)  # i=3 swaps with 0; i=2 and i=1 stay
    assert call.keys[:4] == tuple(aux_key("s", f"sem:{n}") for n in range(4))


def test_a_semaphore_grant_is_a_slot_a_quorum_granted_and_the_rest_is_taken_back() -> None:
    from redreentrant._core.kinds import semaphore_kind

    q = Quorum(tuple("abcde"), 0.01, 0.1, FakeClock())
    front = semaphore_kind(2)
    # Masters 0, 1, 3 granted slot 1 (position 2); master 2 slot 0; master 4 refused.
    replies: list[list[object]] = [[[1, 1, 2]], [[1, 1, 2]], [[1, 1, 1]], [[1, 1, 2]], [[0, 50]]]
    tally, held = front.judge(q, "s", replies, decoded(decode.attempt, replies))
    assert held is semaphore_kind(2, 1) and tally.granted == [0, 1, 3]
    assert sorted(tally.refused) == [2, 4]
    back = front.kept(q, "s", "o", tally, held, 7)
    assert back is not None and back.early is not None and back.early.needed == 0
    assert [bool(calls) for calls in back.calls] == [False, False, True, False, True]
    # Keep slot 1 (position 2); drop what the same try (tag 7) or an earlier one took,
    # and the registration (it holds a permit).
    assert back.calls[2][0].args == ("drop", "o", 2, 7, 1)
    # Split: no slot on a quorum (two masters each for slots 0 and 1, one refused).
    split: list[list[object]] = [[[1, 1, 1]], [[1, 1, 2]], [[1, 1, 1]], [[1, 1, 2]], [[0, 9]]]
    tally, _ = front.judge(q, "s", split, decoded(decode.attempt, split))
    assert len(tally.granted) == 2 < q.needed
    everyone: list[list[object]] = [[[1, 1, 1]]] * 5
    tally, held = front.judge(q, "s", everyone, decoded(decode.attempt, everyone))
    assert front.kept(q, "s", "o", tally, held, 7) is None  # nothing to take back


# -- the upgradeable reader of the read/write lock (replies of rwlock.lua, canned) ----------


def rw_answers(w: World, answer: Callable[[int, Call], Reply]) -> list[list[Call]]:
    """Let ``answer`` reply to every call of every master (the model answers the plain
    lock's scripts only); returns the rounds' calls to master 0, as they are made."""
    rounds: list[list[Call]] = []

    def handler(master: int, call: Call) -> Reply:
        if master == 0:
            w.clock.advance(w.round_time)
            rounds.append([call])
        reply = answer(master, call)
        if call.args[0] == "acquire" and isinstance(reply, list):
            reply = [*reply, server_ms(w.clock())]  # a try's reply ends with the time
        return reply

    mock = w.transport if isinstance(w.transport, MockTransport) else w.transport._mock
    mock.handler = handler
    return rounds


def rw_granting(refused: int, ms: int = 0) -> Callable[[int, Call], Reply]:
    """Replies that grant every acquire but the first ``refused`` tries of the write
    side on each master, refused with ``ms`` left on the other holds; a release or an
    abandon finds the hold (0)."""
    tries: dict[int, int] = {}

    def answer(master: int, call: Call) -> Reply:
        op = call.args[0]
        if op == "acquire" and call.args[1] == "w":
            tries[master] = tries.get(master, 0) + 1
            if tries[master] <= refused:
                return [0, ms]
        if op == "acquire":
            return [1, parse_hold(call.args[4])[0]]
        return 0

    return answer


def test_an_upgrade_marks_its_intent_waits_on_its_own_channel_and_holds_the_write_side(
    world: Worlds,
) -> None:
    from redreentrant._core.kinds import UPGRADEABLE, WRITE

    w = world()
    rounds = rw_answers(w, rw_granting(2, 500))
    owner = w.engine.owner_id()
    assert w.run(w.engine.acquire(UPGRADEABLE, "x", owner, True, -1, None))
    w.hub.wakes = 1  # the wait ends with a wake-up: the last reader left
    assert w.run(w.engine.upgrade("x", owner, -1, False, None))
    tries = [r[0].args for r in rounds[1:]]
    # Each try is the write side's acquire, registering the owner as a waiting writer
    # (new readers are refused meanwhile) for as long as it waits: a lease at most.
    assert [t[:3] for t in tries] == [("acquire", "w", owner)] * 3
    assert all(t[5] == lease_ms(LEASE) for t in tries)
    # It waits on the upgrade's channel (subscribed first, then one more try), woken by
    # a release, or else when the other holds end (0.5 s left: expiry publishes nothing).
    assert w.hub.watches == [(aux_key("x", "rw:wake:u"), owner, True, False)]
    assert w.hub.waits == [pytest.approx(0.501)]
    up, write = w.engine.hold(UPGRADEABLE, "x"), w.engine.hold(WRITE, "x")
    assert up is not None and write is not None and write.kind.label == "rw:write"
    assert (up.count, write.count) == (1, 1)


def test_an_upgrade_that_times_out_withdraws_its_intent_and_keeps_the_upgradeable_hold(
    world: Worlds,
) -> None:
    from redreentrant._core.kinds import UPGRADEABLE, WRITE

    w = world()
    rounds = rw_answers(w, rw_granting(1000, 60000))
    owner = w.engine.owner_id()
    assert w.run(w.engine.acquire(UPGRADEABLE, "x", owner, True, -1, None))
    assert not w.run(w.engine.upgrade("x", owner, 2.0, False, None))
    last = rounds[-1][0]
    assert last.args[:2] == ("abandon", owner) and last.args[2] == aux_key("x", "rw:wake:r")
    assert w.engine.hold(UPGRADEABLE, "x") is not None and w.engine.hold(WRITE, "x") is None


def test_the_last_upgradeable_release_ends_the_upgrade_in_the_same_call(world: Worlds) -> None:
    from redreentrant._core.kinds import UPGRADEABLE, WRITE

    w = world()
    rounds = rw_answers(w, rw_granting(0))
    owner = w.engine.owner_id()
    engine = w.engine
    assert w.run(engine.acquire(UPGRADEABLE, "x", owner, True, -1, None))
    assert w.run(engine.acquire(UPGRADEABLE, "x", owner, True, -1, None))  # re-entry
    assert w.run(engine.upgrade("x", owner, -1, False, None))
    assert w.run(engine.upgrade("x", owner, -1, False, None))  # re-enters the write side
    write = engine.hold(WRITE, "x")
    assert write is not None and write.count == 2
    w.run(engine.downgrade("x", owner))
    assert rounds[-1][0].args[:4] == ("release", "w", owner, f"1:{write.tag}")
    w.run(engine.release(UPGRADEABLE, "x", owner, False))  # not the last: still upgraded
    assert engine.hold(WRITE, "x") is write and write.count == 1
    sent = len(rounds)
    w.run(engine.release(UPGRADEABLE, "x", owner, False))
    up = rounds[-1][0].args[3]
    assert len(rounds) == sent + 1 and rounds[-1][0].args[:3] == ("release", "u", owner)
    assert parse_hold(up)[0] == 0 and parse_hold(up)[1] < write.tag  # the upgrade came later
    # The upgrade's tag last: where the upgradeable hold was refused, a master may have
    # granted the upgrade as a plain write, which the same call frees there.
    assert rounds[-1][0].args[-2:] == (aux_key("x", "rw:wake:u"), write.tag)
    assert engine.hold(UPGRADEABLE, "x") is None and engine.hold(WRITE, "x") is None


def test_sides_that_would_wait_for_themselves_are_refused_before_anything_is_sent(
    world: Worlds,
) -> None:
    from redreentrant._core.errors import LockNotOwnedError, LockUpgradeError
    from redreentrant._core.kinds import READ, UPGRADEABLE, WRITE

    w = world()
    rounds = rw_answers(w, rw_granting(0))
    owner = w.engine.owner_id()
    engine = w.engine
    with pytest.raises(LockNotOwnedError):
        w.run(engine.upgrade("x", owner, -1, False, None))
    with pytest.raises(LockNotOwnedError):
        w.run(engine.downgrade("x", owner))
    for held, wanted in ((READ, UPGRADEABLE), (READ, WRITE), (WRITE, UPGRADEABLE)):
        assert w.run(engine.acquire(held, "x", owner, True, -1, None))
        sent = len(rounds)
        with pytest.raises(LockUpgradeError, match=f"{held.label[3:]} lock cannot take"):
            w.run(engine.acquire(wanted, "x", owner, True, 10, None))
        assert len(rounds) == sent
        w.run(engine.release(held, "x", owner, False))
    # The holder of the upgradeable side may read; then it is not upgraded.
    assert w.run(engine.acquire(UPGRADEABLE, "x", owner, True, -1, None))
    assert w.run(engine.acquire(READ, "x", owner, True, -1, None))
    with pytest.raises(LockNotOwnedError, match="not upgraded"):
        w.run(engine.downgrade("x", owner))


def test_a_read_write_view_names_the_upgradeable_holder() -> None:
    from redreentrant._core.kinds import READ, UPGRADEABLE, WRITE

    fields = [b"mode", b"read", b"upgradeable", b"o1", b"u:o1", b"1", b"r:o2", b"2"]
    view = READ.view([5000, fields, [b"o1"]])  # o1 waits to upgrade
    assert view is not None and view.mode == "read" and view.queue == ["o1"]
    assert view.holders == {"o1 (upgradeable)": 1, "o2 (read)": 2}
    assert UPGRADEABLE.is_locked(view) and READ.is_locked(view) and not WRITE.is_locked(view)
    alone = READ.view([5000, [b"mode", b"read", b"r:o2", b"1"], []])
    assert not UPGRADEABLE.is_locked(alone)


def test_a_split_fair_waiter_yields_to_the_head_of_the_most_masters() -> None:
    # p3 came first and heads the queue on two masters; one master, which saw p0
    # first, heads p0 (whose id is smaller); the fifth did not answer. p3 keeps its
    # place (the order most masters saw), p0 moves behind p3.
    early, late = "m:p3", "m:p0"
    replies: list[list[object]] = [
        [[1, 1]],
        [[1, 1]],
        [[0, 100, late.encode()]],
        [TimeoutError("frozen")],
        [[0, 100, b"m:holder"]],
    ]
    assert FAIR.settle("x", early, replies, "rid") is None
    seen_by_late: list[list[object]] = [
        [[0, 100, early.encode()]],
        [[0, 100, early.encode()]],
        [[1, 1]],
        [TimeoutError("frozen")],
        [[0, 100, b"m:holder"]],
    ]
    call = FAIR.settle("x", late, seen_by_late, "rid")
    assert call is not None and call.args[:3] == ("yield", late, early)
    # Equals: the smallest owner id goes first.
    tie: list[list[object]] = [[[1, 1]], [[0, 100, b"m:a"]]]
    assert FAIR.settle("x", "m:b", tie, "rid") is not None
    assert FAIR.settle("x", "m:a", [[[1, 1]], [[0, 100, b"m:b"]]], "rid") is None


class ScriptMaster:
    """A master running the real scripts (on a fakeredis server of its own), for the
    kinds :class:`Master` does not model (the fair lock)."""

    def __init__(self, clock: FakeClock) -> None:
        self.r = fakeredis.FakeRedis(server=fakeredis.FakeServer())
        self.clock = clock

    def run(self, call: Call) -> Reply:
        reply: Reply = self.r.eval(call.script.source, len(call.keys), *call.keys, *call.args)
        if call.args[0] in ("acquire", "renew") and isinstance(reply, list):
            # The server's time a try's reply ends with, as the world's clock has it.
            reply[-1] = server_ms(self.clock())
        return reply


def before_yield(steps: Steps[bool], act: Callable[[], None]) -> Steps[bool]:
    """``steps``, with ``act()`` just before the first round of fair-lock yields."""
    effect = next(steps)
    try:
        while True:
            if isinstance(effect, Fanout) and effect.calls[0][0].args[0] == "yield":
                act()
                act = lambda: None  # noqa: E731
            effect = steps.send((yield effect))
    except StopIteration as done:
        return bool(done.value)


def test_a_fair_waiter_does_not_yield_to_a_head_that_left_and_queued_again(
    world: Worlds,
) -> None:
    # p3 waits behind p0, which holds the lock; the fifth master is frozen. p0's release
    # reaches m0 first, and p3's next try is granted there but refused by m1..m3, where
    # p0 (still holding) heads the queue: p3 yields to p0. Before that yield goes out,
    # p0's release reaches m1..m3 and p0 asks again: a new arrival, behind p3 on every
    # master. The yield was meant for p0's earlier place: p3 keeps its own, goes first.
    w = world()
    masters = [ScriptMaster(w.clock) for _ in w.masters]
    w.masters = masters  # type: ignore[assignment]
    engine = w.engine
    z, p0, p3 = (engine.owner_of(token) for token in ("z", "p0", "p3"))

    def everywhere(call: Call, at: Iterable[int] = range(5)) -> None:
        for i in at:
            masters[i].run(call)

    def freed(owner: str) -> str:
        """The hold of ``owner``, released."""
        hold = engine.holds.get(FAIR, "x", owner)
        assert hold is not None
        return f"0:{hold.tag}"

    assert w.run(engine.acquire(FAIR, "x", z, False, -1, None))
    # p0 queues behind z, which releases while p0 waits: p0 holds it, at the head.
    w.hub.on_wait = lambda: everywhere(FAIR.release("x", z, freed(z), "z:1"))
    assert w.run(engine.acquire(FAIR, "x", p0, True, 10, None))

    def released_on_m0() -> None:
        w.hub.on_wait = lambda: None
        everywhere(FAIR.release("x", p0, freed(p0), "p0:1"), [0])
        w.failing[4] = redis.TimeoutError("frozen")

    def p0_again() -> None:
        everywhere(FAIR.release("x", p0, freed(p0), "p0:1"), [1, 2, 3])
        call = FAIR.acquire(Try("x", p0, lease_ms(LEASE), f"1:{next_tag()}", lease_ms(LEASE)))
        everywhere(Call(call.script, call.keys, (*call.args[:5], "p0-again")), range(4))

    w.hub.on_wait = released_on_m0
    yields = len(w.transport.rounds)
    assert w.run(before_yield(engine.acquire(FAIR, "x", p3, True, 1, None), p0_again))
    assert any(  # the scenario above happened: p3 yielded to p0
        c.args[:3] == ("yield", p3, p0) for r in w.transport.rounds[yields:] for c in r[0]
    )
    for m in masters[:4]:
        view = FAIR.view(m.run(FAIR.probe("x")))
        assert view is not None and view.holders == {p3: 1} and view.queue == [p0]
