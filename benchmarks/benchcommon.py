"""What the benchmark scripts share: servers and options, a run's results, the libraries
under test and the raw floors, and the workers that contend for one lock.

Not a benchmark itself. The scripts import it as a sibling module (``python
benchmarks/bench_all.py`` puts this directory first on ``sys.path``), and so do the
worker processes they spawn: keep it free of side effects. redreentrant is imported
inside the functions, once :func:`ensure_repo_importable` has put this repository's
tree first.

Every library is named by a key of :data:`SYNC_OPENERS` or :data:`ASYNC_OPENERS`, so
that a worker process can open the same library from a picklable :class:`LibSpec`. A
library that cannot be imported raises :class:`NotRunnable` from its opener; the caller
reports "not runnable" and goes on.

Worker processes are started once with the ``spawn`` method (:class:`ProcessPool`) and
reused for every case; each opens its own backend (one manager per process) per case.
Every worker runs :func:`worker_loop` in the same time window: the start and end are
``time.monotonic()`` instants, which all processes of one host share on Linux.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import ipaddress
import itertools
import math
import multiprocessing
import platform
import queue
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio

REPO_ROOT = Path(__file__).resolve().parents[1]
LUA_DIR = REPO_ROOT / "lua"

# Lease and blocking timeouts are generous on purpose: nothing here should ever
# expire or time out, so every library is measured on its happy path.
LEASE_S = 30.0
WAIT_S = 30.0
WARMUP_CYCLES = 50
ENSEMBLE_SIZE = 5


# --------------------------------------------------------------------------- plumbing


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def fail_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def host_port_db(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    db = parts.path.strip("/")
    return {"host": parts.hostname, "port": parts.port or 6379, "db": int(db) if db else 0}


def is_loopback(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        return False
    if parts.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return False


def ensure_repo_importable() -> None:
    # Benchmark the working tree, even when run as `python benchmarks/<script>.py`.
    root = str(REPO_ROOT)
    if root not in sys.path:
        sys.path.insert(0, root)


def versions(dists: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {"python": platform.python_version()}
    for dist in dists:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    with contextlib.suppress(Exception):
        import redreentrant

        out["redreentrant"] = str(getattr(redreentrant, "__version__", "working tree"))
    return out


def split_urls(masters: str) -> list[str]:
    return [u.strip() for u in masters.split(",") if u.strip()]


@contextlib.contextmanager
def servers(masters: str | None) -> Iterator[tuple[list[str], Any]]:
    """The given loopback masters and None; or the masters of a private
    ``LocalEnsemble(5)``, stopped on exit, and that ensemble (for the workloads that
    pause one of its servers)."""
    if masters:
        yield split_urls(masters), None
        return
    # Imported late: the ensemble module is only needed when no --masters are given.
    from redreentrant.testing import LocalEnsemble

    with LocalEnsemble(ENSEMBLE_SIZE) as ensemble:
        yield list(ensemble.urls), ensemble


@contextlib.contextmanager
def revision_tree(rev: str) -> Iterator[Path]:
    """This repository at git revision ``rev``: a temporary worktree, removed on exit."""
    with tempfile.TemporaryDirectory(prefix="rr-rev-") as tmp:
        tree = Path(tmp) / "tree"
        git = ["git", "-C", str(REPO_ROOT), "worktree"]
        subprocess.run([*git, "add", "--detach", str(tree), rev], check=True, capture_output=True)
        try:
            yield tree
        finally:
            subprocess.run([*git, "remove", "--force", str(tree)], check=False, capture_output=True)


def cleanup(urls: Sequence[str], run_id: str) -> int:
    """Delete every key whose name contains ``run_id`` (all lock names embed it)."""
    deleted = 0
    for url in urls:
        with contextlib.suppress(redis.RedisError), redis.Redis.from_url(url) as client:
            keys = list(client.scan_iter(match=f"*{run_id}*", count=1000))
            if keys:
                deleted += int(client.delete(*keys))
    return deleted


def new_run_id() -> str:
    return f"rrbench-{secrets.token_hex(4)}"


def server_version(url: str) -> str:
    with redis.Redis.from_url(url) as probe:
        return str(probe.info("server").get("redis_version", "?"))


def add_masters_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--masters",
        help="comma-separated redis:// URLs of existing loopback servers "
        "(default: start a private LocalEnsemble of 5 and stop it afterwards)",
    )


def check_masters_arg(p: argparse.ArgumentParser, masters: str | None) -> None:
    if masters is None:
        return
    urls = split_urls(masters)
    if not urls:
        p.error("--masters is empty")
    # The benchmarks write and delete keys: keep them away from anything but loopback.
    bad = [u for u in urls if not is_loopback(u)]
    if bad:
        p.error(f"only loopback redis:// masters are allowed, got: {', '.join(bad)}")


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by linear interpolation; NaN for no samples."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def masters_label(n: int) -> str:
    return f"{n} master" + ("s" if n > 1 else "")


def evalsha_calls(clients: Sequence[redis.Redis]) -> list[int]:
    """Each master's count of EVALSHA calls so far (``INFO commandstats``)."""
    out = []
    for c in clients:
        stats = c.info("commandstats")
        out.append(int(stats.get("cmdstat_evalsha", {}).get("calls", 0)))
    return out


# --------------------------------------------------------------------------- results


@dataclass
class Row:
    """One library in one case: per-round samples of each metric, and what was seen."""

    workload: str
    case: str
    library: str
    metrics: dict[str, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    flags: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def add(self, metric: str, value: float) -> None:
        self.metrics.setdefault(metric, []).append(value)

    def median(self, metric: str) -> float | None:
        values = [v for v in self.metrics.get(metric, []) if not math.isnan(v)]
        return statistics.median(values) if values else None

    def spread(self, metric: str) -> tuple[float, float] | None:
        values = [v for v in self.metrics.get(metric, []) if not math.isnan(v)]
        return (min(values), max(values)) if values else None

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def fail(self, exc: BaseException) -> None:
        if isinstance(exc, NotRunnable):
            self.error = f"not runnable: {exc}"
        else:
            self.error = fail_text(exc)
            traceback.print_exception(exc, file=sys.stderr)
        log(f"  ! {self.library} / {self.case}: {self.error}")


class Results:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, str], Row] = {}
        self.facts: dict[str, Any] = {}

    def row(self, workload: str, case: str, library: str) -> Row:
        key = (workload, case, library)
        if key not in self.rows:
            self.rows[key] = Row(workload, case, library)
        return self.rows[key]

    def get(self, workload: str, case: str, library: str) -> Row | None:
        return self.rows.get((workload, case, library))

    def of(self, workload: str) -> list[Row]:
        return [r for r in self.rows.values() if r.workload == workload]


@dataclass
class Context:
    """A run: its options, masters, the ensemble started for it (None with
    ``--masters``), the id every key name embeds, the results, and the worker
    processes, started on first use."""

    args: argparse.Namespace
    urls: list[str]
    ensemble: Any
    run_id: str
    results: Results
    _pool: ProcessPool | None = None

    def pool(self, n: int) -> ProcessPool:
        """At least ``n`` worker processes, reused from one case to the next."""
        if self._pool is not None and self._pool.n < n:
            self.close()
        if self._pool is None:
            log(f"starting {n} worker processes (spawn)")
            self._pool = ProcessPool(n)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


# --------------------------------------------------------------------------- libraries

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


# --------------------------------------------------------------------------- libraries: sync


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


# --------------------------------------------------------------------------- libraries: asyncio


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
    from redreentrant._core.kinds import EXCLUSIVE, Try, hold_value
    from redreentrant._core.owner import new_manager_id

    owner = f"{new_manager_id()}:t1"  # <host>:<pid>:<uuid>:<thread token>
    take = EXCLUSIVE.acquire(Try(name, owner, int(LEASE_S * 1000), hold_value(1, 1), 0))
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


# --------------------------------------------------------------------------- workers

START_MARGIN_S = 0.15  # from "everyone is ready" to the window's start
STALL_S = 20.0  # a worker still busy this long after the window's end has stalled
SETUP_TIMEOUT_S = 60.0  # for workers to open their backends (the first time: imports)


def warm_up(backend: Backend, name: str) -> None:
    """One acquire and release of a lock of the worker's own, before the window: every
    library's connections are open (and its scripts loaded) by the time it starts, so
    the window measures the contention, not the set-up, for every library alike."""
    ops = backend.new_lock(name)
    if not ops.acquire():
        raise RuntimeError("the warm-up acquire of an uncontended lock returned False")
    ops.release()


@dataclass(frozen=True)
class LoopParams:
    """What each worker does: acquire ``name``; if ``counter_key``, a non-atomic
    GET + SET of value + 1 on ``counter_url`` (through a plain client); sleep ``hold_s``;
    release; sleep ``think_s``; again until the window ends (the last operation is
    finished). ``record`` keeps (acquired, release called) instants of every hold."""

    name: str
    counter_url: str
    counter_key: str | None
    hold_s: float = 0.0
    think_s: float = 0.0
    record: bool = False


@dataclass
class WorkerResult:
    in_window: int = 0  # holds released by the end of the window
    total: int = 0  # every hold, the ones finished after the window included
    errors: list[str] = field(default_factory=list)
    events: list[tuple[float, float]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def worker_loop(
    ops: LockOps,
    counter: redis.Redis | None,
    params: LoopParams,
    start_at: float,
    end_at: float,
) -> WorkerResult:
    res = WorkerResult()
    delay = start_at - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    key = params.counter_key
    record = params.record
    try:
        while time.monotonic() < end_at:
            if not ops.acquire():
                res.errors.append("acquire timed out")
                break
            t_acquired = time.monotonic()
            try:
                if counter is not None and key is not None:
                    # Deliberately non-atomic: only the lock keeps this correct.
                    value = counter.get(key)
                    counter.set(key, int(value or 0) + 1)
                if params.hold_s:
                    time.sleep(params.hold_s)
            finally:
                t_release = time.monotonic()
                ops.release()
            res.total += 1
            if t_release <= end_at:
                res.in_window += 1
            if record:
                res.events.append((t_acquired, t_release))
            if params.think_s:
                time.sleep(params.think_s)
    except Exception as exc:
        res.errors.append(fail_text(exc))
    return res


def _backend_info(backend: Backend | None) -> dict[str, Any]:
    if backend is None:
        return {}
    out: dict[str, Any] = {}
    for k, v in backend.info.items():
        out[k] = v[0] if isinstance(v, list) else v
    return out


# --------------------------------------------------------------------------- workers: threads


def run_threads(
    spec: LibSpec,
    urls: Sequence[str],
    params: LoopParams,
    n: int,
    duration: float,
    per_worker_backend: bool = False,
) -> tuple[list[WorkerResult], float, float]:
    """``n`` threads of this process; one shared backend (one manager), or one each."""
    shared = None if per_worker_backend else open_sync(spec, urls)
    counter = redis.Redis.from_url(params.counter_url)
    results: list[WorkerResult] = [WorkerResult() for _ in range(n)]
    ready = threading.Barrier(n + 1)
    go = threading.Event()
    window = [0.0, 0.0]

    def worker(i: int) -> None:
        backend = shared
        ops: LockOps | None = None
        try:
            if backend is None:
                backend = open_sync(spec, urls)
            warm_up(backend, f"{params.name}:warm:{i}")
            ops = backend.new_lock(params.name)  # made by the thread that will own it
        except Exception as exc:
            results[i].errors.append(fail_text(exc))
        with contextlib.suppress(threading.BrokenBarrierError):
            ready.wait(SETUP_TIMEOUT_S)
        go.wait()
        if ops is not None:
            results[i] = worker_loop(ops, counter, params, window[0], window[1])
        if per_worker_backend and backend is not None:
            results[i].info = _backend_info(backend)
            with contextlib.suppress(Exception):
                backend.close()

    threads = [
        threading.Thread(target=worker, args=(i,), daemon=True, name=f"bench-worker-{i}")
        for i in range(n)
    ]
    try:
        for t in threads:
            t.start()
        with contextlib.suppress(threading.BrokenBarrierError):
            ready.wait(SETUP_TIMEOUT_S)
        window[0] = time.monotonic() + START_MARGIN_S
        window[1] = window[0] + duration
        go.set()
        limit = window[1] + STALL_S
        for t in threads:
            t.join(max(0.0, limit - time.monotonic()))
        stalled = [i for i, t in enumerate(threads) if t.is_alive()]
        for i in stalled:
            results[i].errors.append(f"stalled: still busy {STALL_S:g}s after the window")
        if shared is not None:
            info = _backend_info(shared)
            for r in results:
                r.info = dict(info)
    finally:
        go.set()
        if shared is not None:
            with contextlib.suppress(Exception):
                shared.close()
        counter.close()
    return results, window[0], window[1]


# --------------------------------------------------------------------------- workers: processes


def process_main(
    index: int, tasks: multiprocessing.Queue[Any], results: multiprocessing.Queue[Any]
) -> None:
    """A worker process: for each task, open the backend, report ready, wait for "go",
    run the loop, report the result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us; Ctrl-C is its
    ensure_repo_importable()
    while True:
        msg = tasks.get()
        if msg is None:
            return
        run_no, spec, urls, params = msg
        backend: Backend | None = None
        ops: LockOps | None = None
        counter: redis.Redis | None = None
        setup_error: str | None = None
        try:
            backend = open_sync(spec, urls)
            warm_up(backend, f"{params.name}:warm:{index}")
            ops = backend.new_lock(params.name)
            counter = redis.Redis.from_url(params.counter_url)
            counter.ping()
        except Exception as exc:
            setup_error = fail_text(exc)
        results.put(("ready", run_no, index, setup_error))
        go = tasks.get()
        if go is None:
            return
        _, go_run, start_at, end_at = go
        if ops is not None and go_run == run_no and start_at is not None:
            res = worker_loop(ops, counter, params, start_at, end_at)
        else:
            res = WorkerResult(errors=[setup_error] if setup_error else [])
        res.info = _backend_info(backend)
        if backend is not None:
            with contextlib.suppress(Exception):
                backend.close()
        if counter is not None:
            counter.close()
        results.put(("done", run_no, index, res))


class ProcessPool:
    """``n`` spawned worker processes, reused for every case; see :func:`process_main`."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._ctx = multiprocessing.get_context("spawn")
        self._run_no = 0
        self._procs: list[Any] = []
        self._tasks: list[Any] = []
        self._results: Any = None
        self._start()

    def _start(self) -> None:
        ensure_repo_importable()  # the children get this process's sys.path
        self._results = self._ctx.Queue()
        self._tasks = [self._ctx.Queue() for _ in range(self.n)]
        self._procs = [
            self._ctx.Process(
                target=process_main,
                args=(i, self._tasks[i], self._results),
                daemon=True,
                name=f"bench-proc-{i}",
            )
            for i in range(self.n)
        ]
        for p in self._procs:
            p.start()

    def _collect(self, kind: str, n: int, deadline: float) -> dict[int, Any]:
        got: dict[int, Any] = {}
        while len(got) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                msg_kind, run_no, index, payload = self._results.get(timeout=min(left, 1.0))
            except queue.Empty:
                if not all(p.is_alive() for p in self._procs):
                    break
                continue
            if msg_kind == kind and run_no == self._run_no:
                got[index] = payload
        return got

    def run(
        self,
        spec: LibSpec,
        urls: Sequence[str],
        params: LoopParams,
        duration: float,
        count: int | None = None,
    ) -> tuple[list[WorkerResult], float, float]:
        """Run the loop in ``count`` (default all) of the processes at once."""
        n = self.n if count is None else min(count, self.n)
        self._run_no += 1
        tasks = self._tasks[:n]
        for q in tasks:
            q.put((self._run_no, spec, list(urls), params))
        ready = self._collect("ready", n, time.monotonic() + SETUP_TIMEOUT_S)
        results = [WorkerResult() for _ in range(n)]
        if len(ready) < n:
            self._restart()
            for r in results:
                r.errors.append("worker process did not get ready")
            return results, 0.0, 0.0
        start_at = time.monotonic() + START_MARGIN_S
        end_at = start_at + duration
        for q in tasks:
            q.put(("go", self._run_no, start_at, end_at))
        done = self._collect("done", n, end_at + STALL_S)
        for i in range(n):
            if i in done:
                results[i] = done[i]
            else:
                results[i].errors.append(f"stalled: still busy {STALL_S:g}s after the window")
        if len(done) < n:
            self._restart()  # a stalled worker would answer the next case's messages
        return results, start_at, end_at

    def _restart(self) -> None:
        self._stop()
        self._start()

    def _stop(self) -> None:
        for q in self._tasks:
            with contextlib.suppress(Exception):
                q.put(None)
        deadline = time.monotonic() + 2.0
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(2.0)
            if p.is_alive():
                p.kill()

    def close(self) -> None:
        self._stop()

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- hand-offs


@dataclass
class Handoffs:
    latencies: list[float]  # seconds, from release() called to another's acquire() back
    regrabs: int  # the releaser took the lock straight back
    overlaps: int  # a hold began before the previous one ended: exclusion broken


def handoffs(results: Sequence[WorkerResult], start_at: float, end_at: float) -> Handoffs:
    """Hand-offs between holds inside the window, in the order of acquisition."""
    events = sorted(
        (acq, rel, worker)
        for worker, r in enumerate(results)
        for acq, rel in r.events
        if start_at <= acq and rel <= end_at
    )
    out = Handoffs([], 0, 0)
    for (_, prev_rel, prev_w), (acq, _, w) in itertools.pairwise(events):
        if acq < prev_rel:
            out.overlaps += 1
        elif w == prev_w:
            out.regrabs += 1
        else:
            out.latencies.append(acq - prev_rel)
    return out
