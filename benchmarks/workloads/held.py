"""Held locks: one sync manager (``lease=3.0``) holds 10,000 (``--held``)
watchdog-managed locks, taken by 4 threads that stay alive; the acquire+release latency
of another lock over windows with renewal ticks, against windows with none held (before
and after); script calls per tick (``INFO commandstats`` deltas of EVALSHA over a quiet
window) and the process's CPU time per tick. Ticks are counted by polling one held
key's PTTL. redreentrant on 1 and 5 masters.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from typing import Any

import redis
from benchcommon import RR, Context, evalsha_calls, fail_text, log, masters_label, percentile

HELD_LEASE_S = 3.0
HELD_HOLDER_THREADS = 4


def held_window(args: argparse.Namespace) -> float:
    return 1.2 if args.quick else max(3.0 * args.duration, HELD_LEASE_S)


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


def run_one(ctx: Context, n: int, count: int) -> None:
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


def run(ctx: Context) -> None:
    for n in (1, 5):
        if n > len(ctx.urls):
            continue
        log(f"held: {ctx.args.held} locks on {masters_label(n)}")
        row = ctx.results.row("held", masters_label(n), RR)
        try:
            run_one(ctx, n, ctx.args.held)
        except Exception as exc:
            row.fail(exc)
