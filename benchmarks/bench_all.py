#!/usr/bin/env python3
"""Every workload, side by side with the peers, in one command: bench_all.py.

Workloads (``--only`` takes their names):

- ``uncontended``: acquire+release cycles/s from one thread (or task) on 1, 3 and 5
  masters: redreentrant sync and asyncio, the peers that support that many masters, the
  RAW floor (redreentrant's two scripts by EVALSHA on one raw connection per master,
  sync and asyncio) and the two-round-trip floor (two PINGs per cycle).
- ``contended``: 16 threads (one process) and 8 processes (spawned), on 1 and 5
  masters, each looping acquire, non-atomic GET and SET +1 of a counter on master 0,
  release: increments/s, whether the counter is exact, each worker's share.
- ``handoff``: latency from ``release()`` to another waiter's ``acquire()`` returning,
  4 threads and 4 processes, on 1 and 5 masters.
- ``badmaster``: acquire+release latency on 5 masters with one of them frozen
  (SIGSTOP) or blackholed (behind a TCP proxy that answers nothing), against healthy.
- ``held``: acquire+release latency of one lock while the same manager holds 10,000
  watchdog-managed locks (renewed every lease / 3), against none held; script calls and
  CPU time per renewal tick.
- ``semaphore``: permits acquired+released/s of ``mgr.semaphore(name, permits=P)``,
  P = 1 and 4, against ``mgr.lock(name)`` (same manager settings), on 1 and 5 masters:
  from one thread (and one asyncio task, P = 1), and from 16 threads on one manager,
  each holder doing the contended workload's GET and SET +1: whether the counter is
  exact (P = 1) and the most holds in force at once in the process (<= P).
- ``multilock``: acquire+release cycles/s of ``mgr.multi_lock([a, b, c])`` against
  three nested plain locks (and one plain lock), one thread, on 1 and 5 masters.
- ``upgrade``: cycles/s of ``with rw.upgradeable:`` + ``upgrade()`` + ``downgrade()``
  against ``with rw.upgradeable:`` alone, ``with rw.write:`` and a plain lock, one
  thread, on 1 and 5 masters.
- ``failover``: leader election: from a leader's end to the next leader's ``campaign()``
  returning, on 1 and 5 masters, leader, standby and an observer each a process of its
  own: killed (SIGKILL: the standby leads once the 1 s lease runs out) and resigned
  (a wake-up and a campaign); and when the observer's ``observe()`` reports it.

``semaphore``, ``multilock`` and ``upgrade`` also count script calls (EVALSHA) per
cycle on each master.
Libraries are interleaved (A, B, C, then A, B, C again) and every measurement is
repeated ``--rounds`` times; tables show the median and [min-max] over the rounds. In
``uncontended`` (and the one-thread cases of those three), each measurement is
also cut into 10 slices that take turns with the other libraries' (on the same
masters), so that a noisy spell slows them alike. The
TARGETS table at the end compares ratios from this run (of the libraries' medians; the
ratio of each round, the libraries interleaved within it, is shown beside it where the
target compares two libraries' rates). Prints figures and exits 0: it
is not a test. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import multiprocessing
import os
import random
import signal
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import redis
from benchcommon import (
    LEASE_S,
    WARMUP_CYCLES,
    add_masters_arg,
    check_masters_arg,
    cleanup,
    ensure_repo_importable,
    fail_text,
    new_run_id,
    percentile,
    server_version,
    servers_with_handle,
    versions,
)
from benchlibs import (
    AIOREDLOCK,
    POTTERY,
    PRL,
    REDIS_PY,
    REDIS_PY_ASYNC,
    REDLOCK_PY,
    RR,
    RR_ASYNC,
    RR_FENCED,
    RR_LISTENED,
    AsyncRawFloor,
    LibSpec,
    NotRunnable,
    RawFloor,
    open_async,
    open_sync,
)
from benchworkers import LoopParams, ProcessPool, WorkerResult, handoffs, run_threads

WORKLOADS = (
    "uncontended",
    "contended",
    "handoff",
    "badmaster",
    "held",
    "semaphore",
    "multilock",
    "upgrade",
    "failover",
)
STARVED_SHARE = 0.25
HANDOFF_WORKERS = 4
HANDOFF_HOLD_S = 0.001
HANDOFF_THINK_S = 0.001
HELD_LEASE_S = 3.0
HELD_HOLDER_THREADS = 4
BAD_INDEX = 4  # which of the 5 masters goes bad
BAD_OP_WAIT_S = 5.0  # acquire time-out in the bad-master workload

RAW_SYNC = "RAW floor (sync)"
RAW_ASYNC = "RAW floor (asyncio)"
PING_SYNC = "2xPING floor (sync)"
PING_ASYNC = "2xPING floor (asyncio)"


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


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


def fmt_value(v: float | None, digits: int = 0) -> str:
    if v is None or math.isnan(v):
        return "-"
    return f"{v:.{digits}f}"


def cell(row: Row, metric: str, digits: int = 0) -> str:
    """``median [min-max]`` of a metric over the rounds."""
    med = row.median(metric)
    if med is None:
        return "-"
    lo_hi = row.spread(metric)
    assert lo_hi is not None
    if len(row.metrics.get(metric, [])) < 2:
        return fmt_value(med, digits)
    lo, hi = lo_hi
    return f"{fmt_value(med, digits)} [{fmt_value(lo, digits)}-{fmt_value(hi, digits)}]"


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


# --------------------------------------------------------------------------- workload 1


def masters_label(n: int) -> str:
    return f"{n} master" + ("s" if n > 1 else "")


#: each uncontended measurement is cut into this many slices, and the slices of every
#: library on the same masters take turns (A, B, C, A, B, C, ...): a noisy spell of
#: the shared machine then slows them all alike, and their ratios hold
SLICES = 10

SyncStep = Callable[[], None]
AsyncStep = Callable[[], Awaitable[None]]


def _count(step: SyncStep, seconds: float) -> tuple[int, float]:
    cycles = 0
    start = now = time.perf_counter()
    end = start + seconds
    while now < end:
        step()
        cycles += 1
        now = time.perf_counter()
    return cycles, now - start


async def _acount(step: AsyncStep, seconds: float) -> tuple[int, float]:
    cycles = 0
    start = now = time.perf_counter()
    end = start + seconds
    while now < end:
        await step()
        cycles += 1
        now = time.perf_counter()
    return cycles, now - start


class Meter:
    """One library's uncontended loop on one lock, open across a round's slices."""

    def start(self) -> None:
        """Open it, check one cycle, warm it up."""
        raise NotImplementedError

    def run(self, seconds: float) -> tuple[int, float]:
        """Cycles for about ``seconds``: (cycles, seconds taken)."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class SyncMeter(Meter):
    def __init__(self, opener: Callable[[], tuple[SyncStep, SyncStep]]) -> None:
        self._opener = opener
        self._step: SyncStep = lambda: None
        self._close: SyncStep | None = None

    def start(self) -> None:
        self._step, self._close = self._opener()
        for _ in range(WARMUP_CYCLES):
            self._step()

    def run(self, seconds: float) -> tuple[int, float]:
        return _count(self._step, seconds)

    def stop(self) -> None:
        if self._close is not None:
            self._close()


class AsyncMeter(Meter):
    """Driven on ``loop``, which runs only while this meter's slice runs."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        opener: Callable[[], Awaitable[tuple[AsyncStep, AsyncStep]]],
    ) -> None:
        self._loop = loop
        self._opener = opener
        self._step: AsyncStep | None = None
        self._close: AsyncStep | None = None

    def start(self) -> None:
        self._step, self._close = self._loop.run_until_complete(self._opener())
        step = self._step

        async def warm() -> None:
            for _ in range(WARMUP_CYCLES):
                await step()

        self._loop.run_until_complete(warm())

    def run(self, seconds: float) -> tuple[int, float]:
        assert self._step is not None
        return self._loop.run_until_complete(_acount(self._step, seconds))

    def stop(self) -> None:
        if self._close is not None:
            self._loop.run_until_complete(self._close())


def sync_lib_meter(spec: LibSpec, masters: Sequence[str], name: str) -> Meter:
    def opener() -> tuple[SyncStep, SyncStep]:
        backend = open_sync(spec, masters)
        try:
            ops = backend.new_lock(name)

            def step() -> None:
                if not ops.acquire():
                    raise RuntimeError("uncontended acquire returned False")
                ops.release()

            step()
        except BaseException:
            backend.close()
            raise
        return step, backend.close

    return SyncMeter(opener)


def async_lib_meter(
    spec: LibSpec, masters: Sequence[str], name: str, loop: asyncio.AbstractEventLoop
) -> Meter:
    async def opener() -> tuple[AsyncStep, AsyncStep]:
        backend = open_async(spec, masters)
        try:
            ops = backend.new_lock(name)

            async def step() -> None:
                if not await ops.acquire():
                    raise RuntimeError("uncontended acquire returned False")
                await ops.release()

            await step()
        except BaseException:
            await backend.close()
            raise
        return step, backend.close

    return AsyncMeter(loop, opener)


def raw_meter(masters: Sequence[str], name: str, ping: bool) -> Meter:
    def opener() -> tuple[SyncStep, SyncStep]:
        floor = RawFloor(masters, name, ping=ping)
        try:
            floor.cycle(check=True)
        except BaseException:
            floor.close()
            raise
        return floor.cycle, floor.close

    return SyncMeter(opener)


def raw_async_meter(
    masters: Sequence[str], name: str, ping: bool, loop: asyncio.AbstractEventLoop
) -> Meter:
    async def opener() -> tuple[AsyncStep, AsyncStep]:
        floor = AsyncRawFloor(masters, name, ping=ping)
        try:
            await floor.open()
            await floor.cycle(check=True)
        except BaseException:
            await floor.close()
            raise
        return floor.cycle, floor.close

    return AsyncMeter(loop, opener)


def _noop_listener() -> Any:
    from redreentrant import LockListener

    return LockListener()  # every method a no-op: what a listener's calls cost


#: makes a library's meter: (masters, lock name, the round's event loop) -> Meter
MeterFactory = Callable[[Sequence[str], str, asyncio.AbstractEventLoop], Meter]


def lib(spec: LibSpec) -> MeterFactory:
    return lambda m, nm, loop: sync_lib_meter(spec, m, nm)


def alib(spec: LibSpec) -> MeterFactory:
    return lambda m, nm, loop: async_lib_meter(spec, m, nm, loop)


#: (masters, library label, meter factory), in interleaving order
MeterPlan = list[tuple[int, str, MeterFactory]]


def uncontended_plan(urls: Sequence[str]) -> MeterPlan:
    """(masters, library label, meter factory) in interleaving order."""
    plan: MeterPlan = []

    for n in (1, 3, 5):
        if n > len(urls):
            continue
        plan += [
            (n, RAW_SYNC, lambda m, nm, loop: raw_meter(m, nm, False)),
            (n, RR, lib(LibSpec(RR, RR))),
            (n, RR_LISTENED, lib(LibSpec(RR, RR_LISTENED, {"listener": _noop_listener()}))),
            (n, RR_FENCED, lib(LibSpec(RR, RR_FENCED, {"fencing": True}))),
            (n, RAW_ASYNC, lambda m, nm, loop: raw_async_meter(m, nm, False, loop)),
            (n, RR_ASYNC, alib(LibSpec(RR_ASYNC, RR_ASYNC))),
            (n, PING_SYNC, lambda m, nm, loop: raw_meter(m, nm, True)),
            (n, PING_ASYNC, lambda m, nm, loop: raw_async_meter(m, nm, True, loop)),
        ]
        if n == 1:
            plan += [
                (n, REDIS_PY, lib(LibSpec(REDIS_PY, REDIS_PY))),
                (n, PRL, lib(LibSpec(PRL, PRL))),
                (n, REDIS_PY_ASYNC, alib(LibSpec(REDIS_PY_ASYNC, REDIS_PY_ASYNC))),
            ]
        plan += [
            (n, POTTERY, lib(LibSpec(POTTERY, POTTERY))),
            (n, REDLOCK_PY, lib(LibSpec(REDLOCK_PY, REDLOCK_PY))),
            (n, AIOREDLOCK, alib(LibSpec(AIOREDLOCK, AIOREDLOCK))),
        ]
    return plan


def run_uncontended(ctx: Context) -> None:
    run_interleaved(ctx, "uncontended", uncontended_plan(ctx.urls))


def run_interleaved(
    ctx: Context,
    workload: str,
    plan: MeterPlan,
    cases: Sequence[ContendedCase] = (),
    case_prefix: str = "",
    scripts: bool = False,
) -> None:
    """Per round: for each number of masters, every library's meter is opened, then
    their slices take turns (see :data:`SLICES`), a library's figure being its cycles
    over its slices' time; then the contended ``cases`` (see :func:`contended_once`).
    ``scripts``: also the EVALSHA calls per cycle on each master (INFO commandstats
    around each slice)."""
    sizes = sorted({n for n, _, _ in plan})
    loop = asyncio.new_event_loop()
    try:
        with redis.Redis.from_url(ctx.urls[0]) as counter:
            for rnd in range(ctx.args.rounds):
                log(f"{workload}: round {rnd + 1}/{ctx.args.rounds}")
                for n in sizes:
                    libs = [(lib, f) for m, lib, f in plan if m == n]
                    _uncontended_round(ctx, loop, n, libs, workload, case_prefix, scripts)
                for c in cases:
                    contended_once(ctx, counter, workload, c, "cycles/s")
    finally:
        loop.close()


def _uncontended_round(
    ctx: Context,
    loop: asyncio.AbstractEventLoop,
    n: int,
    libs: Sequence[tuple[str, MeterFactory]],
    workload: str = "uncontended",
    case_prefix: str = "",
    scripts: bool = False,
) -> None:
    meters: list[tuple[Row, str, Meter]] = []
    clients = [redis.Redis.from_url(u) for u in ctx.urls[:n]] if scripts else []
    tag = "u" if workload == "uncontended" else workload
    try:
        for i, (lib, factory) in enumerate(libs):
            row = ctx.results.row(workload, case_prefix + masters_label(n), lib)
            if row.error:
                continue
            try:
                meter = factory(ctx.urls[:n], f"{ctx.run_id}:{tag}{n}:{i}", loop)
                meter.start()
            except Exception as exc:
                row.fail(exc)
                continue
            meters.append((row, lib, meter))
        totals: dict[str, list[float]] = {lib: [0, 0.0, 0] for _, lib, _ in meters}
        for _ in range(SLICES):
            for row, lib, meter in meters:
                if row.error:
                    continue
                try:
                    calls0 = sum(evalsha_calls(clients))
                    cycles, seconds = meter.run(ctx.args.duration / SLICES)
                    totals[lib][2] += sum(evalsha_calls(clients)) - calls0
                except Exception as exc:
                    row.fail(exc)
                    continue
                totals[lib][0] += cycles
                totals[lib][1] += seconds
        for row, lib, _ in meters:
            done, took, calls = totals[lib]
            if row.error or not took:
                continue
            rate = done / took
            row.add("cycles/s", rate)
            if clients and done:
                row.add("scripts/cycle", calls / done / n)
            log(f"  {masters_label(n):10} {lib:24} {rate:9.0f}/s")
    finally:
        for c in clients:
            c.close()
        for row, _, meter in meters:
            try:
                meter.stop()
            except Exception as exc:
                if not row.error:
                    row.note(f"close: {fail_text(exc)}"[:200])


# --------------------------------------------------------------------------- workload 2


@dataclass
class ContendedCase:
    mode: str  # "threads" or "processes"
    workers: int
    masters: int
    spec: LibSpec
    per_worker_backend: bool = False
    permits: int = 1  # holders at once: above 1, the counter is not checked

    @property
    def case(self) -> str:
        return f"{self.workers} {self.mode}, {masters_label(self.masters)}"


def contended_plan(ctx: Context) -> list[ContendedCase]:
    args = ctx.args
    out: list[ContendedCase] = []
    for mode, workers in (("threads", args.threads), ("processes", args.processes)):
        for n in (1, 5):
            if n > len(ctx.urls):
                continue
            rr_label = f"{RR} (one manager)" if mode == "threads" else f"{RR} (manager/process)"
            specs = [(LibSpec(RR, rr_label), False)]
            if mode == "threads":
                specs.append((LibSpec(RR, f"{RR} (manager/thread)"), True))
            if n == 1:
                specs += [
                    (LibSpec(REDIS_PY, f"{REDIS_PY} sleep=0.1", {"sleep": 0.1}), False),
                    (LibSpec(REDIS_PY, f"{REDIS_PY} sleep=0.01", {"sleep": 0.01}), False),
                    (LibSpec(PRL, PRL), False),
                ]
            specs += [(LibSpec(POTTERY, POTTERY), False), (LibSpec(REDLOCK_PY, REDLOCK_PY), False)]
            out += [ContendedCase(mode, workers, n, spec, per) for spec, per in specs]
    return out


def run_workers(
    ctx: Context,
    mode: str,
    workers: int,
    spec: LibSpec,
    masters: Sequence[str],
    params: LoopParams,
    duration: float,
    per_worker_backend: bool = False,
) -> tuple[list[WorkerResult], float, float]:
    if mode == "threads":
        return run_threads(spec, masters, params, workers, duration, per_worker_backend)
    return ctx.pool(max(ctx.args.processes, HANDOFF_WORKERS)).run(
        spec, masters, params, duration, count=workers
    )


def run_contended(ctx: Context) -> None:
    plan = contended_plan(ctx)
    with redis.Redis.from_url(ctx.urls[0]) as counter:
        for rnd in range(ctx.args.rounds):
            log(f"contended: round {rnd + 1}/{ctx.args.rounds}")
            for c in plan:
                contended_once(ctx, counter, "contended", c)


def contended_once(
    ctx: Context, counter: redis.Redis, workload: str, c: ContendedCase, metric: str = "incr/s"
) -> None:
    """One window of ``c``: its workers loop acquire, GET and SET +1 of a counter,
    release. The counter is checked when one holder at a time is promised (permits 1)."""
    row = ctx.results.row(workload, c.case, c.spec.label)
    if row.error:
        return
    tag = ("" if workload == "contended" else f"{workload}:") + (
        f"{c.mode[0]}{c.masters}:{c.spec.label.replace(' ', '_')}"
    )
    name = f"{ctx.run_id}:c:{tag}"
    key = f"{ctx.run_id}:counter:{tag}"
    counter.delete(key)
    params = LoopParams(name, ctx.urls[0], key)
    try:
        results, _, _ = run_workers(
            ctx,
            c.mode,
            c.workers,
            c.spec,
            ctx.urls[: c.masters],
            params,
            ctx.args.duration,
            c.per_worker_backend,
        )
        final = int(counter.get(key) or 0) if c.permits == 1 else None
    except Exception as exc:
        row.fail(exc)
        return
    row.flags["permits"] = c.permits
    record_contended(row, results, final, ctx.args.duration, metric)


def record_contended(
    row: Row,
    results: Sequence[WorkerResult],
    final: int | None,
    duration: float,
    metric: str = "incr/s",
) -> None:
    """``final``: the counter's value, None for a counter left unchecked."""
    errors = sorted({e for r in results for e in r.errors})
    done = sum(r.total for r in results)
    in_window = [r.in_window for r in results]
    if errors:
        row.note("errors: " + "; ".join(errors)[:200])
    if final is not None and final != done:
        row.flags["lost_updates"] = row.flags.get("lost_updates", 0) + (done - final)
        row.note(f"LOST UPDATES: counter {final}, increments {done}")
    row.flags.setdefault("per_worker", []).append(in_window)
    mean = statistics.mean(in_window) if in_window else 0.0
    share = (min(in_window) / mean) if mean else 0.0
    row.add(metric, sum(in_window) / duration)
    row.add("share", share)
    if any("max_holders" in r.info for r in results):
        row.add("max holders", max(int(r.info.get("max_holders", 0)) for r in results))
    if share < STARVED_SHARE:
        row.flags["starved_rounds"] = row.flags.get("starved_rounds", 0) + 1
    failed = sum(int(r.info.get("lock_calls_failed", 0)) for r in results)
    if failed:
        row.flags["lock_calls_failed"] = row.flags.get("lock_calls_failed", 0) + failed
    if errors and not done:
        row.error = "; ".join(errors)[:300]
    log(
        f"  {row.case:24} {row.library:34} {sum(in_window) / duration:8.0f}/s "
        f"share {share:.2f} exact {'-' if final is None else final == done}"
        + (f" errors {errors}" if errors else "")
    )


# --------------------------------------------------------------------------- workload 3


def handoff_plan(ctx: Context) -> list[tuple[str, int, LibSpec]]:
    out: list[tuple[str, int, LibSpec]] = []
    for mode in ("threads", "processes"):
        for n in (1, 5):
            if n > len(ctx.urls):
                continue
            out.append((mode, n, LibSpec(RR, RR)))
            if n == 1:
                out += [(mode, n, LibSpec(PRL, PRL)), (mode, n, LibSpec(REDIS_PY, REDIS_PY))]
    return out


def run_handoff(ctx: Context) -> None:
    for rnd in range(ctx.args.rounds):
        log(f"handoff: round {rnd + 1}/{ctx.args.rounds}")
        for mode, n, spec in handoff_plan(ctx):
            case = f"{HANDOFF_WORKERS} {mode}, {masters_label(n)}"
            row = ctx.results.row("handoff", case, spec.label)
            if row.error:
                continue
            name = f"{ctx.run_id}:h:{mode[0]}{n}:{spec.label.split()[0]}"
            params = LoopParams(
                name, ctx.urls[0], None, HANDOFF_HOLD_S, HANDOFF_THINK_S, record=True
            )
            try:
                results, start, end = run_workers(
                    ctx, mode, HANDOFF_WORKERS, spec, ctx.urls[:n], params, ctx.args.duration
                )
            except Exception as exc:
                row.fail(exc)
                continue
            errors = sorted({e for r in results for e in r.errors})
            if errors:
                row.note("errors: " + "; ".join(errors)[:200])
            h = handoffs(results, start, end)
            row.add("p50 ms", percentile(h.latencies, 0.5) * 1000)
            row.add("p99 ms", percentile(h.latencies, 0.99) * 1000)
            row.add("hand-offs", len(h.latencies))
            row.add("re-grabs", h.regrabs)
            if h.overlaps:
                row.flags["overlaps"] = row.flags.get("overlaps", 0) + h.overlaps
                row.note(f"OVERLAPS: {h.overlaps} holds began before the previous ended")
            log(
                f"  {case:24} {spec.label:20} p50 {percentile(h.latencies, 0.5) * 1000:7.2f} ms "
                f"p99 {percentile(h.latencies, 0.99) * 1000:7.2f} ms, {len(h.latencies)} "
                f"hand-offs, {h.regrabs} re-grabs"
            )


# --------------------------------------------------------------------------- workload 4


def bad_window(args: argparse.Namespace) -> float:
    return 0.6 if args.quick else max(3.0 * args.duration, 1.0)


def rr_default_master_timeout() -> float:
    from redreentrant._core.settings import default_master_timeout

    return default_master_timeout(LEASE_S)


def measure_bad(
    spec: LibSpec,
    masters: Sequence[str],
    name: str,
    window: float,
    fault: Callable[[], None],
    heal: Callable[[], None],
) -> tuple[list[float], int, dict[str, Any]]:
    """Acquire+release latencies of one lock, for ``window`` seconds after ``fault()``
    (bounded by time: the last operation may end after the window)."""
    backend = open_sync(spec, masters)
    latencies: list[float] = []
    failures = 0
    try:
        ops = backend.new_lock(name)
        for _ in range(20):  # warm-up, healthy: connections open, scripts loaded
            if ops.acquire():
                ops.release()
        fault()
        try:
            end = time.monotonic() + window
            while time.monotonic() < end:
                t0 = time.perf_counter()
                try:
                    if ops.acquire():
                        ops.release()
                    else:
                        failures += 1
                except Exception:
                    failures += 1
                latencies.append(time.perf_counter() - t0)
        finally:
            heal()
    finally:
        backend.close()
    return latencies, failures, dict(backend.info)


def run_badmaster(ctx: Context) -> None:
    from redreentrant.testing.proxy import TcpProxy

    if len(ctx.urls) < 5:
        log("badmaster: needs 5 masters; skipped")
        ctx.results.facts["badmaster"] = "skipped: needs 5 masters"
        return
    masters = ctx.urls[:5]
    timeout = rr_default_master_timeout()
    ctx.results.facts["badmaster_rr_master_timeout_s"] = timeout
    ctx.results.facts["badmaster_pottery_socket_timeout_s"] = timeout
    # A blocking acquire gives up after BAD_OP_WAIT_S (a failed op): one op must not
    # outlast the run.
    specs = [
        LibSpec(RR, RR, {"wait": BAD_OP_WAIT_S}),
        LibSpec(POTTERY, POTTERY, {"socket_timeout": timeout, "wait": BAD_OP_WAIT_S}),
    ]
    ensemble = ctx.ensemble
    bad_url = masters[BAD_INDEX]
    bad_port = int(bad_url.rsplit(":", 1)[1].split("/")[0])
    window = bad_window(ctx.args)

    with TcpProxy(bad_port) as proxy:
        proxied = [*masters[:BAD_INDEX], proxy.url(), *masters[BAD_INDEX + 1 :]]

        def nothing() -> None:
            pass

        def freeze() -> None:
            ensemble[BAD_INDEX].pause()

        def thaw() -> None:
            if ensemble[BAD_INDEX].paused:
                ensemble[BAD_INDEX].resume()

        conditions: list[tuple[str, Sequence[str], Callable[[], None], Callable[[], None]]] = [
            ("healthy", masters, nothing, nothing)
        ]
        if ensemble is not None:
            conditions.append(("1 frozen (SIGSTOP)", masters, freeze, thaw))
        else:
            ctx.results.facts["badmaster_frozen"] = "skipped: --masters given (no process to stop)"
        conditions.append(("1 blackholed (proxy)", proxied, proxy.blackhole, proxy.pass_through))

        for rnd in range(ctx.args.rounds):
            log(f"badmaster: round {rnd + 1}/{ctx.args.rounds}")
            for cond, urls, fault, heal in conditions:
                for spec in specs:
                    row = ctx.results.row("badmaster", cond, spec.label)
                    if row.error:
                        continue
                    tag = cond.replace(" ", "_").replace("(", "").replace(")", "")
                    name = f"{ctx.run_id}:b:{rnd}:{tag}:{spec.key.split()[0]}"
                    try:
                        lat, failures, info = measure_bad(spec, urls, name, window, fault, heal)
                    except Exception as exc:
                        row.fail(exc)
                        continue
                    row.add("p50 ms", percentile(lat, 0.5) * 1000)
                    row.add("p99 ms", percentile(lat, 0.99) * 1000)
                    row.add("ops", len(lat))
                    row.add("failed", failures)
                    if "master_timeout" in info:
                        row.note(f"master_timeout {info['master_timeout']:g}s (default)")
                    if info.get("socket_timeout"):
                        row.note(f"socket timeouts {info['socket_timeout']:g}s")
                    log(
                        f"  {cond:22} {spec.label:16} p50 {percentile(lat, 0.5) * 1000:8.2f} ms "
                        f"p99 {percentile(lat, 0.99) * 1000:8.2f} ms, {len(lat)} ops, "
                        f"{failures} failed"
                    )


# --------------------------------------------------------------------------- workload 5


def held_window(args: argparse.Namespace) -> float:
    return 1.2 if args.quick else max(3.0 * args.duration, HELD_LEASE_S)


def evalsha_calls(clients: Sequence[redis.Redis]) -> list[int]:
    out = []
    for c in clients:
        stats = c.info("commandstats")
        out.append(int(stats.get("cmdstat_evalsha", {}).get("calls", 0)))
    return out


class TickWatch:
    """Counts the watchdog's renewal ticks by polling the PTTL of one held key on one
    master: a renewal sets it back up to the lease. Keeps its own CPU time apart, so
    that it can be taken off the process's."""

    def __init__(self, url: str, key: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.key = key
        self.ticks: list[float] = []
        self.cpu = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="tick-watch")

    def _run(self) -> None:
        cpu0 = time.thread_time()
        last = None
        while not self._stop.wait(0.01):
            pttl = int(self.client.pttl(self.key))
            if last is not None and pttl > last + 50:
                self.ticks.append(time.monotonic())
            last = pttl
        self.cpu = time.thread_time() - cpu0

    def __enter__(self) -> TickWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self.client.close()


def latency_window(lock: Any, window: float) -> list[float]:
    out: list[float] = []
    end = time.monotonic() + window
    while time.monotonic() < end:
        t0 = time.perf_counter()
        if not lock.acquire(timeout=30.0):
            raise RuntimeError("probe lock: acquire returned False")
        lock.release()
        out.append(time.perf_counter() - t0)
    return out


def run_held_one(ctx: Context, n: int, count: int) -> None:
    from redreentrant import LockManager
    from redreentrant._core import keys

    row = ctx.results.row("held", masters_label(n), RR)
    window = held_window(ctx.args)
    masters = ctx.urls[:n]
    lost = [0]

    def on_lost(_: object) -> None:
        lost[0] += 1

    prefix = f"{ctx.run_id}:held{n}"
    with LockManager(masters, lease=HELD_LEASE_S, on_lost=on_lost) as mgr:
        probe = mgr.lock(f"{prefix}:probe")
        watched = keys.lock_key(f"{prefix}:0:0")  # a lock the holders will hold
        latency_window(probe, min(0.2, window))  # warm-up
        # The tick watcher polls in every window, so that all windows pay for it alike.
        with TickWatch(masters[0], watched):
            base = latency_window(probe, window)
        row.add("p99 without ms", percentile(base, 0.99) * 1000)
        row.add("p50 without ms", percentile(base, 0.5) * 1000)

        per = count // HELD_HOLDER_THREADS
        acquired = threading.Barrier(HELD_HOLDER_THREADS + 1)
        release = threading.Event()
        released = threading.Barrier(HELD_HOLDER_THREADS + 1)
        errors: list[str] = []

        def holder(k: int) -> None:
            # The holding threads live until the end: a thread that ends holding a
            # watchdog-managed lock has it released by the watchdog.
            locks = [mgr.lock(f"{prefix}:{k}:{i}") for i in range(per)]
            taken = []
            try:
                for lk in locks:
                    if lk.acquire(timeout=30.0):
                        taken.append(lk)
            except Exception as exc:
                errors.append(fail_text(exc))
            with contextlib.suppress(threading.BrokenBarrierError):
                acquired.wait()
            release.wait()
            for lk in taken:
                try:
                    lk.release()
                except Exception as exc:
                    errors.append(fail_text(exc))
            with contextlib.suppress(threading.BrokenBarrierError):
                released.wait()

        threads = [
            threading.Thread(target=holder, args=(k,), daemon=True, name=f"holder-{k}")
            for k in range(HELD_HOLDER_THREADS)
        ]
        t0 = time.monotonic()
        try:
            for t in threads:
                t.start()
            acquired.wait(300)
            row.add("acquire all s", time.monotonic() - t0)
            clients = [redis.Redis.from_url(u) for u in masters]
            try:
                loaded: list[float] = []
                ticks_loaded = 0
                for _ in range(ctx.args.rounds):
                    with TickWatch(masters[0], watched) as watch:
                        part = latency_window(probe, window)
                    loaded += part
                    ticks_loaded += len(watch.ticks)
                    row.add("p99 during ticks ms", percentile(part, 0.99) * 1000)
                    row.add("p50 during ticks ms", percentile(part, 0.5) * 1000)
                row.flags["ticks_in_loaded_windows"] = ticks_loaded
                # A quiet window: only the watchdog sends scripts.
                calls0 = evalsha_calls(clients)
                cpu0 = time.process_time()
                with TickWatch(masters[0], watched) as watch:
                    time.sleep(window)
                cpu = time.process_time() - cpu0 - watch.cpu
                calls = sum(evalsha_calls(clients)) - sum(calls0)
                ticks = max(len(watch.ticks), 1)
                row.add("script calls/tick", calls / ticks)
                row.add("cpu ms/tick", cpu / ticks * 1000)
                row.flags["quiet_window_ticks"] = len(watch.ticks)
            finally:
                for c in clients:
                    c.close()
            t1 = time.monotonic()
            release.set()
            released.wait(300)
            row.add("release all s", time.monotonic() - t1)
        finally:
            release.set()
            for t in threads:
                t.join(60)
        with TickWatch(masters[0], watched):
            after = latency_window(probe, window)
        row.add("p99 without ms", percentile(after, 0.99) * 1000)
        row.add("p50 without ms", percentile(after, 0.5) * 1000)
    row.flags["held"] = count
    row.flags["lease_s"] = HELD_LEASE_S
    row.flags["on_lost_calls"] = lost[0]
    if lost[0]:
        row.note(f"LOST: on_lost called {lost[0]} times")
    if errors:
        row.note("errors: " + "; ".join(sorted(set(errors)))[:200])
    log(
        f"  {masters_label(n)}: p99 without {row.median('p99 without ms'):.2f} ms, "
        f"during ticks {row.median('p99 during ticks ms'):.2f} ms, "
        f"{row.median('script calls/tick'):.0f} script calls/tick, "
        f"{row.median('cpu ms/tick'):.1f} ms CPU/tick, on_lost {lost[0]}"
    )


def run_held(ctx: Context) -> None:
    for n in (1, 5):
        if n > len(ctx.urls):
            continue
        log(f"held: {ctx.args.held} locks on {masters_label(n)}")
        row = ctx.results.row("held", masters_label(n), RR)
        try:
            run_held_one(ctx, n, ctx.args.held)
        except Exception as exc:
            row.fail(exc)


# --------------------------------------------------------------------------- workloads 6-8

RR_LOCK = f"{RR} lock"
RR_ASYNC_LOCK = f"{RR_ASYNC} lock"
NESTED3 = f"{RR} 3 nested locks"
UPGRADEABLE = f"{RR} rw.upgradeable"
UPGRADE = f"{RR} upgradeable+upgrade+downgrade"
SEM_PERMITS = (1, 4)


def sem_label(lib: str, permits: int) -> str:
    return f"{lib} semaphore P={permits}"


def rr_factory(label: str, kind: str, flavour: str = RR) -> tuple[str, MeterFactory]:
    spec = LibSpec(flavour, label, {"kind": kind})
    return label, alib(spec) if flavour == RR_ASYNC else lib(spec)


def kinds_plan(urls: Sequence[str], kinds: Sequence[tuple[str, MeterFactory]]) -> MeterPlan:
    return [(n, label, f) for n in (1, 5) if n <= len(urls) for label, f in kinds]


def run_semaphore(ctx: Context) -> None:
    kinds = [
        rr_factory(RR_LOCK, "lock"),
        *(rr_factory(sem_label(RR, p), f"semaphore:{p}") for p in SEM_PERMITS),
        rr_factory(RR_ASYNC_LOCK, "lock", RR_ASYNC),
        rr_factory(sem_label(RR_ASYNC, 1), "semaphore:1", RR_ASYNC),
    ]
    # Every contending row counts its holds in force (the lock's too: the same cost).
    specs = [(RR_LOCK, "lock", 1), *((sem_label(RR, p), f"semaphore:{p}", p) for p in SEM_PERMITS)]
    cases = [
        ContendedCase(
            "threads",
            ctx.args.threads,
            n,
            LibSpec(RR, label, {"kind": kind, "count_holders": True}),
            permits=p,
        )
        for n in (1, 5)
        if n <= len(ctx.urls)
        for label, kind, p in specs
    ]
    run_interleaved(ctx, "semaphore", kinds_plan(ctx.urls, kinds), cases, "1 thread, ", True)


def run_multilock(ctx: Context) -> None:
    kinds = [
        rr_factory(RR_LOCK, "lock"),
        rr_factory(f"{RR} multi_lock of 3", "multi:3"),
        rr_factory(NESTED3, "nested:3"),
    ]
    run_interleaved(ctx, "multilock", kinds_plan(ctx.urls, kinds), scripts=True)


def run_upgrade(ctx: Context) -> None:
    kinds = [
        rr_factory(UPGRADEABLE, "rw:upgradeable"),
        rr_factory(UPGRADE, "upgrade"),
        rr_factory(f"{RR} rw.write", "rw:write"),
        rr_factory(RR_LOCK, "lock"),
    ]
    run_interleaved(ctx, "upgrade", kinds_plan(ctx.urls, kinds), scripts=True)


def reference(workload: str, library: str) -> str:
    """The row a row of workloads 6-8 is compared with (÷ ref), in the same case."""
    if workload == "semaphore":
        return RR_ASYNC_LOCK if library.startswith(RR_ASYNC) else RR_LOCK
    return NESTED3 if workload == "multilock" else UPGRADEABLE


# --------------------------------------------------------------------------- workload 9

FAILOVER_LEASE_S = 1.0  # the candidates' and the observer's lease
FAILOVER_KILLS = 3  # leaders killed per round and number of masters (--quick: 1)
FAILOVER_RESIGNS = 5  # leaders that resign per round and number of masters (--quick: 1)
FAILOVER_WAIT_S = 15.0  # for a process's answer (the first includes the imports)
KILLED = "killed (SIGKILL)"
RESIGNED = "resigned"


def failover_candidate(urls: list[str], name: str, lease: float, conn: Connection) -> None:
    """A candidate of election ``name``, in a process of its own. Commands from the
    parent: "campaign" (answers "campaigning", then "leading" with the
    ``time.monotonic()`` at which ``campaign()`` returned and the term), "resign"
    (answers "resigned" with the instant ``resign()`` was called), "exit" (resigns if
    it leads, then ends). The parent kills it (SIGKILL) to make a leader die."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us; Ctrl-C is its
    ensure_repo_importable()
    from redreentrant import LockManager

    try:
        with LockManager(urls, lease=lease) as mgr:
            election = mgr.election(name)
            election.leader()  # connections open before anything is timed
            conn.send(("ready",))
            while (command := conn.recv()) != "exit":
                if command == "campaign":
                    conn.send(("campaigning",))
                    election.campaign(value=str(os.getpid()))
                    conn.send(("leading", time.monotonic(), election.term))
                elif command == "resign":
                    t_resign = time.monotonic()
                    election.resign()
                    conn.send(("resigned", t_resign))
            if election.is_owned():
                election.resign()
    except Exception as exc:
        with contextlib.suppress(Exception):
            conn.send(("error", fail_text(exc)))


def failover_observer(urls: list[str], name: str, lease: float, conn: Connection) -> None:
    """An observer of election ``name``, in a process of its own: reports each change
    ``observe()`` yields ("seen", ``time.monotonic()``, the term or None) until the
    parent kills it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ensure_repo_importable()
    from redreentrant import LockManager

    try:
        with LockManager(urls, lease=lease) as mgr:
            changes = mgr.election(name).observe()
            next(changes)
            conn.send(("observing",))
            for view in changes:
                conn.send(("seen", time.monotonic(), None if view is None else view.term))
    except Exception as exc:
        with contextlib.suppress(Exception):
            conn.send(("error", fail_text(exc)))


class Child:
    """A spawned process running ``target(urls, name, lease, conn)``, and its end of
    the pipe."""

    def __init__(
        self, mp: Any, target: Callable[..., None], urls: Sequence[str], name: str, lease: float
    ) -> None:
        self.conn, theirs = mp.Pipe()
        self.process = mp.Process(
            target=target, args=(list(urls), name, lease, theirs), daemon=True, name=target.__name__
        )
        self.process.start()
        theirs.close()

    def send(self, command: str) -> None:
        self.conn.send(command)

    def expect(
        self,
        kind: str,
        match: Callable[[tuple[Any, ...]], bool] = lambda msg: True,
        timeout: float = FAILOVER_WAIT_S,
    ) -> tuple[Any, ...]:
        """The next message of ``kind`` that ``match``es (others are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                if left <= 0 or not self.conn.poll(left):
                    raise RuntimeError(f"{self.process.name}: no {kind!r} within {timeout:g}s")
                msg = self.conn.recv()
            except EOFError:
                raise RuntimeError(f"{self.process.name}: ended, expecting {kind!r}") from None
            if msg[0] == "error":
                raise RuntimeError(f"{self.process.name}: {msg[1]}")
            if msg[0] == kind and match(msg):
                return msg

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5.0)
        self.conn.close()


@dataclass
class Failover:
    """One leader's end and the next leader, in ``time.monotonic()`` seconds."""

    ended: float  # the leader killed (the parent, before SIGKILL) or resign() called
    led: float  # the next leader's campaign() returned
    seen: float  # the observer was told of the next leader
    expired: float | None  # killed: its hold ran out on a quorum (from the PTTLs)
    term_grew: bool


class FailoverFleet:
    """On one set of masters: a leader and a standby queued behind it, each a spawned
    process with a manager of its own, and an observer process."""

    def __init__(self, urls: Sequence[str], name: str, lease: float, rng: random.Random) -> None:
        from redreentrant._core import keys

        self._mp = multiprocessing.get_context("spawn")
        self.urls, self.name, self.lease = list(urls), name, lease
        self.children: list[Child] = []
        self.clients = [redis.Redis.from_url(u) for u in urls]
        self.lock_key = keys.aux_key(name, "election")
        self.queue_key = keys.aux_key(name, "election:queue")
        self.term = 0
        self._rng = rng

    def _spawn(self, target: Callable[..., None]) -> Child:
        ensure_repo_importable()  # the children get this process's sys.path
        child = Child(self._mp, target, self.urls, self.name, self.lease)
        self.children.append(child)
        return child

    def start(self) -> None:
        self.observer = self._spawn(failover_observer)
        self.leader = self._spawn(failover_candidate)
        self.standby = self._spawn(failover_candidate)
        self.observer.expect("observing")
        for c in (self.leader, self.standby):
            c.expect("ready")
        self.leader.send("campaign")
        self.term = self.leader.expect("leading")[2]
        self.observer.expect("seen", lambda msg: msg[2] == self.term)
        self._queue(self.standby)

    def _queue(self, child: Child) -> None:
        """``child`` campaigns: back once it is queued behind the leader on every master
        (the queue holds the waiting candidates, the leader no longer)."""
        child.send("campaign")
        child.expect("campaigning")
        deadline = time.monotonic() + FAILOVER_WAIT_S
        while not all(int(c.llen(self.queue_key)) >= 1 for c in self.clients):
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not queue on every master")
            time.sleep(0.005)

    def _next(self, ended: float, expired: float | None) -> Failover:
        led, term = self.standby.expect("leading", timeout=3 * self.lease + FAILOVER_WAIT_S)[1:]
        seen = self.observer.expect("seen", lambda msg: msg[2] == term)[1]
        grew = term > self.term
        self.term = term
        return Failover(ended, led, seen, expired, grew)

    def kill_leader(self) -> Failover:
        """SIGKILL the leader at a random point of its renewal cycle: the standby leads
        once the lease runs out; a new process queues behind it."""
        # The leader began to lead just now (the fleet started, or the last failover):
        # without this wait, every kill would come right after a renewal.
        time.sleep(self._rng.uniform(0.0, self.lease / 3))
        ended = time.monotonic()
        self.leader.process.kill()
        # When the dead leader's hold runs out on a quorum (read after the kill: no
        # renewal can come later): the needed-th earliest end of the masters'.
        ends = sorted(time.monotonic() + int(c.pttl(self.lock_key)) / 1000 for c in self.clients)
        out = self._next(ended, ends[len(ends) // 2])
        dead = self.leader
        dead.stop()
        self.children.remove(dead)
        self.leader = self.standby
        self.standby = self._spawn(failover_candidate)
        self.standby.expect("ready")
        self._queue(self.standby)
        return out

    def resign_leader(self) -> Failover:
        """The leader resigns: the standby is woken and leads; the old leader
        campaigns again, behind it."""
        self.leader.send("resign")
        out = self._next(self.leader.expect("resigned")[1], None)
        self.leader, self.standby = self.standby, self.leader
        self._queue(self.standby)
        return out

    def stop(self) -> None:
        """Candidates resign and end (the standby once it leads); the observer, and
        every process still there after 2 leases, are killed."""
        for c in self.children:
            if c is not self.observer:
                with contextlib.suppress(Exception):
                    c.send("exit")
        deadline = time.monotonic() + 2 * self.lease + 3.0
        for c in self.children:
            if c is not self.observer:
                c.process.join(max(0.0, deadline - time.monotonic()))
        for c in self.children:
            c.stop()
        self.children.clear()
        for client in self.clients:
            client.close()


def record_failover(row: Row, how: str, f: Failover, lease: float) -> None:
    to_next, observer = f.led - f.ended, f.seen - f.ended
    if how == KILLED:
        row.add("next leader s", to_next)
        row.add("observer s", observer)
        if f.expired is not None:
            row.add("past expiry ms", (f.led - f.expired) * 1000)
    else:
        row.add("next leader ms", to_next * 1000)
        row.add("observer ms", observer * 1000)
    row.add("÷ lease", to_next / lease)
    row.add("observer lag ms", (f.seen - f.led) * 1000)
    if not f.term_grew:
        row.flags["term_not_grown"] = row.flags.get("term_not_grown", 0) + 1
        row.note("TERM DID NOT GROW")
    log(
        f"  {row.case:28} next leader after {to_next * 1000:8.2f} ms "
        f"({to_next / lease:.3f} x lease), observer after {observer * 1000:8.2f} ms"
    )


def run_failover(ctx: Context) -> None:
    kills, resigns = (1, 1) if ctx.args.quick else (FAILOVER_KILLS, FAILOVER_RESIGNS)
    lease = FAILOVER_LEASE_S
    ctx.results.facts["failover_lease_s"] = lease
    rng = random.Random(0)  # when in its renewal cycle each leader is killed
    plan = [  # interleaved: killed, resigned, killed, ...
        how
        for i in range(max(kills, resigns))
        for how, count in ((KILLED, kills), (RESIGNED, resigns))
        if i < count
    ]
    for rnd in range(ctx.args.rounds):
        log(f"failover: round {rnd + 1}/{ctx.args.rounds}")
        for n in (1, 5):
            if n > len(ctx.urls):
                continue
            rows = {
                how: ctx.results.row("failover", f"{masters_label(n)}, {how}", RR)
                for how in (KILLED, RESIGNED)
            }
            todo = [how for how in plan if not rows[how].error]
            if not todo:
                continue
            fleet = FailoverFleet(ctx.urls[:n], f"{ctx.run_id}:f{n}:{rnd}", lease, rng)
            doing = list(rows)
            try:
                fleet.start()
                for how in todo:
                    doing = [how]
                    f = fleet.kill_leader() if how == KILLED else fleet.resign_leader()
                    record_failover(rows[how], how, f, lease)
            except Exception as exc:
                for how in doing:
                    rows[how].fail(exc)
            finally:
                fleet.stop()


# --------------------------------------------------------------------------- driver


@dataclass
class Context:
    args: argparse.Namespace
    urls: list[str]
    ensemble: Any
    run_id: str
    results: Results
    _pool: ProcessPool | None = None

    def pool(self, n: int) -> ProcessPool:
        if self._pool is None:
            log(f"starting {n} worker processes (spawn)")
            self._pool = ProcessPool(n)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


RUNNERS: dict[str, Callable[[Context], None]] = {
    "uncontended": run_uncontended,
    "contended": run_contended,
    "handoff": run_handoff,
    "badmaster": run_badmaster,
    "held": run_held,
    "semaphore": run_semaphore,
    "multilock": run_multilock,
    "upgrade": run_upgrade,
    "failover": run_failover,
}


# --------------------------------------------------------------------------- report


def print_uncontended(results: Results) -> None:
    rows = results.of("uncontended")
    if not rows:
        return
    print("\nUNCONTENDED: acquire+release cycles/s, one thread or task, one lock")
    print("(median [min-max] over the rounds; ratio = cycles/s / RAW floor (sync), same masters)")
    header = f"{'masters':9}  {'library':24}  {'cycles/s':>22}  {'÷ raw':>6}  note"
    print(header)
    print("-" * len(header))
    for r in rows:
        raw = results.get("uncontended", r.case, RAW_SYNC)
        base = raw.median("cycles/s") if raw else None
        med = r.median("cycles/s")
        ratio = f"{med / base:.2f}" if med and base else "-"
        note = r.error or "; ".join(r.notes)
        print(f"{r.case:9}  {r.library:24}  {cell(r, 'cycles/s'):>22}  {ratio:>6}  {note}")


def print_contended(results: Results) -> None:
    rows = results.of("contended")
    if not rows:
        return
    print("\nCONTENDED: increments/s of a counter updated under the lock (GET, SET +1)")
    print(
        f"(share = fewest increments of one worker / mean, per round; starved below "
        f"{STARVED_SHARE}; exact = counter equals the increments done)"
    )
    header = (
        f"{'case':24}  {'library':34}  {'incr/s':>20}  {'share':>17}  {'exact':5}  "
        f"{'starved':7}  note"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        lost = r.flags.get("lost_updates", 0)
        exact = "-" if not r.metrics else ("NO" if lost else "yes")
        starved = r.flags.get("starved_rounds", 0)
        rounds = len(r.metrics.get("share", []))
        starved_text = f"{starved}/{rounds}" if rounds else "-"
        notes = list(r.notes)
        if r.flags.get("lock_calls_failed"):
            notes.append(f"{r.flags['lock_calls_failed']} lock() calls gave up (retried)")
        note = r.error or "; ".join(notes)
        print(
            f"{r.case:24}  {r.library:34}  {cell(r, 'incr/s'):>20}  {cell(r, 'share', 2):>17}  "
            f"{exact:5}  {starved_text:7}  {note}"
        )


def print_handoff(results: Results) -> None:
    rows = results.of("handoff")
    if not rows:
        return
    print(
        f"\nHAND-OFF: from release() to another waiter's acquire() returning, ms "
        f"(hold {HANDOFF_HOLD_S * 1000:g} ms, then {HANDOFF_THINK_S * 1000:g} ms outside)"
    )
    header = (
        f"{'case':24}  {'library':20}  {'p50 ms':>20}  {'p99 ms':>22}  {'hand-offs':>9}  "
        f"{'re-grabs':>8}  note"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        note = r.error or "; ".join(r.notes)
        print(
            f"{r.case:24}  {r.library:20}  {cell(r, 'p50 ms', 2):>20}  {cell(r, 'p99 ms', 2):>22}  "
            f"{fmt_value(r.median('hand-offs')):>9}  {fmt_value(r.median('re-grabs')):>8}  {note}"
        )


def print_badmaster(results: Results) -> None:
    rows = results.of("badmaster")
    if not rows:
        return
    facts = results.facts
    print(
        f"\nONE BAD MASTER OF 5: acquire+release latency, ms (redreentrant master_timeout "
        f"{facts.get('badmaster_rr_master_timeout_s', '?')}s = its default; pottery's "
        f"clients get the same socket time-outs)"
    )
    header = (
        f"{'condition':22}  {'library':16}  {'p50 ms':>24}  {'p99 ms':>24}  {'ops':>6}  "
        f"{'failed':>6}  note"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        ops = r.metrics.get("ops", [])
        failed = r.metrics.get("failed", [])
        note = r.error or "; ".join(r.notes)
        print(
            f"{r.case:22}  {r.library:16}  {cell(r, 'p50 ms', 2):>24}  {cell(r, 'p99 ms', 2):>24}  "
            f"{int(sum(ops)):>6}  {int(sum(failed)):>6}  {note}"
        )
    for k in ("badmaster_frozen", "badmaster"):
        if k in facts:
            print(f"  ({facts[k]})")


def print_held(results: Results) -> None:
    rows = results.of("held")
    if not rows:
        return
    print(
        f"\nHELD LOCKS: probe lock's acquire+release latency, ms, while one manager holds "
        f"N watchdog-managed locks (lease {HELD_LEASE_S:g}s, renewed every "
        f"{HELD_LEASE_S / 3:g}s)"
    )
    header = (
        f"{'masters':9}  {'held':>6}  {'p99 without':>20}  {'p99 during ticks':>20}  "
        f"{'p50 w/o / during':>16}  {'acquire all s':>13}  {'scripts/tick':>12}  "
        f"{'CPU ms/tick':>11}  {'on_lost':>7}  note"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        p50_without = fmt_value(r.median("p50 without ms"), 2)
        p50 = f"{p50_without} / {fmt_value(r.median('p50 during ticks ms'), 2)}"
        note = r.error or "; ".join(r.notes)
        print(
            f"{r.case:9}  {r.flags.get('held', '-'):>6}  {cell(r, 'p99 without ms', 2):>20}  "
            f"{cell(r, 'p99 during ticks ms', 2):>20}  {p50:>16}  "
            f"{fmt_value(r.median('acquire all s'), 1):>13}  "
            f"{fmt_value(r.median('script calls/tick')):>12}  "
            f"{fmt_value(r.median('cpu ms/tick'), 1):>11}  {r.flags.get('on_lost_calls', '-'):>7}  "
            f"{note}"
        )


KIND_TITLES = {
    "semaphore": "SEMAPHORE: permits acquired+released per second, against a plain lock",
    "multilock": "MULTI-LOCK: acquire+release cycles/s of 3 names, one thread",
    "upgrade": "UPGRADE: cycles/s of the upgradeable side, with and without an upgrade",
}


def print_kinds(results: Results, workload: str) -> None:
    rows = results.of(workload)
    if not rows:
        return
    print(f"\n{KIND_TITLES[workload]}")
    print(
        "(median [min-max] over the rounds; ÷ ref = cycles/s over those of "
        + ("the lock of the same flavour" if workload == "semaphore" else reference(workload, ""))
        + ", same case; scripts/cycle = EVALSHA calls per cycle on each master)"
    )
    if workload == "semaphore":
        print(
            "(contended: each holder does GET, SET +1 of a counter; exact = the counter "
            "equals the holds (P=1 and lock only); max held = most holds in force at once "
            "in the process, over the rounds)"
        )
    header = (
        f"{'case':21}  {'library':45}  {'cycles/s':>22}  {'÷ ref':>6}  {'µs/cycle':>8}  "
        f"{'scripts/cycle':>13}"
        + (f"  {'share':>17}  {'exact':5}  {'max held':>8}" if workload == "semaphore" else "")
        + "  note"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        ref = results.get(workload, r.case, reference(workload, r.library))
        base = ref.median("cycles/s") if ref else None
        med = r.median("cycles/s")
        ratio = f"{med / base:.2f}" if med and base else "-"
        line = (
            f"{r.case:21}  {r.library:45}  {cell(r, 'cycles/s'):>22}  {ratio:>6}  "
            f"{fmt_value(1e6 / med if med and 'share' not in r.metrics else None, 1):>8}  "
            f"{fmt_value(r.median('scripts/cycle'), 2):>13}"
        )
        if workload == "semaphore":
            exact = "-"
            if "share" in r.metrics and r.flags.get("permits") == 1:
                exact = "NO" if r.flags.get("lost_updates") else "yes"
            most = r.metrics.get("max holders")
            line += (
                f"  {cell(r, 'share', 2):>17}  {exact:5}  "
                f"{fmt_value(max(most) if most else None):>8}"
            )
        print(f"{line}  {r.error or '; '.join(r.notes)}")
    if workload == "upgrade":
        for case in dict.fromkeys(r.case for r in rows):
            up = results.get(workload, case, UPGRADE)
            base_row = results.get(workload, case, UPGRADEABLE)
            a = up.median("cycles/s") if up else None
            b = base_row.median("cycles/s") if base_row else None
            if a and b:
                print(f"  {case}: upgrade() + downgrade() add {1e6 / a - 1e6 / b:.1f} µs a cycle")


def print_failover(results: Results) -> None:
    rows = results.of("failover")
    if not rows:
        return
    lease = results.facts.get("failover_lease_s", FAILOVER_LEASE_S)
    print(
        f"\nFAILOVER: from a leader's end (killed: the parent's SIGKILL; resigned: resign() "
        f"called) to the next leader's campaign() returning, lease {lease:g}s renewed every "
        f"{lease / 3:.2g}s; leader, standby and observer are processes of their own"
    )
    print(
        "(median [min-max] over every failover; past expiry = after the dead leader's hold "
        "ran out on a quorum (its PTTLs); observer = observe() told of the next leader, "
        "after the end; lag = after the next leader led)"
    )
    header = (
        f"{'case':28}  {'next leader':>26}  {'÷ lease':>21}  {'past expiry ms':>20}  "
        f"{'observer':>26}  {'observer lag ms':>20}  {'n':>3}  note"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        if "next leader s" in r.metrics:
            to_next = f"{cell(r, 'next leader s', 3)} s"
            observer = f"{cell(r, 'observer s', 3)} s"
        else:
            to_next = f"{cell(r, 'next leader ms', 2)} ms"
            observer = f"{cell(r, 'observer ms', 2)} ms"
        note = r.error or "; ".join(r.notes)
        print(
            f"{r.case:28}  {to_next:>26}  {cell(r, '÷ lease', 3):>21}  "
            f"{cell(r, 'past expiry ms', 1):>20}  {observer:>26}  "
            f"{cell(r, 'observer lag ms', 1):>20}  {len(r.metrics.get('÷ lease', [])):>3}  {note}"
        )


# --------------------------------------------------------------------------- targets


@dataclass
class Target:
    what: str
    goal: str
    measured: str
    verdict: str  # PASS, MISS or n/a
    ratio: float | None = None


def _ok(row: Row | None) -> bool:
    return row is not None and not row.error and bool(row.metrics)


def per_round(a: Row | None, b: Row | None, metric: str) -> str:
    """The ratio a/b of each round (the libraries interleaved within it), shown beside
    a target's ratio of medians: how much of a verdict is the machine's noise."""
    if a is None or b is None:
        return ""
    pairs = zip(a.metrics.get(metric, []), b.metrics.get(metric, []), strict=False)
    ratios = [x / y for x, y in pairs if y and not (math.isnan(x) or math.isnan(y))]
    return f" (rounds {', '.join(f'{r:.2f}' for r in ratios)})" if len(ratios) > 1 else ""


def evaluate(results: Results, args: argparse.Namespace) -> list[Target]:
    out: list[Target] = []

    def add(
        what: str, goal: str, ratio: float | None, need: float, text: str = "", rounds: str = ""
    ) -> None:
        if ratio is None or math.isnan(ratio):
            out.append(Target(what, goal, text or "-", "n/a"))
        else:
            verdict = "PASS" if ratio >= need else "MISS"
            out.append(Target(what, goal, (text or f"{ratio:.2f}x") + rounds, verdict, ratio))

    # Contended.
    rr_labels = {"threads": f"{RR} (one manager)", "processes": f"{RR} (manager/process)"}
    for mode, workers in (("threads", args.threads), ("processes", args.processes)):
        for n in (1, 5):
            case = f"{workers} {mode}, {masters_label(n)}"
            rr = results.get("contended", case, rr_labels[mode])
            if rr is None:
                continue
            rr_rate = rr.median("incr/s") if _ok(rr) else None
            if n == 1:
                peers = [
                    r
                    for r in results.of("contended")
                    if r.case == case
                    and not r.library.startswith(RR)
                    and _ok(r)
                    and not r.flags.get("starved_rounds")
                    and not r.flags.get("lost_updates")
                ]
                best = max(peers, key=lambda r: r.median("incr/s") or 0.0, default=None)
                best_rate = best.median("incr/s") if best else None
                ratio = rr_rate / best_rate if rr_rate and best_rate else None
                add(
                    f"contended {case}",
                    f"rr >= best non-starving peer ({best.library if best else 'none'})",
                    ratio,
                    1.0,
                    rounds=per_round(rr, best, "incr/s"),
                )
            else:
                for peer, need in ((POTTERY, 2.0), (REDLOCK_PY, 1.0)):
                    p = results.get("contended", case, peer)
                    p_rate = p.median("incr/s") if _ok(p) and p is not None else None
                    ratio = rr_rate / p_rate if rr_rate and p_rate else None
                    text = ""
                    if p is not None and p.metrics and not p_rate:
                        text = "peer made no progress"
                        ratio = math.inf if rr_rate else None
                    add(
                        f"contended {case}",
                        f"rr >= {need:g}x {peer}",
                        ratio,
                        need,
                        text,
                        per_round(rr, p, "incr/s"),
                    )
    for r in results.of("contended"):
        if r.library.startswith(RR) and r.metrics:
            share = min(r.metrics.get("share", [math.nan]))
            out.append(
                Target(
                    f"contended {r.case}: {r.library.replace(RR + ' ', 'rr ')}",
                    f"no worker starved (fewest share >= {STARVED_SHARE} of mean, every round)",
                    f"min share {share:.2f}",
                    "PASS" if share >= STARVED_SHARE else "MISS",
                    share,
                )
            )

    # One bad master.
    healthy = results.get("badmaster", "healthy", RR)
    h50 = healthy.median("p50 ms") if _ok(healthy) and healthy else None
    for cond in ("1 frozen (SIGSTOP)", "1 blackholed (proxy)"):
        rr = results.get("badmaster", cond, RR)
        pot = results.get("badmaster", cond, POTTERY)
        if rr is None:
            continue
        r50 = rr.median("p50 ms") if _ok(rr) else None
        ratio = h50 / r50 * 2.0 if h50 and r50 else None  # >= 1 iff r50 <= 2 x h50
        text = f"{r50:.2f} ms vs healthy {h50:.2f} ms" if r50 and h50 else ""
        add(f"bad master: {cond}", "rr p50 <= 2x its healthy p50", ratio, 1.0, text)
        p50 = pot.median("p50 ms") if _ok(pot) and pot else None
        if r50 and p50:
            out.append(
                Target(
                    f"bad master: {cond}",
                    "rr p50 < pottery p50",
                    f"{r50:.2f} ms vs {p50:.2f} ms ({p50 / r50:.2f}x)",
                    "PASS" if r50 < p50 else "MISS",
                    p50 / r50,
                )
            )
        else:
            out.append(Target(f"bad master: {cond}", "rr p50 < pottery p50", "-", "n/a"))

    # Uncontended.
    for n in (1, 5):
        case = masters_label(n)
        raw = results.get("uncontended", case, RAW_SYNC)
        rr = results.get("uncontended", case, RR)
        rra = results.get("uncontended", case, RR_ASYNC)
        if rr is None:
            continue
        raw_v = raw.median("cycles/s") if raw and _ok(raw) else None
        rr_v = rr.median("cycles/s") if _ok(rr) else None
        rra_v = rra.median("cycles/s") if rra and _ok(rra) else None
        add(
            f"uncontended {case}",
            "rr sync >= 0.8x RAW floor (sync)",
            rr_v / raw_v if rr_v and raw_v else None,
            0.8,
            rounds=per_round(rr, raw, "cycles/s"),
        )
        add(
            f"uncontended {case}",
            "rr asyncio >= 0.9x rr sync",
            rra_v / rr_v if rra_v and rr_v else None,
            0.9,
            rounds=per_round(rra, rr, "cycles/s"),
        )

    # Held locks.
    for r in results.of("held"):
        without = r.median("p99 without ms")
        during = r.median("p99 during ticks ms")
        ratio = 2.0 * without / during if without and during else None
        text = f"{during:.2f} ms vs {without:.2f} ms" if without and during else ""
        add(
            f"{r.flags.get('held', '?')} held locks, {r.case}",
            "p99 during ticks <= 2x p99 without",
            ratio,
            1.0,
            text,
        )
    # Semaphore, multi-lock.
    for workload, prefix, label, ref_label, need in (
        ("semaphore", "1 thread, ", sem_label(RR, 1), RR_LOCK, 0.5),
        ("multilock", "", f"{RR} multi_lock of 3", NESTED3, 1.0),
    ):
        for n in (1, 5):
            case = prefix + masters_label(n)
            row, ref = results.get(workload, case, label), results.get(workload, case, ref_label)
            if row is None:
                continue
            v = row.median("cycles/s") if _ok(row) else None
            r_v = ref.median("cycles/s") if ref and _ok(ref) else None
            add(
                f"{workload} {case}",
                f"{label.replace(RR + ' ', 'rr ')} >= {need:g}x {ref_label.replace(RR + ' ', '')}",
                v / r_v if v and r_v else None,
                need,
                rounds=per_round(row, ref, "cycles/s"),
            )
    for r in results.of("semaphore"):
        if "share" not in r.metrics or not r.library.startswith(f"{RR} semaphore"):
            continue
        permits = r.flags.get("permits", 1)
        most = max(r.metrics.get("max holders", [math.nan]))
        lost = r.flags.get("lost_updates", 0)
        ok = most <= permits and not (permits == 1 and lost)
        out.append(
            Target(
                f"semaphore {r.case}: P={permits}",
                f"at most {permits} held at once"
                + (" and the counter exact" if permits == 1 else ""),
                f"max held {fmt_value(most)}" + (f", {lost} lost updates" if lost else ""),
                "n/a" if math.isnan(most) else "PASS" if ok else "MISS",
            )
        )
    # Failover: a killed leader's successor leads once the lease ran out.
    for r in results.of("failover"):
        if not r.case.endswith(KILLED):
            continue
        frac = r.median("÷ lease") if _ok(r) else None
        worst = max(r.metrics.get("÷ lease", [math.nan]))
        add(
            f"failover {r.case}",
            "next leader <= 1.5x lease after the kill (median)",
            1.5 / frac if frac else None,
            1.0,
            f"{frac:.2f}x lease (max {worst:.2f}x)" if frac else "",
        )
    return out


def print_targets(targets: Sequence[Target]) -> None:
    print("\nTARGETS (ratios within this run)")
    header = f"{'verdict':7}  {'where':50}  {'goal':56}  measured"
    print(header)
    print("-" * len(header))
    for t in targets:
        print(f"{t.verdict:7}  {t.what:50}  {t.goal:56}  {t.measured}")
    counts = {v: sum(t.verdict == v for t in targets) for v in ("PASS", "MISS", "n/a")}
    print(f"{counts['PASS']} PASS, {counts['MISS']} MISS, {counts['n/a']} n/a")


# --------------------------------------------------------------------------- plot


def write_plot(path: Path, results: Results) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    specs: list[tuple[str, list[str], str, bool]] = [
        ("uncontended", ["cycles/s"], "Uncontended acquire+release cycles/s", False),
        ("contended", ["incr/s"], "Contended increments/s", False),
        ("handoff", ["p50 ms", "p99 ms"], "Hand-off latency (ms, log scale)", True),
        ("badmaster", ["p50 ms", "p99 ms"], "One bad master of 5: latency (ms, log scale)", True),
        (
            "held",
            ["p99 without ms", "p99 during ticks ms"],
            "Held locks: p99 (ms, log scale)",
            True,
        ),
        ("semaphore", ["cycles/s"], "Semaphore: permits acquired+released/s", False),
        ("multilock", ["cycles/s"], "Multi-lock of 3: acquire+release cycles/s", False),
        ("upgrade", ["cycles/s"], "Upgradeable read lock: cycles/s", False),
        ("failover", ["÷ lease"], "Failover: to the next leader, x lease (log scale)", True),
    ]
    panels = [(w, metrics, title, results.of(w), log_) for w, metrics, title, log_ in specs]
    panels = [p for p in panels if p[3]]
    if not panels:
        return
    fig, axes = plt.subplots(len(panels), 1, figsize=(13, 4.2 * len(panels)), squeeze=False)
    for ax, (_, metrics, title, rows, log_scale) in zip(axes[:, 0], panels, strict=True):
        labels: list[str] = []
        values: list[float] = []
        lows: list[float] = []
        highs: list[float] = []
        for r in rows:
            for m in metrics:
                med = r.median(m)
                if med is None:
                    continue
                lo, hi = r.spread(m) or (med, med)
                suffix = f" [{m.replace(' ms', '')}]" if len(metrics) > 1 else ""
                labels.append(f"{r.case} | {r.library}{suffix}")
                values.append(med)
                lows.append(med - lo)
                highs.append(hi - med)
        y = list(range(len(values)))
        colors = ["tab:red" if RR in lab else "tab:gray" for lab in labels]
        for i, lab in enumerate(labels):
            if "floor" in lab:
                colors[i] = "tab:blue"
        if not values:
            continue
        # Log panels: the bars start at a positive floor (a bar from 0 has no log end).
        floor = min(values) / 3 if log_scale else 0.0
        widths = [v - floor for v in values]
        if log_scale:
            ax.set_xscale("log")
        ax.barh(y, widths, left=floor, xerr=[lows, highs], color=colors, capsize=2)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{title} (median, min-max over rounds)", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--duration", type=float, help="seconds per measurement (1; --quick 0.2)")
    p.add_argument("--rounds", type=int, help="interleaved repetitions (3; --quick 1)")
    p.add_argument("--only", help=f"comma-separated workloads among: {','.join(WORKLOADS)}")
    p.add_argument("--quick", action="store_true", help="tiny durations: a smoke run")
    p.add_argument("--threads", type=int, default=16, help="contending threads (16)")
    p.add_argument("--processes", type=int, default=8, help="contending processes (8)")
    p.add_argument("--held", type=int, help="locks held in the held workload (10000; --quick 2000)")
    add_masters_arg(p)
    p.add_argument("--json", type=Path, help="also write the results to this JSON file")
    p.add_argument("--plot", type=Path, help="also draw the results into this PNG (matplotlib)")
    args = p.parse_args(argv)
    if args.duration is None:
        args.duration = 0.2 if args.quick else 1.0
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.held is None:
        args.held = 2000 if args.quick else 10_000
    if args.duration <= 0 or args.rounds < 1 or args.threads < 2 or args.processes < 2:
        p.error("--duration and --rounds must be positive; --threads, --processes >= 2")
    if args.held < HELD_HOLDER_THREADS:
        p.error(f"--held must be at least {HELD_HOLDER_THREADS}")
    selected = [w.strip() for w in (args.only or ",".join(WORKLOADS)).split(",") if w.strip()]
    unknown = [w for w in selected if w not in WORKLOADS]
    if unknown or not selected:
        p.error(f"--only: unknown workload(s) {unknown}; choose among {', '.join(WORKLOADS)}")
    args.workloads = [w for w in WORKLOADS if w in selected]
    check_masters_arg(p, args.masters)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    ensure_repo_importable()
    run_id = new_run_id()
    results = Results()
    dists = versions(
        ("redis", "hiredis", "pottery", "python-redis-lock", "redlock-py", "aioredlock", "aioredis")
    )
    print("versions: " + ", ".join(f"{k} {v}" for k, v in dists.items()))
    started = time.monotonic()
    interrupted = False
    with servers_with_handle(args.masters) as (urls, ensemble):
        ctx = Context(args, urls, ensemble, run_id, results)
        redis_version = server_version(urls[0])
        print(
            f"servers: {len(urls)} (redis {redis_version}{', embedded' if ensemble else ''}), "
            f"duration {args.duration:g}s, rounds {args.rounds}, workloads "
            f"{','.join(args.workloads)}, {os.cpu_count()} CPUs, run id {run_id}"
        )
        results.facts.update(
            run_id=run_id,
            versions=dists,
            redis_server=redis_version,
            masters=len(urls),
            duration_s=args.duration,
            rounds=args.rounds,
            quick=args.quick,
            workloads=args.workloads,
        )
        try:
            for workload in args.workloads:
                t0 = time.monotonic()
                RUNNERS[workload](ctx)
                results.facts[f"seconds_{workload}"] = round(time.monotonic() - t0, 1)
                log(f"{workload}: {time.monotonic() - t0:.0f}s")
        except KeyboardInterrupt:
            interrupted = True
            log("interrupted: stopping, cleaning up, printing what was measured")
        finally:
            ctx.close()
            if ensemble is not None:
                for server in ensemble.servers:
                    if server.paused:
                        server.resume()
            deleted = cleanup(urls, run_id)
            log(f"cleanup: deleted {deleted} key(s) matching *{run_id}*")
    results.facts["seconds_total"] = round(time.monotonic() - started, 1)
    print_uncontended(results)
    print_contended(results)
    print_handoff(results)
    print_badmaster(results)
    print_held(results)
    for workload in KIND_TITLES:
        print_kinds(results, workload)
    print_failover(results)
    targets = evaluate(results, args)
    print_targets(targets)
    print(
        f"\ntotal {results.facts['seconds_total']:.0f}s" + (" (interrupted)" if interrupted else "")
    )
    if args.json:
        payload = {
            **results.facts,
            "rows": [asdict(r) for r in results.rows.values()],
            "targets": [asdict(t) for t in targets],
        }
        import json

        args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        try:
            write_plot(args.plot, results)
        except ImportError as exc:
            print(f"no plot: {fail_text(exc)} (pip install -e '.[bench]')")
        except Exception as exc:  # a plot must not lose the figures printed above
            traceback.print_exception(exc, file=sys.stderr)
            print(f"no plot: {fail_text(exc)}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
