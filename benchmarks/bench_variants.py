#!/usr/bin/env python3
"""Lock-variant benchmark: redreentrant's read/write and fair locks against its plain lock.

Four scenarios, all with threads and the sync ``LockManager``:

- read-heavy: N threads, 90% reads and 10% writes on shared state, under
  ``rw_lock(name).read`` / ``.write`` versus ``lock(name)`` for everything;
- hand-off: K threads queued on one lock; the time from one holder's release to the
  next holder's acquire, for ``fair_lock`` versus ``lock``;
- burst: K threads arriving at once; how long until all were served;
- FIFO: waiters that queued in a known order, and the order in which they got the lock.

Prints figures; it asserts nothing about speed and always exits 0 once it has run.
Checks (exact write counter, nobody beside a writer, FIFO order, waiters that slept
through a release or never got the lock) print MISMATCH / VIOLATION / NOT FIFO / SLOW /
STALL instead of raising.  See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import redis
from benchcommon import (
    LEASE_S,
    WAIT_S,
    add_masters_arg,
    check_masters_arg,
    fail_text,
    fmt_ms,
    percentile,
    ratio_text,
    run_session,
    write_json,
)

if TYPE_CHECKING:
    from redreentrant import Lock, LockManager

READ_SHARE = 0.9
# Beyond any acquire's own time-out: a worker still alive by then is stuck, not slow.
STALL_S = WAIT_S + 15.0
# How long a plain-lock waiter is given to fail its first try and start waiting: a plain
# lock keeps no queue in Redis that would tell when it has.
SETTLE_S = 0.05
QUEUE_WAIT_S = 5.0
# Acquire time-out in the hand-off and burst scenarios: hand-offs take milliseconds, so
# a waiter still waiting after this long is stranded; it is reported as a STALL, and the
# bound keeps a stalled run from costing a whole WAIT_S per thread.
STALL_WAIT_S = 5.0
# Gap between the hand-off threads' first arrivals (see run_handoff).
STAGGER_S = 0.02
# Acquisitions per thread in a burst: after the first, releasers re-queue while the
# others are still arriving, which is when arrivals race on several masters.
BURST_CYCLES = 3
# A burst normally takes tens of milliseconds; one this long had a waiter sleeping
# through a release (until its own periodic retry) and is flagged SLOW.
SLOW_ROUND_S = 1.0
# A hand-off takes milliseconds; one this long is a waiter that slept through a release.
SLOW_HANDOFF_S = 0.1
ROUND_SAMPLES = 200

RW = "rw_lock"
PLAIN = "lock"
FAIR = "fair_lock"
SHARED = "shared manager"
PER_THREAD = "manager per thread"

MakeLock = Callable[["LockManager", str], "Lock"]


def _plain(mgr: LockManager, name: str) -> Lock:
    return mgr.lock(name)


def _fair(mgr: LockManager, name: str) -> Lock:
    return mgr.fair_lock(name)


LOCK_KINDS: dict[str, MakeLock] = {FAIR: _fair, PLAIN: _plain}


def _open(urls: Sequence[str]) -> LockManager:
    from redreentrant import LockManager

    return LockManager(list(urls), lease=LEASE_S)


def _join(pool: Sequence[threading.Thread], limit: float, errors: list[str]) -> None:
    """Join the workers, but never hang the benchmark on a stuck one (they are daemons)."""
    end = time.monotonic() + limit
    for t in pool:
        t.join(max(0.0, end - time.monotonic()))
    stuck = sum(t.is_alive() for t in pool)
    if stuck:
        errors.append(f"{stuck} worker(s) still running after {limit:g}s: abandoned")


# --------------------------------------------------------------------------- read-heavy


@dataclass
class Occupancy:
    """Who is inside the critical section right now, seen by the workers themselves.

    The local mutex is only held for the bookkeeping, never across Redis calls, so it
    does not serialise the workload it observes."""

    guard: threading.Lock = field(default_factory=threading.Lock)
    readers: int = 0
    writers: int = 0
    max_readers: int = 0
    violations: int = 0  # someone entered beside a writer, or a writer beside anyone

    def enter(self, write: bool) -> None:
        with self.guard:
            if self.writers or (write and self.readers):
                self.violations += 1
            if write:
                self.writers += 1
            else:
                self.readers += 1
                self.max_readers = max(self.max_readers, self.readers)

    def leave(self, write: bool) -> None:
        with self.guard:
            if write:
                self.writers -= 1
            else:
                self.readers -= 1


@dataclass
class RwRun:
    mode: str
    masters: int
    threads: int
    seconds: float = 0.0
    reads: int = 0
    writes: int = 0
    counter: int = 0
    max_readers: int = 0
    violations: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ops_per_s(self) -> float:
        return (self.reads + self.writes) / self.seconds if self.seconds > 0 else 0.0

    @property
    def mismatch(self) -> bool:
        return self.counter != self.writes


def run_read_heavy(
    urls: Sequence[str],
    counter: redis.Redis,
    name: str,
    mode: str,
    threads: int,
    duration: float,
    work_s: float,
    seed: int,
) -> RwRun:
    """Every thread loops until the deadline over reads (GET, then ``work_s`` of work) and
    writes (GET, work, SET +1: non-atomic on purpose, so only the lock keeps it exact)."""
    run = RwRun(mode, len(urls), threads)
    counter_key = f"{name}:counter"
    counter.delete(counter_key)
    occupancy = Occupancy()
    reads = [0] * threads
    writes = [0] * threads
    finished = [0.0] * threads
    started: list[float] = []
    barrier = threading.Barrier(threads + 1, action=lambda: started.append(time.perf_counter()))
    mgr = _open(urls)

    def worker(slot: int) -> None:
        # The same seed per slot in both modes: both see the same sequence of operations.
        rng = random.Random(seed * 1000 + slot)
        if mode == RW:
            rw = mgr.rw_lock(name)
            read_lock, write_lock = rw.read, rw.write
        else:
            read_lock = write_lock = mgr.lock(name)
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        deadline = started[0] + duration
        try:
            while time.perf_counter() < deadline:
                write = rng.random() >= READ_SHARE
                lock = write_lock if write else read_lock
                if not lock.acquire(timeout=WAIT_S):
                    run.errors.append(f"acquire timed out after {WAIT_S:g}s")
                    return
                try:
                    occupancy.enter(write)
                    try:
                        value = counter.get(counter_key)
                        time.sleep(work_s)  # the work done while holding the lock
                        if write:
                            counter.set(counter_key, int(value or 0) + 1)
                            writes[slot] += 1
                        else:
                            reads[slot] += 1
                    finally:
                        occupancy.leave(write)
                finally:
                    lock.release()
        except Exception as exc:
            run.errors.append(fail_text(exc))
        finally:
            finished[slot] = time.perf_counter()

    try:
        pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
        for t in pool:
            t.start()
        barrier.wait()
        _join(pool, duration + STALL_S, run.errors)
    finally:
        mgr.close()
    run.seconds = (max(finished) if all(finished) else time.perf_counter()) - started[0]
    run.reads, run.writes = sum(reads), sum(writes)
    run.counter = int(counter.get(counter_key) or 0)
    run.max_readers, run.violations = occupancy.max_readers, occupancy.violations
    return run


# --------------------------------------------------------------------------- hand-off


@dataclass
class HandoffRun:
    kind: str
    wakeup: str
    masters: int
    threads: int
    seconds: float = 0.0
    handoffs: list[float] = field(default_factory=list)  # release start -> other's acquire
    slowest: float = math.nan  # the longest hand-off of the whole run, ramps included
    regrabs: int = 0  # the releasing thread itself took the lock back next
    releases: list[float] = field(default_factory=list)  # how long release() took
    per_thread: list[int] = field(default_factory=list)
    acquire_round: float = float("nan")  # uncontended acquire() call, median
    release_round: float = float("nan")  # uncontended release() call, median
    errors: list[str] = field(default_factory=list)


def measure_rounds(urls: Sequence[str], make: MakeLock, name: str) -> tuple[float, float]:
    """Median uncontended acquire() and release() call times: one round each, the floor
    that every hand-off pays on top of its wake-up."""
    mgr = _open(urls)
    try:
        lock = make(mgr, name)
        acq: list[float] = []
        rel: list[float] = []
        for i in range(ROUND_SAMPLES + 20):
            t0 = time.perf_counter()
            lock.acquire(timeout=WAIT_S)
            t1 = time.perf_counter()
            lock.release()
            t2 = time.perf_counter()
            if i >= 20:  # the first ones load scripts and fill the connection pools
                acq.append(t1 - t0)
                rel.append(t2 - t1)
    finally:
        mgr.close()
    return percentile(acq, 0.5), percentile(rel, 0.5)


def run_handoff(
    urls: Sequence[str],
    kind: str,
    wakeup: str,
    name: str,
    threads: int,
    duration: float,
    hold_s: float,
) -> HandoffRun:
    """K threads loop acquire / hold ``hold_s`` / release until the deadline.

    The holder stamps the clock just before it calls release(); the next holder reads
    that stamp as soon as its acquire() returns. Both happen under the lock, so no other
    thread can move the stamp in between.

    The threads join ``STAGGER_S`` apart rather than all at once: simultaneous first
    arrivals on several masters can queue in different orders on different masters (see
    the burst check), and this scenario measures hand-offs, not that."""
    run = HandoffRun(kind, wakeup, len(urls), threads)
    make = LOCK_KINDS[kind]
    count = 1 if wakeup == SHARED else threads
    managers = [_open(urls) for _ in range(count)]
    last: list[tuple[float, int]] = []
    whole_run: list[float] = []
    per_thread = [0] * threads
    finished = [0.0] * threads
    # The timed window [start, deadline), set once every thread has joined.
    window = [math.inf, math.inf]

    def worker(slot: int) -> None:
        lock = make(managers[slot % count], name)
        try:
            while time.perf_counter() < window[1]:
                if not lock.acquire(timeout=STALL_WAIT_S):
                    run.errors.append(f"STALL: acquire timed out after {STALL_WAIT_S:g}s")
                    return
                got = time.perf_counter()
                # Only releases made while every thread takes part: before the last one
                # has joined and after the first one has left, a thread may be alone.
                released_at, by = last[0] if last else (math.inf, -1)
                if by not in (-1, slot):
                    # Kept over the whole run too: a stranded waiter can outlast the window.
                    whole_run.append(got - released_at)
                if window[0] <= released_at < window[1]:
                    if by == slot:
                        run.regrabs += 1
                    else:
                        run.handoffs.append(got - released_at)
                    per_thread[slot] += 1
                time.sleep(hold_s)
                stamp = time.perf_counter()
                last[:] = [(stamp, slot)]
                lock.release()
                run.releases.append(time.perf_counter() - stamp)
        except Exception as exc:
            run.errors.append(fail_text(exc))
        finally:
            finished[slot] = time.perf_counter()

    try:
        pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
        for t in pool:
            t.start()
            time.sleep(STAGGER_S)
        start = time.perf_counter()
        window[:] = [start, start + duration]
        _join(pool, duration + STALL_S, run.errors)
    finally:
        for mgr in managers:
            mgr.close()
    run.seconds = (max(finished) if all(finished) else time.perf_counter()) - start
    run.per_thread = per_thread
    run.slowest = max(whole_run, default=math.nan)
    return run


# --------------------------------------------------------------------------- burst


@dataclass
class BurstRun:
    kind: str
    wakeup: str
    masters: int
    threads: int
    rounds: int
    served: list[float] = field(default_factory=list)  # all released, rounds without stall
    stalled_rounds: int = 0
    timeouts: int = 0
    errors: list[str] = field(default_factory=list)


def _burst_round(
    managers: Sequence[LockManager],
    make: MakeLock,
    name: str,
    threads: int,
    hold_s: float,
    errors: list[str],
) -> tuple[float | None, int]:
    """One burst: (seconds until all were served or None, waiters that timed out)."""
    started: list[float] = []
    barrier = threading.Barrier(threads, action=lambda: started.append(time.perf_counter()))
    done_at = [0.0] * threads
    timed_out = [False] * threads

    def worker(slot: int) -> None:
        lock = make(managers[slot % len(managers)], name)
        try:
            barrier.wait()
            for _ in range(BURST_CYCLES):
                if not lock.acquire(timeout=STALL_WAIT_S):
                    timed_out[slot] = True
                    return
                time.sleep(hold_s)
                lock.release()
            done_at[slot] = time.perf_counter()
        except Exception as exc:
            errors.append(fail_text(exc))

    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    _join(pool, STALL_WAIT_S + STALL_S, errors)
    if any(timed_out) or not all(done_at) or not started:
        return None, sum(timed_out)
    return max(done_at) - started[0], 0


def run_burst(
    urls: Sequence[str],
    kind: str,
    wakeup: str,
    name: str,
    threads: int,
    rounds: int,
    hold_s: float,
) -> BurstRun:
    """K threads released at once by a barrier, each taking the lock ``BURST_CYCLES``
    times (every acquire bounded by ``STALL_WAIT_S``) and holding it ``hold_s``: how long
    until all were through, and whether any waiter was left stranded."""
    run = BurstRun(kind, wakeup, len(urls), threads, rounds)
    count = 1 if wakeup == SHARED else threads
    managers = [_open(urls) for _ in range(count)]
    try:
        for _ in range(rounds):
            served, timeouts = _burst_round(
                managers, LOCK_KINDS[kind], name, threads, hold_s, run.errors
            )
            if timeouts:
                run.stalled_rounds += 1
                run.timeouts += timeouts
            elif served is not None:
                run.served.append(served)
            if run.errors:
                break
    finally:
        for mgr in managers:
            mgr.close()
    return run


# --------------------------------------------------------------------------- FIFO


@dataclass
class FifoRun:
    kind: str
    wakeup: str
    masters: int
    waiters: int
    rounds: int
    in_order: int = 0
    orders: list[list[int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _queue_length(mgr: LockManager, name: str) -> int:
    """Waiters in the fair lock's queue, as the least advanced reachable master has it."""
    lengths = []
    for view in mgr.inspect(name):
        if view.error is None:
            lengths.append(sum(len(lv.queue) for lv in view.locks if lv.kind == "fair"))
    return min(lengths, default=0)


def run_fifo(
    urls: Sequence[str], kind: str, wakeup: str, name: str, waiters: int, rounds: int, hold_s: float
) -> FifoRun:
    """The main thread holds the lock while waiters start one at a time, each only once
    the previous one is waiting; then it releases, and the order of acquisition is kept.

    A fair lock's waiter is known to wait once it shows in the queue on every master; a
    plain lock keeps no queue, so each of its waiters is given ``SETTLE_S`` instead."""
    run = FifoRun(kind, wakeup, len(urls), waiters, rounds)
    make = LOCK_KINDS[kind]
    holder_mgr = _open(urls)
    others = [] if wakeup == SHARED else [_open(urls) for _ in range(waiters)]

    def waiter(slot: int, order: list[int]) -> None:
        mgr = holder_mgr if wakeup == SHARED else others[slot]
        lock = make(mgr, name)
        try:
            if not lock.acquire(timeout=WAIT_S):
                run.errors.append(f"waiter {slot}: acquire timed out after {WAIT_S:g}s")
                return
            order.append(slot)  # under the lock, so appends happen in acquisition order
            time.sleep(hold_s)
            lock.release()
        except Exception as exc:
            run.errors.append(f"waiter {slot}: {fail_text(exc)}")

    try:
        holder = make(holder_mgr, name)
        for _ in range(rounds):
            if not holder.acquire(timeout=WAIT_S):
                run.errors.append("the holder could not take the lock")
                break
            order: list[int] = []
            pool = []
            try:
                for slot in range(waiters):
                    t = threading.Thread(target=waiter, args=(slot, order), daemon=True)
                    t.start()
                    pool.append(t)
                    if kind != FAIR:
                        time.sleep(SETTLE_S)
                        continue
                    give_up = time.monotonic() + QUEUE_WAIT_S
                    while _queue_length(holder_mgr, name) < slot + 1:
                        if time.monotonic() > give_up:
                            raise RuntimeError(f"waiter {slot} never showed up in the queue")
                        time.sleep(0.002)
            finally:
                holder.release()
            _join(pool, STALL_S, run.errors)
            run.orders.append(order)
            run.in_order += order == list(range(waiters))
            if run.errors:
                break
    except Exception as exc:
        run.errors.append(fail_text(exc))
    finally:
        holder_mgr.close()
        for mgr in others:
            mgr.close()
    return run


# --------------------------------------------------------------------------- driver


@dataclass
class Report:
    read_heavy: list[RwRun] = field(default_factory=list)
    handoff: list[HandoffRun] = field(default_factory=list)
    burst: list[BurstRun] = field(default_factory=list)
    fifo: list[FifoRun] = field(default_factory=list)


def _sizes(urls: Sequence[str], wanted: Sequence[int]) -> list[list[str]]:
    """The first n masters for each wanted n; an n above the servers at hand is skipped."""
    out = []
    for n in wanted:
        if 1 <= n <= len(urls):
            out.append(list(urls[:n]))
        else:
            print(f"  (skipping {n} masters: {len(urls)} server(s) available)", file=sys.stderr)
    return out


def run_all(args: argparse.Namespace, urls: list[str], run_id: str) -> Report:
    report = Report()
    groups = _sizes(urls, args.sizes)
    work_s = args.work_ms / 1000.0
    with redis.Redis.from_url(urls[0]) as counter:
        for group in groups:
            n = len(group)
            for mode in (RW, PLAIN):
                name = f"{run_id}:read-heavy:{n}m:{mode}"
                rw = run_read_heavy(
                    group, counter, name, mode, args.threads, args.duration, work_s, args.seed
                )
                report.read_heavy.append(rw)
                print(
                    f"  read-heavy {n}m {mode:8} {rw.ops_per_s:8.0f} ops/s  "
                    f"max readers {rw.max_readers}  errors {len(rw.errors)}",
                    file=sys.stderr,
                )
    for group in groups:
        n = len(group)
        for kind in (FAIR, PLAIN):
            acq, rel = measure_rounds(group, LOCK_KINDS[kind], f"{run_id}:rounds:{n}m:{kind}")
            for wakeup in (SHARED, PER_THREAD):
                name = f"{run_id}:handoff:{n}m:{kind}:{wakeup.split()[-1]}"
                ho = run_handoff(group, kind, wakeup, name, args.waiters, args.duration, work_s)
                ho.acquire_round, ho.release_round = acq, rel
                report.handoff.append(ho)
                print(
                    f"  hand-off {n}m {kind:9} {wakeup:18} {len(ho.handoffs):5} hand-offs "
                    f"median {fmt_ms(percentile(ho.handoffs, 0.5))} ms",
                    file=sys.stderr,
                )
    for group in groups:
        n = len(group)
        for kind in (FAIR, PLAIN):
            for wakeup in (SHARED, PER_THREAD):
                name = f"{run_id}:burst:{n}m:{kind}:{wakeup.split()[-1]}"
                br = run_burst(group, kind, wakeup, name, args.waiters, args.burst_rounds, work_s)
                report.burst.append(br)
                print(
                    f"  burst {n}m {kind:9} {wakeup:18} {br.stalled_rounds}/{br.rounds} "
                    "rounds stalled",
                    file=sys.stderr,
                )
    for group in groups:
        n = len(group)
        for kind in (FAIR, PLAIN):
            for wakeup in (SHARED, PER_THREAD):
                name = f"{run_id}:fifo:{n}m:{kind}:{wakeup.split()[-1]}"
                ff = run_fifo(group, kind, wakeup, name, args.waiters, args.fifo_rounds, work_s)
                report.fifo.append(ff)
                print(
                    f"  fifo {n}m {kind:9} {wakeup:18} {ff.in_order}/{ff.rounds} in order",
                    file=sys.stderr,
                )
    return report


def print_report(report: Report, args: argparse.Namespace) -> None:
    print()
    print(
        f"read-heavy: {args.threads} threads, {READ_SHARE:.0%} reads / "
        f"{1 - READ_SHARE:.0%} writes, {args.work_ms:g} ms of work inside the lock"
    )
    header = (
        f"{'masters':>7}  {'lock':24}  {'ops/s':>8}  {'reads':>7}  {'writes':>6}  "
        f"{'counter':>7}  {'max readers':>11}  {'vs lock':>7}  check"
    )
    print(header)
    print("-" * len(header))
    plain = {r.masters: r.ops_per_s for r in report.read_heavy if r.mode == PLAIN}
    for r in report.read_heavy:
        label = "rw_lock .read / .write" if r.mode == RW else "lock (for everything)"
        checks = []
        if r.mismatch:
            checks.append(f"MISMATCH counter={r.counter} writes={r.writes}")
        if r.violations:
            checks.append(f"VIOLATION {r.violations} entries beside a writer")
        if r.mode == RW and r.max_readers <= 1:
            checks.append("readers never overlapped")
        checks += [f"ERROR {e}" for e in sorted(set(r.errors))]
        print(
            f"{r.masters:>7}  {label:24}  {r.ops_per_s:8.0f}  {r.reads:7}  {r.writes:6}  "
            f"{r.counter:7}  {r.max_readers:11}  {ratio_text(r.ops_per_s, plain.get(r.masters)):>7}"
            f"  {'; '.join(checks) or 'ok'}"
        )

    print()
    print(
        f"hand-off: {args.waiters} threads on one lock, {args.work_ms:g} ms held; "
        "latency = release() called -> next thread's acquire() returned (ms)"
    )
    header = (
        f"{'masters':>7}  {'lock':9}  {'wake-up':18}  {'hand-offs':>9}  {'median':>7}  "
        f"{'p90':>7}  {'max':>8}  {'max, all':>8}  {'re-grabs':>8}  {'acq/thread':>11}  "
        f"{'release':>7}  {'acq round':>9}  {'rel round':>9}"
    )
    print(header)
    print("-" * len(header))
    for h in report.handoff:
        spread = f"{min(h.per_thread)}-{max(h.per_thread)}" if h.per_thread else "-"
        print(
            f"{h.masters:>7}  {h.kind:9}  {h.wakeup:18}  {len(h.handoffs):9}  "
            f"{fmt_ms(percentile(h.handoffs, 0.5)):>7}  {fmt_ms(percentile(h.handoffs, 0.9)):>7}  "
            f"{fmt_ms(max(h.handoffs, default=math.nan)):>8}  {fmt_ms(h.slowest):>8}  "
            f"{h.regrabs:8}  {spread:>11}  {fmt_ms(percentile(h.releases, 0.5)):>7}  "
            f"{fmt_ms(h.acquire_round):>9}  {fmt_ms(h.release_round):>9}"
            + ("  SLOW" if h.slowest > SLOW_HANDOFF_S else "")
            + "".join(f"  ERROR {e}" for e in sorted(set(h.errors)))
        )
    print(
        "  counted only while all threads take part, except 'max, all': the slowest\n"
        "  hand-off of the whole run, ramps included (SLOW when over "
        f"{SLOW_HANDOFF_S * 1000:g} ms);\n"
        "  re-grabs: the releasing thread took the lock straight back (not a hand-off);\n"
        "  acq/thread: fewest-most acquisitions of one thread; release: median release()\n"
        "  call in the run; acq/rel round: median uncontended acquire() / release() call\n"
        "  on the same kind of lock"
    )

    print()
    print(
        f"burst: {args.waiters} threads arrive at once, each takes the lock "
        f"{BURST_CYCLES} times for {args.work_ms:g} ms; {args.burst_rounds} rounds; a waiter "
        f"not served within {STALL_WAIT_S:g}s gives up and its round counts as stalled; "
        f"slow rounds took over {SLOW_ROUND_S:g}s"
    )
    header = (
        f"{'masters':>7}  {'lock':9}  {'wake-up':18}  {'all through, median ms':>22}  "
        f"{'max ms':>8}  {'slow rounds':>11}  {'stalled rounds':>14}  {'timeouts':>8}"
    )
    print(header)
    print("-" * len(header))
    for b in report.burst:
        slow = sum(x > SLOW_ROUND_S for x in b.served)
        flag = ("  SLOW" if slow else "") + ("  STALL" if b.stalled_rounds else "")
        print(
            f"{b.masters:>7}  {b.kind:9}  {b.wakeup:18}  {fmt_ms(percentile(b.served, 0.5)):>22}  "
            f"{fmt_ms(max(b.served, default=math.nan)):>8}  {f'{slow}/{b.rounds}':>11}  "
            f"{f'{b.stalled_rounds}/{b.rounds}':>14}  {b.timeouts:8}{flag}"
            + "".join(f"  ERROR {e}" for e in sorted(set(b.errors)))
        )

    print()
    print(
        f"FIFO: {args.waiters} waiters queued one after another behind a holder, "
        f"{args.fifo_rounds} rounds (only fair_lock promises the order)"
    )
    for f in report.fifo:
        verdict = "FIFO" if f.in_order == f.rounds else "NOT FIFO"
        if f.kind != FAIR and f.in_order != f.rounds:
            verdict = "not in order (none promised)"
        seen = next((o for o in f.orders if o != list(range(f.waiters))), None)
        detail = f", e.g. {seen}" if seen is not None else ""
        errors = "".join(f"  ERROR {e}" for e in sorted(set(f.errors)))
        print(
            f"  {f.masters} master(s)  {f.kind:9}  {f.wakeup:18}  "
            f"{f.in_order}/{f.rounds} rounds in arrival order: {verdict}{detail}{errors}"
        )


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--duration", type=float, default=2.0, help="seconds per timed case (2)")
    add_masters_arg(p)
    p.add_argument("--json", type=Path, help="also write results to this JSON file")
    p.add_argument("--threads", type=int, default=8, help="read-heavy threads (8)")
    p.add_argument("--waiters", type=int, default=6, help="threads queued on one lock (6)")
    p.add_argument(
        "--work-ms", type=float, default=1.0, help="work (sleep) inside the lock, ms (1)"
    )
    p.add_argument("--sizes", type=_int_list, default=[1, 5], help="master counts (1,5)")
    p.add_argument("--fifo-rounds", type=int, default=3, help="FIFO check rounds (3)")
    p.add_argument("--burst-rounds", type=int, default=4, help="burst check rounds (4)")
    p.add_argument("--seed", type=int, default=1, help="seed of the read/write mix (1)")
    args = p.parse_args(argv)
    if min(args.threads, args.fifo_rounds, args.burst_rounds) < 1 or args.duration <= 0:
        p.error("--duration, --threads, --fifo-rounds and --burst-rounds must be positive")
    if args.waiters < 2:
        p.error("--waiters must be at least 2")
    if args.work_ms < 0:
        p.error("--work-ms must not be negative")
    check_masters_arg(p, args.masters)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report, facts = run_session(args, (), "per timed case", run_all)
    print_report(report, args)
    if args.json:
        write_json(
            args.json,
            {
                **facts,
                "args": {k: v for k, v in vars(args).items() if k not in ("json", "masters")},
                **asdict(report),
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
