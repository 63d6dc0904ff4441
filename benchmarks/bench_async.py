#!/usr/bin/env python3
"""asyncio benchmark: redreentrant.asyncio against redis-py's asyncio Lock and aioredlock.

- uncontended, 1 master: redreentrant.asyncio, redis-py ``redis.asyncio`` Lock,
  aioredlock (and the sync redreentrant as a reference row);
- uncontended, 5 masters: redreentrant.asyncio, aioredlock (and the sync reference);
- contended, 1 master: N tasks (4) increment a counter with a non-atomic GET, sleep,
  SET under the lock: redreentrant.asyncio against redis-py's asyncio Lock.

Prints figures; it asserts nothing about speed and always exits 0 once it has run.
A library that cannot run here (aioredlock needs aioredis 1.3) gets a "not runnable
here" row, and the run goes on.  See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
from benchcommon import (
    LEASE_S,
    WAIT_S,
    WARMUP_CYCLES,
    add_masters_arg,
    check_masters_arg,
    fail_text,
    host_port_db,
    quorum_urls,
    ratio_text,
    run_session,
    write_json,
)

STALL_S = WAIT_S + 15.0

UNCONTENDED_1 = "uncontended-1"
UNCONTENDED_Q = "uncontended-quorum"
CONTENDED = "contended"

RR_ASYNC = "redreentrant.asyncio"
RR_SYNC = "redreentrant (sync)"
REDIS_PY_ASYNC = "redis-py asyncio Lock"
AIOREDLOCK = "aioredlock"


# --------------------------------------------------------------------------- adapters


@dataclass
class AsyncLockOps:
    """One lock instance reduced to the two calls the benchmark needs."""

    acquire: Callable[[], Awaitable[bool]]
    release: Callable[[], Awaitable[None]]


@dataclass
class AsyncBackend:
    """A library bound to a set of masters, opened inside the running event loop;
    ``new_lock`` is called by the task that will own the lock."""

    new_lock: Callable[[str], AsyncLockOps]
    close: Callable[[], Awaitable[None]]


AsyncOpener = Callable[[Sequence[str]], AsyncBackend]


def open_rr_async(urls: Sequence[str]) -> AsyncBackend:
    from redreentrant.asyncio import LockManager

    mgr = LockManager(list(urls), lease=LEASE_S)

    def new_lock(name: str) -> AsyncLockOps:
        lock = mgr.lock(name)
        return AsyncLockOps(lambda: lock.acquire(timeout=WAIT_S), lock.release)

    return AsyncBackend(new_lock, mgr.close)


def open_redis_py_async(urls: Sequence[str]) -> AsyncBackend:
    client = redis.asyncio.Redis.from_url(urls[0])

    def new_lock(name: str) -> AsyncLockOps:
        # Default sleep=0.1 between polls is kept: that is what users get.
        lock = client.lock(name, timeout=LEASE_S, blocking_timeout=WAIT_S)
        return AsyncLockOps(lock.acquire, lock.release)

    return AsyncBackend(new_lock, client.aclose)


def open_aioredlock(urls: Sequence[str]) -> AsyncBackend:
    import aioredlock  # type: ignore[import-untyped]

    dlm = aioredlock.Aioredlock([host_port_db(u) for u in urls])

    def new_lock(name: str) -> AsyncLockOps:
        held: list[Any] = []

        async def acquire() -> bool:
            # A fixed lease (lock_timeout) starts no per-lock extension task. lock() is
            # try-only (3 tries, 0.1-0.3 s apart) and raises LockError when it fails.
            held.append(await dlm.lock(name, lock_timeout=LEASE_S))
            return True

        async def release() -> None:
            await dlm.unlock(held.pop())

        return AsyncLockOps(acquire, release)

    async def close() -> None:
        await dlm.destroy()

    return AsyncBackend(new_lock, close)


OPENERS: dict[str, AsyncOpener] = {
    RR_ASYNC: open_rr_async,
    REDIS_PY_ASYNC: open_redis_py_async,
    AIOREDLOCK: open_aioredlock,
}


# --------------------------------------------------------------------------- results


@dataclass
class Result:
    library: str
    scenario: str
    label: str
    ops_per_s: float | None = None  # median of the samples
    samples: list[float] = field(default_factory=list)  # one per round
    note: str = ""
    error: str | None = None


# --------------------------------------------------------------------------- scenarios


async def measure_uncontended(backend: AsyncBackend, name: str, duration: float) -> float:
    ops = backend.new_lock(name)
    # Warm-up loads scripts and opens connections before the clock starts.
    for _ in range(WARMUP_CYCLES):
        if not await ops.acquire():
            raise RuntimeError("uncontended acquire returned False during warm-up")
        await ops.release()
    cycles = 0
    start = time.perf_counter()
    deadline = start + duration
    now = start
    while now < deadline:
        if not await ops.acquire():
            raise RuntimeError(f"uncontended acquire returned False after {cycles} cycles")
        await ops.release()
        cycles += 1
        now = time.perf_counter()
    return cycles / (now - start)


def measure_uncontended_sync(urls: Sequence[str], name: str, duration: float) -> float:
    """The same loop with the sync manager: what asyncio costs, measured in this run."""
    from redreentrant import LockManager

    with LockManager(list(urls), lease=LEASE_S) as mgr:
        lock = mgr.lock(name)
        for _ in range(WARMUP_CYCLES):
            lock.acquire(timeout=WAIT_S)
            lock.release()
        cycles = 0
        start = now = time.perf_counter()
        while now < start + duration:
            if not lock.acquire(timeout=WAIT_S):
                raise RuntimeError(f"uncontended acquire returned False after {cycles} cycles")
            lock.release()
            cycles += 1
            now = time.perf_counter()
    return cycles / (now - start)


@dataclass
class ContendedRun:
    tasks: int
    seconds: float
    done: int  # increments whose SET went through, as counted by the tasks
    final: int  # the counter as Redis holds it afterwards
    per_task: list[int]
    errors: list[str]

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0


async def run_contended(
    backend: AsyncBackend,
    counter: redis.asyncio.Redis,
    name: str,
    tasks: int,
    duration: float,
    work_s: float,
) -> ContendedRun:
    """Tasks loop until the deadline: acquire, GET, sleep ``work_s``, SET +1, release.

    The sleep hands the loop to the other tasks while the lock is held, so a lock that
    let two tasks in at once would lose increments: the counter would fall short."""
    counter_key = f"{name}:counter"
    await counter.delete(counter_key)
    warm = backend.new_lock(name)
    for _ in range(WARMUP_CYCLES):
        if not await warm.acquire():
            raise RuntimeError("acquire returned False during warm-up")
        await warm.release()
    errors: list[str] = []
    progress = [0] * tasks
    finished = [0.0] * tasks
    start = time.perf_counter()
    deadline = start + duration

    async def worker(slot: int) -> None:
        ops = backend.new_lock(name)  # made by the task that will own it
        try:
            while time.perf_counter() < deadline:
                if not await ops.acquire():
                    errors.append(f"acquire timed out after {WAIT_S:g}s")
                    return
                try:
                    # Deliberately non-atomic: only the lock keeps this correct.
                    value = await counter.get(counter_key)
                    await asyncio.sleep(work_s)
                    await counter.set(counter_key, int(value or 0) + 1)
                    progress[slot] += 1
                finally:
                    await ops.release()
        except Exception as exc:
            errors.append(fail_text(exc))
        finally:
            finished[slot] = time.perf_counter()

    workers = [asyncio.ensure_future(worker(i)) for i in range(tasks)]
    # A hung lock must not hang the benchmark: wait no longer than any acquire may block.
    _, pending = await asyncio.wait(workers, timeout=duration + STALL_S)
    for task in pending:
        task.cancel()
    if pending:
        errors.append(f"{len(pending)} task(s) stalled for {duration + STALL_S:g}s: cancelled")
        await asyncio.wait(pending)
    end = max(finished) if all(finished) else time.perf_counter()
    final = int(await counter.get(counter_key) or 0)
    return ContendedRun(tasks, end - start, sum(progress), final, progress, errors)


# --------------------------------------------------------------------------- driver


def _lock_name(run_id: str, scenario: str, lib: str) -> str:
    return f"{run_id}:async:{scenario}:{lib.split()[0].replace('.', '-')}"


def _record_failure(res: Result, exc: BaseException) -> None:
    res.error = fail_text(exc)
    if res.library == AIOREDLOCK:
        # aioredlock runs on aioredis 1.3, which is not maintained for new Pythons.
        res.error = f"not runnable here: {res.error}"
        print(f"aioredlock: {res.error} ({res.label})")
    print(f"  ! {res.library} / {res.label} failed: {fail_text(exc)}", file=sys.stderr)
    traceback.print_exception(exc, file=sys.stderr)


async def run_uncontended_case(
    res: Result, masters: Sequence[str], name: str, duration: float
) -> None:
    try:
        backend = OPENERS[res.library](masters)
        try:
            res.samples.append(await measure_uncontended(backend, name, duration))
        finally:
            await backend.close()
    except Exception as exc:
        _record_failure(res, exc)
        return
    print(f"  {res.library:22} {res.label:32} {res.samples[-1]:>10.0f}/s", file=sys.stderr)


async def run_contended_case(res: Result, master: str, name: str, args: argparse.Namespace) -> None:
    try:
        backend = OPENERS[res.library]([master])
        try:
            async with redis.asyncio.Redis.from_url(master) as counter:
                run = await run_contended(
                    backend, counter, name, args.tasks, args.duration, args.work_ms / 1000.0
                )
        finally:
            await backend.close()
    except Exception as exc:
        _record_failure(res, exc)
        return
    if run.final != run.done:
        res.error = f"MISMATCH counter={run.final} but {run.done} increments done"
        print(
            f"!!!!! MISMATCH: {res.library} counter={run.final}, tasks did {run.done} "
            "increments -- the lock let writers overlap !!!!!"
        )
    if run.errors:
        res.error = "; ".join([*sorted(set(run.errors)), *([res.error] if res.error else [])])
    if res.error:
        print(f"  ! {res.library} / {res.label} failed: {res.error}", file=sys.stderr)
        return
    res.samples.append(run.rate)
    res.note = (
        f"{run.done} incr in {run.seconds:.2f}s, per task {min(run.per_task)}-"
        f"{max(run.per_task)}, counter ok"
    )
    print(f"  {res.library:22} {res.label:32} {run.rate:>10.0f}/s ({res.note})", file=sys.stderr)


async def run_async_cases(
    plan: Sequence[tuple[str, str]],
    results: dict[tuple[str, str], Result],
    urls: list[str],
    run_id: str,
    args: argparse.Namespace,
) -> None:
    quorum = quorum_urls(urls)
    # Rounds interleave all libraries so slow drifts in machine load hit everyone.
    for rnd in range(args.rounds):
        print(f"round {rnd + 1}/{args.rounds}", file=sys.stderr)
        for scenario, lib in plan:
            res = results[(scenario, lib)]
            if res.error:
                continue  # a failed library stays failed; later rounds skip it
            name = _lock_name(run_id, scenario, lib)
            masters = quorum if scenario == UNCONTENDED_Q else urls[:1]
            if lib == RR_SYNC:
                # Blocking the loop is harmless here: no other task is running meanwhile.
                try:
                    res.samples.append(measure_uncontended_sync(masters, name, args.duration))
                    res.note = "reference: the sync manager, same loop"
                except Exception as exc:
                    _record_failure(res, exc)
            elif scenario == CONTENDED:
                await run_contended_case(res, urls[0], name, args)
            else:
                await run_uncontended_case(res, masters, name, args.duration)
    for res in results.values():
        if res.samples and not res.error:
            res.ops_per_s = statistics.median(res.samples)


def run_all(args: argparse.Namespace, urls: list[str], run_id: str) -> list[Result]:
    quorum = quorum_urls(urls)
    labels = {
        UNCONTENDED_1: "uncontended, 1 master",
        UNCONTENDED_Q: f"uncontended, {len(quorum)} masters",
        CONTENDED: f"contended, {args.tasks} tasks, 1 master",
    }
    plan: list[tuple[str, str]] = [
        (UNCONTENDED_1, lib) for lib in (RR_ASYNC, REDIS_PY_ASYNC, AIOREDLOCK, RR_SYNC)
    ]
    if quorum:
        plan += [(UNCONTENDED_Q, lib) for lib in (RR_ASYNC, AIOREDLOCK, RR_SYNC)]
    plan += [(CONTENDED, lib) for lib in (RR_ASYNC, REDIS_PY_ASYNC)]
    results = {(sc, lib): Result(lib, sc, labels[sc]) for sc, lib in plan}
    asyncio.run(run_async_cases(plan, results, urls, run_id, args))
    return list(results.values())


def print_table(results: Sequence[Result]) -> None:
    base = {r.scenario: r.ops_per_s for r in results if r.library == RR_ASYNC}
    print()
    print("acquire+release cycles/s (uncontended); increments/s (contended)")
    header = f"{'library':22}  {'scenario':30}  {'ops/s':>10}  {'rr.asyncio / this':>17}  note"
    print(header)
    print("-" * len(header))
    for r in results:
        ops = f"{r.ops_per_s:10.0f}" if r.ops_per_s is not None else f"{'-':>10}"
        ratio = ratio_text(base.get(r.scenario), r.ops_per_s)
        note = f"ERROR {r.error}" if r.error else r.note
        print(f"{r.library:22}  {r.label:30}  {ops}  {ratio:>17}  {note}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--duration", type=float, default=2.0, help="seconds per scenario (2)")
    add_masters_arg(p)
    p.add_argument("--json", type=Path, help="also write results to this JSON file")
    p.add_argument("--tasks", type=int, default=4, help="contending tasks (4)")
    p.add_argument(
        "--work-ms", type=float, default=1.0, help="sleep inside the contended lock, ms (1)"
    )
    p.add_argument(
        "--rounds", type=int, default=1, help="interleaved repetitions; median is reported (1)"
    )
    args = p.parse_args(argv)
    if args.duration <= 0 or args.tasks < 1 or args.rounds < 1 or args.work_ms < 0:
        p.error("--duration, --tasks and --rounds must be positive, --work-ms not negative")
    check_masters_arg(p, args.masters)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results, facts = run_session(
        args, ("aioredlock", "aioredis"), f"per scenario, rounds {args.rounds}", run_all
    )
    print_table(results)
    if args.json:
        write_json(
            args.json,
            {
                **facts,
                "duration_s": args.duration,
                "tasks": args.tasks,
                "work_ms": args.work_ms,
                "rounds": args.rounds,
                "results": [asdict(r) for r in results],
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
