"""The libraries under test, reduced to "acquire" and "release", and the raw floors.

Used by ``bench_all.py`` (and by its worker processes, which import this module by
name: keep it free of side effects). Not a benchmark itself.

Every adapter is named by a key of :data:`SYNC_OPENERS` or :data:`ASYNC_OPENERS` so that
a worker process can open the same library from a picklable :class:`LibSpec`. A library
that cannot be imported raises :class:`NotRunnable` from its opener; the caller reports
"not runnable" and goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
from benchcommon import LEASE_S, WAIT_S, host_port_db

LUA_DIR = Path(__file__).resolve().parents[1] / "lua"

# Library keys (also the labels' first word in the tables).
RR = "redreentrant"
RR_ASYNC = "redreentrant.asyncio"
RR_FENCED = "redreentrant fencing=True"
RR_LISTENED = "redreentrant + no-op listener"
REDIS_PY = "redis-py Lock"
REDIS_PY_ASYNC = "redis-py asyncio Lock"
PRL = "python-redis-lock"
POTTERY = "pottery Redlock"
REDLOCK_PY = "redlock-py"
AIOREDLOCK = "aioredlock"


class NotRunnable(Exception):
    """The library cannot be imported or started on this interpreter."""


def _import(module: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except Exception as exc:  # ImportError, or a broken dependency at import time
        raise NotRunnable(f"cannot import {module}: {type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True)
class LibSpec:
    """A library and its options, picklable: what a worker process needs to open it."""

    key: str  # a key of SYNC_OPENERS / ASYNC_OPENERS
    label: str  # how the tables name it
    options: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- sync


@dataclass
class LockOps:
    """One lock instance reduced to the two calls the benchmark needs."""

    acquire: Callable[[], bool]
    release: Callable[[], None]


@dataclass
class Backend:
    """A library bound to a set of masters; ``new_lock`` may be called from any thread
    (the lock it returns belongs to the calling thread)."""

    new_lock: Callable[[str], LockOps]
    close: Callable[[], None]
    info: dict[str, Any] = field(default_factory=dict)


def rr_lock(mgr: Any, kind: str, name: str) -> Any:
    """The redreentrant lock of ``kind`` (see :func:`open_redreentrant`) that has one
    acquire and one release, sync or asyncio alike."""
    what, _, arg = kind.partition(":")
    if what == "semaphore":
        return mgr.semaphore(name, permits=int(arg))
    if what == "multi":
        return mgr.multi_lock([f"{name}:{c}" for c in "abcdefgh"[: int(arg)]])
    if what == "rw":
        return getattr(mgr.rw_lock(name), arg)  # read, write, upgradeable
    raise ValueError(f"unknown redreentrant lock kind {kind!r}")


def open_redreentrant(
    urls: Sequence[str],
    wait: float = WAIT_S,
    kind: str = "lock",
    count_holders: bool = False,
    **options: Any,
) -> Backend:
    """``kind``: ``lock``; ``semaphore:P`` (P permits); ``multi:K`` (a multi-lock of K
    names); ``nested:K`` (K plain locks, taken in turn, released in reverse); ``rw:SIDE``
    (``read``, ``write``, ``upgradeable``); ``upgrade`` (the upgradeable side, then
    ``upgrade()``; released by ``downgrade()``, then ``release()``). ``count_holders``
    counts the holds in force in this process: ``info["max_holders"]`` is the most seen
    at once (a hold counts from its acquire's return to its release's call)."""
    from redreentrant import LockManager

    mgr = LockManager(list(urls), **{"lease": LEASE_S, **options})
    in_force, most = [0], [0]
    guard = threading.Lock()

    def counted(ops: LockOps) -> LockOps:
        def acquire() -> bool:
            if not ops.acquire():
                return False
            with guard:
                in_force[0] += 1
                most[0] = max(most[0], in_force[0])
            return True

        def release() -> None:
            with guard:
                in_force[0] -= 1
            ops.release()

        return LockOps(acquire, release)

    def new_lock(name: str) -> LockOps:
        if kind == "lock":
            lock = mgr.lock(name)
            ops = LockOps(lambda: bool(lock.acquire(blocking=True, timeout=wait)), lock.release)
        elif kind.startswith("nested:"):
            locks = [mgr.lock(f"{name}:{c}") for c in "abcdefgh"[: int(kind[7:])]]

            def acquire() -> bool:
                for i, lk in enumerate(locks):
                    if not lk.acquire(timeout=wait):
                        for taken in reversed(locks[:i]):
                            taken.release()
                        return False
                return True

            def release() -> None:
                for lk in reversed(locks):
                    lk.release()

            ops = LockOps(acquire, release)
        elif kind == "upgrade":
            up = mgr.rw_lock(name).upgradeable

            def acquire() -> bool:
                if not up.acquire(timeout=wait):
                    return False
                if up.upgrade(timeout=wait):
                    return True
                up.release()
                return False

            def release() -> None:
                up.downgrade()
                up.release()

            ops = LockOps(acquire, release)
        else:
            one = rr_lock(mgr, kind, name)
            ops = LockOps(lambda: bool(one.acquire(timeout=wait)), one.release)
        return counted(ops) if count_holders else ops

    info: dict[str, Any] = {"master_timeout": mgr.master_timeout, "lease": mgr.lease}
    if count_holders:
        info["max_holders"] = most
    return Backend(new_lock, mgr.close, info)


def open_redis_py(urls: Sequence[str], sleep: float = 0.1) -> Backend:
    client = redis.Redis.from_url(urls[0])

    def new_lock(name: str) -> LockOps:
        lock = client.lock(name, timeout=LEASE_S, sleep=sleep, blocking_timeout=WAIT_S)
        return LockOps(lambda: bool(lock.acquire()), lock.release)

    return Backend(new_lock, client.close, {"sleep": sleep})


def open_python_redis_lock(urls: Sequence[str]) -> Backend:
    redis_lock = _import("redis_lock")
    client = redis.Redis.from_url(urls[0])

    def new_lock(name: str) -> LockOps:
        # Without expire the key never expires; timeout must be an int <= expire.
        lock = redis_lock.Lock(client, name, expire=int(LEASE_S))
        return LockOps(lambda: bool(lock.acquire(blocking=True, timeout=int(WAIT_S))), lock.release)

    return Backend(new_lock, client.close)


def open_pottery(
    urls: Sequence[str], socket_timeout: float | None = None, wait: float = WAIT_S
) -> Backend:
    pottery = _import("pottery")
    kwargs: dict[str, Any] = {}
    if socket_timeout is not None:
        kwargs = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout}
    clients = [redis.Redis.from_url(u, **kwargs) for u in urls]

    def new_lock(name: str) -> LockOps:
        lock = pottery.Redlock(key=name, masters=set(clients), auto_release_time=LEASE_S)
        return LockOps(lambda: bool(lock.acquire(blocking=True, timeout=wait)), lock.release)

    def close() -> None:
        for c in clients:
            c.close()

    return Backend(new_lock, close, {"socket_timeout": socket_timeout})


def open_redlock_py(urls: Sequence[str]) -> Backend:
    redlock = _import("redlock")
    dlm = redlock.Redlock([host_port_db(u) for u in urls])
    give_ups = [0]

    def new_lock(name: str) -> LockOps:
        held: list[Any] = []

        def acquire() -> bool:
            # lock() is try-only: 3 tries 0.2 s apart, then False. A user who needs the
            # lock calls it again: so does this adapter, until WAIT_S has passed.
            give_up_at = time.monotonic() + WAIT_S
            while True:
                lk = dlm.lock(name, int(LEASE_S * 1000))
                if lk is not False:
                    held.append(lk)
                    return True
                give_ups[0] += 1
                if time.monotonic() >= give_up_at:
                    return False

        def release() -> None:
            dlm.unlock(held.pop())

        return LockOps(acquire, release)

    def close() -> None:
        for server in dlm.servers:
            server.close()

    return Backend(new_lock, close, {"lock_calls_failed": give_ups})


SyncOpener = Callable[..., Backend]

SYNC_OPENERS: dict[str, SyncOpener] = {
    RR: open_redreentrant,
    REDIS_PY: open_redis_py,
    PRL: open_python_redis_lock,
    POTTERY: open_pottery,
    REDLOCK_PY: open_redlock_py,
}


def open_sync(spec: LibSpec, urls: Sequence[str]) -> Backend:
    return SYNC_OPENERS[spec.key](urls, **spec.options)


# --------------------------------------------------------------------------- asyncio


@dataclass
class AsyncLockOps:
    acquire: Callable[[], Awaitable[bool]]
    release: Callable[[], Awaitable[None]]


@dataclass
class AsyncBackend:
    """Opened inside the running event loop; ``new_lock`` is called by the owning task."""

    new_lock: Callable[[str], AsyncLockOps]
    close: Callable[[], Awaitable[None]]


def open_rr_async(urls: Sequence[str], kind: str = "lock", **options: Any) -> AsyncBackend:
    """``kind``: ``lock``, or one of :func:`rr_lock`'s."""
    from redreentrant.asyncio import LockManager

    mgr = LockManager(list(urls), **{"lease": LEASE_S, **options})

    def new_lock(name: str) -> AsyncLockOps:
        lock = mgr.lock(name) if kind == "lock" else rr_lock(mgr, kind, name)
        return AsyncLockOps(lambda: lock.acquire(timeout=WAIT_S), lock.release)

    return AsyncBackend(new_lock, mgr.close)


def open_redis_py_async(urls: Sequence[str]) -> AsyncBackend:
    client = redis.asyncio.Redis.from_url(urls[0])

    def new_lock(name: str) -> AsyncLockOps:
        lock = client.lock(name, timeout=LEASE_S, blocking_timeout=WAIT_S)
        return AsyncLockOps(lock.acquire, lock.release)

    return AsyncBackend(new_lock, client.aclose)


def open_aioredlock(urls: Sequence[str]) -> AsyncBackend:
    aioredlock = _import("aioredlock")
    dlm = aioredlock.Aioredlock([host_port_db(u) for u in urls])

    def new_lock(name: str) -> AsyncLockOps:
        held: list[Any] = []

        async def acquire() -> bool:
            # A fixed lock_timeout starts no per-lock extension task.
            held.append(await dlm.lock(name, lock_timeout=LEASE_S))
            return True

        async def release() -> None:
            await dlm.unlock(held.pop())

        return AsyncLockOps(acquire, release)

    return AsyncBackend(new_lock, dlm.destroy)


AsyncOpener = Callable[..., AsyncBackend]

ASYNC_OPENERS: dict[str, AsyncOpener] = {
    RR_ASYNC: open_rr_async,
    REDIS_PY_ASYNC: open_redis_py_async,
    AIOREDLOCK: open_aioredlock,
}


def open_async(spec: LibSpec, urls: Sequence[str]) -> AsyncBackend:
    return ASYNC_OPENERS[spec.key](urls, **spec.options)


# --------------------------------------------------------------------------- raw floors


def raw_calls(name: str) -> tuple[tuple[object, ...], Callable[[int], tuple[object, ...]]]:
    """``numkeys, KEYS..., ARGV...`` of redreentrant's acquire and release of lock
    ``name`` by one owner, exactly as its lock kind builds them (an uncontended,
    non-blocking acquire by a try of tag 1, then the final release of that hold with
    release number ``n``)."""
    from redreentrant._core.kinds import EXCLUSIVE, hold_value
    from redreentrant._core.owner import new_manager_id

    owner = f"{new_manager_id()}:t1"  # <host>:<pid>:<uuid>:<thread token>
    take = EXCLUSIVE.acquire(name, owner, int(LEASE_S * 1000), hold_value(1, 1), 0)
    acquire = (len(take.keys), *take.keys, *take.args)

    def release(n: int) -> tuple[object, ...]:
        call = EXCLUSIVE.release(name, owner, hold_value(0, 1), f"{owner}:{n}")
        return (len(call.keys), *call.keys, *call.args)

    return acquire, release


def lua_source(script: str) -> str:
    return (LUA_DIR / f"{script}.lua").read_text(encoding="utf-8")


def check_cycle(acquired: Sequence[Any], released: Sequence[Any]) -> None:
    """Every master granted the acquire (``{1, 1, time}``) and freed the lock on the
    release (``{0, ...}``)."""
    for reply in acquired:
        if list(reply[:2]) != [1, 1]:
            raise RuntimeError(f"raw floor: acquire replied {reply!r}, expected [1, 1, time]")
    for reply in released:
        if reply[0] != 0:
            raise RuntimeError(f"raw floor: release replied {reply!r}, expected [0, ...]")


class RawFloor:
    """redreentrant's two script calls per cycle, and nothing else, on one raw redis-py
    connection per master: write to every master, then read every reply (the same
    pipelining as redreentrant's transport), once for the acquire and once for the
    release. ``ping=True`` sends a PING instead of each script call: the two-round-trip
    floor."""

    def __init__(self, urls: Sequence[str], name: str, ping: bool = False) -> None:
        connection: Any = redis.Connection  # redis-py's connections are untyped here
        self.conns: list[Any] = [connection(**host_port_db(u)) for u in urls]
        self.ping = ping
        self.acq_args, self.rel_args = raw_calls(name)
        self.n = 0
        self.acq_sha = self.rel_sha = ""
        for conn in self.conns:
            conn.connect()
            if not ping:
                conn.send_command("SCRIPT", "LOAD", lua_source("acquire"))
                self.acq_sha = conn.read_response().decode()
                conn.send_command("SCRIPT", "LOAD", lua_source("release"))
                self.rel_sha = conn.read_response().decode()

    def _round(self, *command: object) -> list[Any]:
        for conn in self.conns:
            conn.send_packed_command(conn.pack_command(*command), check_health=False)
        return [conn.read_response() for conn in self.conns]

    def cycle(self, check: bool = False) -> None:
        if self.ping:
            self._round("PING")
            self._round("PING")
            return
        self.n += 1
        acquired = self._round("EVALSHA", self.acq_sha, *self.acq_args)
        released = self._round("EVALSHA", self.rel_sha, *self.rel_args(self.n))
        if check:
            check_cycle(acquired, released)

    def close(self) -> None:
        for conn in self.conns:
            conn.disconnect()


class AsyncRawFloor:
    """:class:`RawFloor` on ``redis.asyncio`` connections (open with :meth:`open`)."""

    def __init__(self, urls: Sequence[str], name: str, ping: bool = False) -> None:
        connection: Any = redis.asyncio.Connection
        # No socket time-out, as the sync floor's connections and redreentrant's asyncio
        # ones: with one (redis.asyncio's default is 5 s), every send runs in a task of
        # its own (asyncio.wait_for) and every read under a timer.
        self.conns: list[Any] = [connection(**host_port_db(u), socket_timeout=None) for u in urls]
        self.ping = ping
        self.acq_args, self.rel_args = raw_calls(name)
        self.n = 0
        self.acq_sha = self.rel_sha = ""

    async def open(self) -> None:
        for conn in self.conns:
            await conn.connect()
            if not self.ping:
                await conn.send_command("SCRIPT", "LOAD", lua_source("acquire"))
                self.acq_sha = (await conn.read_response()).decode()
                await conn.send_command("SCRIPT", "LOAD", lua_source("release"))
                self.rel_sha = (await conn.read_response()).decode()

    async def _round(self, *command: object) -> list[Any]:
        for conn in self.conns:
            await conn.send_packed_command(conn.pack_command(*command), check_health=False)
        return [await conn.read_response() for conn in self.conns]

    async def cycle(self, check: bool = False) -> None:
        if self.ping:
            await self._round("PING")
            await self._round("PING")
            return
        self.n += 1
        acquired = await self._round("EVALSHA", self.acq_sha, *self.acq_args)
        released = await self._round("EVALSHA", self.rel_sha, *self.rel_args(self.n))
        if check:
            check_cycle(acquired, released)

    async def close(self) -> None:
        for conn in self.conns:
            await conn.disconnect()
