"""Uncontended: acquire+release cycles/s from one thread (or task) on one lock, on 1, 3
and 5 masters: redreentrant sync and asyncio (also with fencing and with a no-op
listener), the peers that support that many masters, the RAW floor (redreentrant's two
scripts by EVALSHA on one raw connection per master, sync and asyncio) and the 2xPING
floor (two round trips per cycle).

Every library on the same masters is opened at once, and each measurement is cut into
:data:`SLICES` slices that take turns with the others' (A, B, C, A, B, C, ...): a noisy
spell of the shared machine then slows them all alike, and their ratios hold. The
semaphore, multi-lock and upgrade workloads measure their one-thread cases the same
way (:func:`run_kinds`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis
from benchcommon import (
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
    WARMUP_CYCLES,
    AsyncRawFloor,
    Context,
    LibSpec,
    RawFloor,
    Row,
    evalsha_calls,
    fail_text,
    log,
    masters_label,
    open_async,
    open_sync,
)

from workloads.contended import ContendedCase, contended_once

RAW_SYNC = "RAW floor (sync)"
RAW_ASYNC = "RAW floor (asyncio)"
PING_SYNC = "2xPING floor (sync)"
PING_ASYNC = "2xPING floor (asyncio)"

#: each measurement is cut into this many slices, which take turns with the other
#: libraries' on the same masters
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

#: (masters, library label, meter factory), in interleaving order
MeterPlan = list[tuple[int, str, MeterFactory]]


def lib(spec: LibSpec) -> MeterFactory:
    return lambda m, nm, loop: sync_lib_meter(spec, m, nm)


def alib(spec: LibSpec) -> MeterFactory:
    return lambda m, nm, loop: async_lib_meter(spec, m, nm, loop)


#: the plain lock, beside which the semaphore, multi-lock and upgrade workloads are read
RR_LOCK = f"{RR} lock"
RR_ASYNC_LOCK = f"{RR_ASYNC} lock"


def run_kinds(
    ctx: Context,
    workload: str,
    kinds: Sequence[tuple[str, str, str]],
    cases: Sequence[ContendedCase] = (),
    case_prefix: str = "",
) -> None:
    """Redreentrant's lock ``kinds``, ``(label, kind, flavour)`` (a kind of
    ``benchcommon.open_redreentrant``, the flavour ``RR`` or ``RR_ASYNC``), from one
    thread or task on 1 and 5 masters, with the script calls per cycle; then the
    contended ``cases``."""
    plan: MeterPlan = []
    for n in (1, 5):
        if n > len(ctx.urls):
            continue
        for label, kind, flavour in kinds:
            spec = LibSpec(flavour, label, {"kind": kind})
            plan.append((n, label, alib(spec) if flavour == RR_ASYNC else lib(spec)))
    run_interleaved(ctx, workload, plan, cases, case_prefix, scripts=True)


def uncontended_plan(urls: Sequence[str]) -> MeterPlan:
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


def run(ctx: Context) -> None:
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
    their slices take turns, a library's figure being its cycles over its slices'
    time; then the contended ``cases`` (see ``contended_once``). ``scripts``: also the
    EVALSHA calls per cycle on each master (INFO commandstats around each slice)."""
    sizes = sorted({n for n, _, _ in plan})
    loop = asyncio.new_event_loop()
    try:
        with redis.Redis.from_url(ctx.urls[0]) as counter:
            for rnd in range(ctx.args.rounds):
                log(f"{workload}: round {rnd + 1}/{ctx.args.rounds}")
                for n in sizes:
                    libs = [(lib, f) for m, lib, f in plan if m == n]
                    _round(ctx, loop, n, libs, workload, case_prefix, scripts)
                for c in cases:
                    contended_once(ctx, counter, workload, c, "cycles/s")
    finally:
        loop.close()


def _round(
    ctx: Context,
    loop: asyncio.AbstractEventLoop,
    n: int,
    libs: Sequence[tuple[str, MeterFactory]],
    workload: str,
    case_prefix: str,
    scripts: bool,
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
