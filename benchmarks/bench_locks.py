#!/usr/bin/env python3
"""Throughput benchmark: redreentrant against other Python Redis lock libraries.

Prints figures; it asserts nothing about speed and always exits 0 once it has run.
Every scenario runs in the same process and the same invocation so that the
ratios are comparable even on a noisy shared machine.  See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis
from benchcommon import (
    LEASE_S,
    WAIT_S,
    WARMUP_CYCLES,
    add_masters_arg,
    check_masters_arg,
    fail_text,
    host_port_db,
    quorum_urls,
    run_session,
    write_json,
)

MAX_PER_THREAD = 1_000_000
STALL_S = WAIT_S + 15.0

UNCONTENDED_1 = "uncontended-1"
UNCONTENDED_Q = "uncontended-quorum"
CONTENDED = "contended"

RR = "redreentrant"
REDIS_PY = "redis-py Lock"
PRL = "python-redis-lock"
POTTERY = "pottery Redlock"
REDLOCK_PY = "redlock-py"


# --------------------------------------------------------------------------- adapters


@dataclass
class LockOps:
    """One lock instance reduced to the two calls the benchmark needs."""

    acquire: Callable[[], bool]
    release: Callable[[], None]


@dataclass
class Backend:
    """A library bound to a set of masters; ``new_lock`` may be called from any thread."""

    new_lock: Callable[[str], LockOps]
    close: Callable[[], None]


Opener = Callable[[Sequence[str]], Backend]


def open_redreentrant(urls: Sequence[str]) -> Backend:
    from redreentrant import LockManager

    mgr = LockManager(list(urls), lease=LEASE_S)

    def new_lock(name: str) -> LockOps:
        lock = mgr.lock(name)
        return LockOps(lambda: bool(lock.acquire(blocking=True, timeout=WAIT_S)), lock.release)

    return Backend(new_lock, mgr.close)


def open_redis_py(urls: Sequence[str]) -> Backend:
    client = redis.Redis.from_url(urls[0])

    def new_lock(name: str) -> LockOps:
        # Default sleep=0.1 between polls is kept: that is what users get.
        lock = client.lock(name, timeout=LEASE_S, blocking_timeout=WAIT_S)
        return LockOps(lambda: bool(lock.acquire()), lock.release)

    return Backend(new_lock, client.close)


def open_python_redis_lock(urls: Sequence[str]) -> Backend:
    import redis_lock  # type: ignore[import-untyped]

    client = redis.Redis.from_url(urls[0])

    def new_lock(name: str) -> LockOps:
        # Without expire the key never expires; timeout must be an int <= expire.
        lock = redis_lock.Lock(client, name, expire=int(LEASE_S))
        return LockOps(lambda: bool(lock.acquire(blocking=True, timeout=int(WAIT_S))), lock.release)

    return Backend(new_lock, client.close)


def open_pottery(urls: Sequence[str]) -> Backend:
    from pottery import Redlock

    clients = [redis.Redis.from_url(u) for u in urls]

    def new_lock(name: str) -> LockOps:
        lock = Redlock(key=name, masters=set(clients), auto_release_time=LEASE_S)
        return LockOps(lambda: lock.acquire(blocking=True, timeout=WAIT_S), lock.release)

    def close() -> None:
        for c in clients:
            c.close()

    return Backend(new_lock, close)


def open_redlock_py(urls: Sequence[str]) -> Backend:
    import redlock  # type: ignore[import-untyped]

    dlm = redlock.Redlock([host_port_db(u) for u in urls])

    def new_lock(name: str) -> LockOps:
        held: list[Any] = []

        def acquire() -> bool:
            # lock() is try-only (3 tries, 0.2 s apart) and returns False on failure.
            lk = dlm.lock(name, int(LEASE_S * 1000))
            if lk is False:
                return False
            held.append(lk)
            return True

        def release() -> None:
            dlm.unlock(held.pop())

        return LockOps(acquire, release)

    def close() -> None:
        for server in dlm.servers:
            server.close()

    return Backend(new_lock, close)


# --------------------------------------------------------------------------- results


@dataclass
class Result:
    library: str
    scenario: str
    label: str
    ops_per_s: float | None = None
    samples: list[float] = field(default_factory=list)
    note: str = ""
    error: str | None = None
    mismatch: bool = False


def _report_exception(library: str, label: str, exc: BaseException) -> None:
    print(f"  ! {library} / {label} failed: {fail_text(exc)}", file=sys.stderr)
    traceback.print_exception(exc, file=sys.stderr)


# --------------------------------------------------------------------------- scenarios


def measure_uncontended(backend: Backend, name: str, duration: float) -> float:
    ops = backend.new_lock(name)
    # Warm-up loads scripts and fills connection pools before the clock starts.
    for _ in range(WARMUP_CYCLES):
        if not ops.acquire():
            raise RuntimeError("uncontended acquire returned False during warm-up")
        ops.release()
    cycles = 0
    start = time.perf_counter()
    deadline = start + duration
    now = start
    while now < deadline:
        if not ops.acquire():
            raise RuntimeError(f"uncontended acquire returned False after {cycles} cycles")
        ops.release()
        cycles += 1
        now = time.perf_counter()
    return cycles / (now - start)


@dataclass
class ContendedRun:
    per_thread: int
    threads: int
    seconds: float
    done: int  # increments whose SET went through, as counted by the threads
    final: int  # the counter as Redis holds it afterwards
    errors: list[str]

    @property
    def broken(self) -> bool:
        return self.final != self.done

    @property
    def expected(self) -> int:
        return self.per_thread * self.threads

    @property
    def rate(self) -> float:
        return self.expected / self.seconds if self.seconds > 0 else 0.0


def run_contended(
    backend: Backend, counter: redis.Redis, name: str, threads: int, per_thread: int
) -> ContendedRun:
    counter_key = f"{name}:counter"
    counter.delete(counter_key)
    errors: list[str] = []
    # One slot per thread, so the workers need no lock of their own to report.
    progress = [0] * threads
    finished = [0.0] * threads
    started: list[float] = []
    # The barrier action stamps the start once every thread is ready to go.
    barrier = threading.Barrier(threads + 1, action=lambda: started.append(time.perf_counter()))

    def worker(slot: int) -> None:
        try:
            ops = backend.new_lock(name)  # created in the thread that will own it
        except Exception as exc:
            errors.append(fail_text(exc))
            barrier.abort()
            return
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        try:
            for _ in range(per_thread):
                if not ops.acquire():
                    errors.append(f"acquire timed out after {WAIT_S:g}s")
                    return
                try:
                    # Deliberately non-atomic: only the lock keeps this correct.
                    value = counter.get(counter_key)
                    counter.set(counter_key, int(value or 0) + 1)
                    progress[slot] += 1
                finally:
                    ops.release()
        except Exception as exc:
            errors.append(fail_text(exc))
        finally:
            finished[slot] = time.perf_counter()

    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
    # A hung lock must not hang the benchmark: give up once nobody has made progress
    # for longer than any acquire is allowed to block.
    seen, last_change = -1, time.perf_counter()
    while alive := [t for t in pool if t.is_alive()]:
        alive[0].join(0.05)
        done, now = sum(progress), time.perf_counter()
        if done != seen:
            seen, last_change = done, now
        elif now - last_change > STALL_S:
            errors.append(f"stalled: no progress for {STALL_S:g}s at {done} increments")
            break
    start = started[0] if started else time.perf_counter()
    end = max(finished) if all(finished) else time.perf_counter()
    final = int(counter.get(counter_key) or 0)
    return ContendedRun(per_thread, threads, end - start, sum(progress), final, errors)


def calibrate_contended(
    backend: Backend, counter: redis.Redis, name: str, threads: int, duration: float
) -> list[ContendedRun]:
    """Grow K until one run lasts about ``duration``; that last run is the figure.

    Short runs are not extrapolated: with poll-and-sleep locks the fixed cost of the
    first sleeps dominates small K, so the rate depends on K until runs get long.
    """
    k = 4
    runs: list[ContendedRun] = []
    while True:
        run = run_contended(backend, counter, name, threads, k)
        runs.append(run)
        if run.errors or run.broken:
            return runs
        if run.seconds >= 0.75 * duration or k >= MAX_PER_THREAD:
            return runs
        growth = min(max(1.1 * duration / max(run.seconds, 1e-6), 2.0), 8.0)
        k = min(int(k * growth), MAX_PER_THREAD)


# --------------------------------------------------------------------------- plumbing


OPENERS: dict[str, Opener] = {
    RR: open_redreentrant,
    REDIS_PY: open_redis_py,
    PRL: open_python_redis_lock,
    POTTERY: open_pottery,
    REDLOCK_PY: open_redlock_py,
}


# --------------------------------------------------------------------------- driver


def _lock_name(run_id: str, scenario: str, lib: str) -> str:
    return f"{run_id}:{scenario}:{lib.split()[0]}"


def run_uncontended_case(res: Result, masters: Sequence[str], name: str, duration: float) -> None:
    try:
        backend = OPENERS[res.library](masters)
        try:
            res.samples.append(measure_uncontended(backend, name, duration))
        finally:
            backend.close()
    except Exception as exc:
        res.error = fail_text(exc)
        _report_exception(res.library, res.label, exc)
        return
    print(f"  {res.library:18} {res.label:30} {res.samples[-1]:>10.0f}/s", file=sys.stderr)


def run_contended_case(
    res: Result,
    master: str,
    counter: redis.Redis,
    name: str,
    args: argparse.Namespace,
    per_thread: dict[str, int],
) -> None:
    lib = res.library
    try:
        backend = OPENERS[lib]([master])
        try:
            k = per_thread.get(lib) or args.increments
            if k:
                runs = [run_contended(backend, counter, name, args.threads, k)]
            else:
                runs = calibrate_contended(backend, counter, name, args.threads, args.duration)
            # Later rounds reuse this K so that rounds are comparable.
            per_thread[lib] = runs[-1].per_thread
        finally:
            backend.close()
    except Exception as exc:
        res.error = fail_text(exc)
        _report_exception(lib, res.label, exc)
        return
    for r in runs:
        if r.broken:
            res.mismatch = True
            res.error = f"MISMATCH counter={r.final} but {r.done} increments done"
            print(
                f"!!!!! MISMATCH: {lib} counter={r.final}, threads did {r.done} increments "
                f"({r.threads}x{r.per_thread} planned) -- the lock let writers overlap !!!!!"
            )
    last = runs[-1]
    if last.errors:
        res.error = "; ".join([*sorted(set(last.errors)), *([res.error] if res.error else [])])
        print(f"  ! {lib} / {res.label} failed: {res.error}", file=sys.stderr)
    if res.error:
        return
    res.samples.append(last.rate)
    res.note = f"K={last.per_thread}/thread, counter ok"
    print(
        f"  {lib:18} {res.label:30} {last.rate:>10.0f}/s "
        f"({last.expected} incr in {last.seconds:.2f}s)",
        file=sys.stderr,
    )


def run_all(args: argparse.Namespace, urls: list[str], run_id: str) -> list[Result]:
    quorum = quorum_urls(urls)
    labels = {
        UNCONTENDED_1: "uncontended, 1 master",
        UNCONTENDED_Q: f"uncontended, {len(quorum)} masters",
        CONTENDED: f"contended, {args.threads} threads, 1 master",
    }
    plan: list[tuple[str, str]] = [
        (UNCONTENDED_1, lib) for lib in (RR, REDIS_PY, PRL, POTTERY, REDLOCK_PY)
    ]
    if quorum:
        plan += [(UNCONTENDED_Q, lib) for lib in (RR, POTTERY, REDLOCK_PY)]
    plan += [(CONTENDED, lib) for lib in (RR, REDIS_PY, PRL, POTTERY)]
    results = {(sc, lib): Result(lib, sc, labels[sc]) for sc, lib in plan}

    per_thread: dict[str, int] = {}
    with redis.Redis.from_url(urls[0]) as counter:
        # Rounds interleave all libraries so slow drifts in machine load hit everyone.
        for rnd in range(args.rounds):
            print(f"round {rnd + 1}/{args.rounds}", file=sys.stderr)
            for scenario, lib in plan:
                res = results[(scenario, lib)]
                if res.error:
                    continue  # a failed library stays failed; later rounds skip it
                name = _lock_name(run_id, scenario, lib)
                if scenario == CONTENDED:
                    run_contended_case(res, urls[0], counter, name, args, per_thread)
                else:
                    masters = quorum if scenario == UNCONTENDED_Q else urls[:1]
                    run_uncontended_case(res, masters, name, args.duration)

    for res in results.values():
        if res.samples and not res.error:
            res.ops_per_s = statistics.median(res.samples)
    return list(results.values())


def _rr_ops(results: Sequence[Result], scenario: str) -> float | None:
    for r in results:
        if r.scenario == scenario and r.library == RR:
            return r.ops_per_s
    return None


def print_table(results: Sequence[Result]) -> None:
    print()
    print("acquire+release cycles/s (uncontended); increments/s (contended)")
    header = f"{'library':18}  {'scenario':30}  {'ops/s':>10}  {'ratio to rr':>11}  note"
    print(header)
    print("-" * len(header))
    for r in results:
        base = _rr_ops(results, r.scenario)
        ops = f"{r.ops_per_s:10.0f}" if r.ops_per_s is not None else f"{'-':>10}"
        ratio = f"{r.ops_per_s / base:11.3f}" if r.ops_per_s and base else f"{'-':>11}"
        note = f"ERROR {r.error}" if r.error else r.note
        print(f"{r.library:18}  {r.label:30}  {ops}  {ratio}  {note}")


@dataclass
class Target:
    scenario: str
    peer: str
    factor: float
    measured: float | None = None
    verdict: str = "n/a"


def evaluate_targets(results: Sequence[Result]) -> list[Target]:
    targets = [
        Target(UNCONTENDED_1, REDIS_PY, 1.0),
        Target(UNCONTENDED_Q, POTTERY, 5.0),
        Target(UNCONTENDED_Q, REDLOCK_PY, 1.5),
        Target(CONTENDED, PRL, 1.0),
    ]
    by_key = {(r.scenario, r.library): r for r in results}
    for t in targets:
        rr = by_key.get((t.scenario, RR))
        peer = by_key.get((t.scenario, t.peer))
        if rr and peer and rr.ops_per_s and peer.ops_per_s:
            t.measured = rr.ops_per_s / peer.ops_per_s
            t.verdict = "PASS" if t.measured >= t.factor else "MISS"
    return targets


def print_targets(targets: Sequence[Target], results: Sequence[Result]) -> None:
    labels = {r.scenario: r.label for r in results}
    print()
    print("targets (informational; redreentrant ops/s divided by peer ops/s, this run)")
    for t in targets:
        measured = f"{t.measured:7.2f}x" if t.measured is not None else f"{'-':>8}"
        label = labels.get(t.scenario, t.scenario)
        goal = f"redreentrant >= {t.factor:g}x {t.peer}"
        print(f"  {t.verdict:4}  {label:30}  {goal:40}  measured {measured}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--duration", type=float, default=2.0, help="seconds per scenario (2)")
    add_masters_arg(p)
    p.add_argument("--json", type=Path, help="also write results to this JSON file")
    p.add_argument("--threads", type=int, default=4, help="contending threads (4)")
    p.add_argument(
        "--increments",
        type=int,
        help="contended increments per thread (default: calibrated to --duration)",
    )
    p.add_argument(
        "--rounds", type=int, default=1, help="interleaved repetitions; median is reported (1)"
    )
    args = p.parse_args(argv)
    if args.duration <= 0 or args.threads < 1 or args.rounds < 1:
        p.error("--duration, --threads and --rounds must be positive")
    if args.increments is not None and args.increments < 1:
        p.error("--increments must be positive")
    check_masters_arg(p, args.masters)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results, facts = run_session(
        args,
        ("pottery", "python-redis-lock", "redlock-py"),
        f"per scenario, rounds {args.rounds}",
        run_all,
    )
    print_table(results)
    targets = evaluate_targets(results)
    print_targets(targets, results)
    if args.json:
        write_json(
            args.json,
            {
                **facts,
                "duration_s": args.duration,
                "threads": args.threads,
                "rounds": args.rounds,
                "results": [asdict(r) for r in results],
                "targets": [asdict(t) for t in targets],
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
