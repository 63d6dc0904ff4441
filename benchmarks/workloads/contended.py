"""Contended: 16 threads (one process) and 8 spawned processes (``--threads``,
``--processes``), on 1 and 5 masters, each looping for ``--duration``: acquire, a
non-atomic GET and SET +1 of a counter on master 0, release. Increments/s finished
inside the window, whether the counter is exact (no lost update), and each round's
fewest increments of one worker over the mean, the *share* ("starved" below
:data:`STARVED_SHARE`).

redreentrant (one shared manager; one manager per thread; one per process) against
redis-py's ``Lock`` with ``sleep=0.1`` (its default) and ``sleep=0.01``,
python-redis-lock, pottery and redlock-py. The semaphore workload runs its contended
cases through :func:`contended_once` too.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import redis
from benchcommon import (
    POTTERY,
    PRL,
    REDIS_PY,
    REDLOCK_PY,
    RR,
    Context,
    LibSpec,
    LoopParams,
    Row,
    WorkerResult,
    log,
    masters_label,
    run_threads,
)

STARVED_SHARE = 0.25


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
    """``workers`` threads of this process, or worker processes, in one window."""
    if mode == "threads":
        return run_threads(spec, masters, params, workers, duration, per_worker_backend)
    return ctx.pool(workers).run(spec, masters, params, duration, count=workers)


def run(ctx: Context) -> None:
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
    record(row, results, final, ctx.args.duration, metric)


def record(
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
