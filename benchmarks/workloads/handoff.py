"""Hand-off: p50 and p99 from a holder calling ``release()`` to another waiter's
``acquire()`` returning (``time.monotonic()``, also across processes), 4 threads and 4
spawned processes, each holding 1 ms and pausing 1 ms between holds; re-grabs by the
releaser are counted apart. redreentrant, python-redis-lock and redis-py's ``Lock`` on
1 master; redreentrant on 5.
"""

from __future__ import annotations

from benchcommon import (
    PRL,
    REDIS_PY,
    RR,
    Context,
    LibSpec,
    LoopParams,
    handoffs,
    log,
    masters_label,
    percentile,
)

from workloads.contended import run_workers

HANDOFF_WORKERS = 4
HANDOFF_HOLD_S = 0.001
HANDOFF_THINK_S = 0.001


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


def run(ctx: Context) -> None:
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
            p50, p99 = percentile(h.latencies, 0.5) * 1000, percentile(h.latencies, 0.99) * 1000
            row.add("p50 ms", p50)
            row.add("p99 ms", p99)
            row.add("hand-offs", len(h.latencies))
            row.add("re-grabs", h.regrabs)
            if h.overlaps:
                row.flags["overlaps"] = row.flags.get("overlaps", 0) + h.overlaps
                row.note(f"OVERLAPS: {h.overlaps} holds began before the previous ended")
            log(
                f"  {case:24} {spec.label:20} p50 {p50:7.2f} ms p99 {p99:7.2f} ms, "
                f"{len(h.latencies)} hand-offs, {h.regrabs} re-grabs"
            )
