"""The report of ``bench_all.py``: a table per workload, the TARGETS (goals checked on
this run's ratios), and the JSON and plot files (``--json``, ``--plot``).

Every table cell is the median over the rounds with the [min-max] spread. A target is
PASS, MISS, or n/a when something could not be measured; beside a ratio of two
libraries' rates, the ratio of each round (the libraries interleaved within it) is
shown, so the spread tells how much of a verdict is the machine's noise.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchcommon import POTTERY, REDLOCK_PY, RR, RR_ASYNC, Results, Row, masters_label
from workloads.badmaster import BLACKHOLED, FROZEN
from workloads.contended import STARVED_SHARE
from workloads.failover import FAILOVER_LEASE_S, KILLED
from workloads.handoff import HANDOFF_HOLD_S, HANDOFF_THINK_S
from workloads.held import HELD_LEASE_S
from workloads.multilock import MULTI3, NESTED3
from workloads.semaphore import sem_label
from workloads.uncontended import RAW_SYNC, RR_ASYNC_LOCK, RR_LOCK
from workloads.upgrade import UPGRADE, UPGRADEABLE


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


def print_tables(results: Results) -> None:
    """Every workload's table, in the order the workloads run."""
    print_uncontended(results)
    print_contended(results)
    print_handoff(results)
    print_badmaster(results)
    print_held(results)
    for workload in KIND_TITLES:
        print_kinds(results, workload)
    print_failover(results)


def table(results: Results, workload: str, title: Sequence[str], header: str) -> list[Row]:
    """The rows of ``workload``, once its title lines and column header are printed
    (nothing is printed for a workload without rows)."""
    rows = results.of(workload)
    if rows:
        print()
        for line in (*title, header, "-" * len(header)):
            print(line)
    return rows


def note(row: Row, *more: str) -> str:
    return row.error or "; ".join([*row.notes, *more])


def print_uncontended(results: Results) -> None:
    title = [
        "UNCONTENDED: acquire+release cycles/s, one thread or task, one lock",
        "(median [min-max] over the rounds; ratio = cycles/s / RAW floor (sync), same masters)",
    ]
    header = f"{'masters':9}  {'library':24}  {'cycles/s':>22}  {'÷ raw':>6}  note"
    for r in table(results, "uncontended", title, header):
        raw = results.get("uncontended", r.case, RAW_SYNC)
        base = raw.median("cycles/s") if raw else None
        med = r.median("cycles/s")
        ratio = f"{med / base:.2f}" if med and base else "-"
        print(f"{r.case:9}  {r.library:24}  {cell(r, 'cycles/s'):>22}  {ratio:>6}  {note(r)}")


def print_contended(results: Results) -> None:
    title = [
        "CONTENDED: increments/s of a counter updated under the lock (GET, SET +1)",
        f"(share = fewest increments of one worker / mean, per round; starved below "
        f"{STARVED_SHARE}; exact = counter equals the increments done)",
    ]
    header = (
        f"{'case':24}  {'library':34}  {'incr/s':>20}  {'share':>17}  {'exact':5}  "
        f"{'starved':7}  note"
    )
    for r in table(results, "contended", title, header):
        lost = r.flags.get("lost_updates", 0)
        exact = "-" if not r.metrics else ("NO" if lost else "yes")
        starved = r.flags.get("starved_rounds", 0)
        rounds = len(r.metrics.get("share", []))
        starved_text = f"{starved}/{rounds}" if rounds else "-"
        gave_up = r.flags.get("lock_calls_failed")
        more = [f"{gave_up} lock() calls gave up (retried)"] if gave_up else []
        print(
            f"{r.case:24}  {r.library:34}  {cell(r, 'incr/s'):>20}  {cell(r, 'share', 2):>17}  "
            f"{exact:5}  {starved_text:7}  {note(r, *more)}"
        )


def print_handoff(results: Results) -> None:
    title = [
        f"HAND-OFF: from release() to another waiter's acquire() returning, ms "
        f"(hold {HANDOFF_HOLD_S * 1000:g} ms, then {HANDOFF_THINK_S * 1000:g} ms outside)"
    ]
    header = (
        f"{'case':24}  {'library':20}  {'p50 ms':>20}  {'p99 ms':>22}  {'hand-offs':>9}  "
        f"{'re-grabs':>8}  note"
    )
    for r in table(results, "handoff", title, header):
        print(
            f"{r.case:24}  {r.library:20}  {cell(r, 'p50 ms', 2):>20}  {cell(r, 'p99 ms', 2):>22}  "
            f"{fmt_value(r.median('hand-offs')):>9}  {fmt_value(r.median('re-grabs')):>8}  "
            f"{note(r)}"
        )


def print_badmaster(results: Results) -> None:
    facts = results.facts
    title = [
        f"ONE BAD MASTER OF 5: acquire+release latency, ms (redreentrant master_timeout "
        f"{facts.get('badmaster_rr_master_timeout_s', '?')}s = its default; pottery's "
        f"clients get the same socket time-outs)"
    ]
    header = (
        f"{'condition':22}  {'library':16}  {'p50 ms':>24}  {'p99 ms':>24}  {'ops':>6}  "
        f"{'failed':>6}  note"
    )
    rows = table(results, "badmaster", title, header)
    for r in rows:
        ops = r.metrics.get("ops", [])
        failed = r.metrics.get("failed", [])
        print(
            f"{r.case:22}  {r.library:16}  {cell(r, 'p50 ms', 2):>24}  {cell(r, 'p99 ms', 2):>24}  "
            f"{int(sum(ops)):>6}  {int(sum(failed)):>6}  {note(r)}"
        )
    for k in ("badmaster_frozen", "badmaster"):
        if rows and k in facts:
            print(f"  ({facts[k]})")


def print_held(results: Results) -> None:
    title = [
        f"HELD LOCKS: probe lock's acquire+release latency, ms, while one manager holds "
        f"N watchdog-managed locks (lease {HELD_LEASE_S:g}s, renewed every "
        f"{HELD_LEASE_S / 3:g}s)"
    ]
    header = (
        f"{'masters':9}  {'held':>6}  {'p99 without':>20}  {'p99 during ticks':>20}  "
        f"{'p50 w/o / during':>16}  {'acquire all s':>13}  {'scripts/tick':>12}  "
        f"{'CPU ms/tick':>11}  {'on_lost':>7}  note"
    )
    for r in table(results, "held", title, header):
        p50_without = fmt_value(r.median("p50 without ms"), 2)
        p50 = f"{p50_without} / {fmt_value(r.median('p50 during ticks ms'), 2)}"
        print(
            f"{r.case:9}  {r.flags.get('held', '-'):>6}  {cell(r, 'p99 without ms', 2):>20}  "
            f"{cell(r, 'p99 during ticks ms', 2):>20}  {p50:>16}  "
            f"{fmt_value(r.median('acquire all s'), 1):>13}  "
            f"{fmt_value(r.median('script calls/tick')):>12}  "
            f"{fmt_value(r.median('cpu ms/tick'), 1):>11}  {r.flags.get('on_lost_calls', '-'):>7}  "
            f"{note(r)}"
        )


def reference(workload: str, library: str) -> str:
    """The row a semaphore, multi-lock or upgrade row is compared with (÷ ref), in the
    same case."""
    if workload == "semaphore":
        return RR_ASYNC_LOCK if library.startswith(RR_ASYNC) else RR_LOCK
    return NESTED3 if workload == "multilock" else UPGRADEABLE


KIND_TITLES = {
    "semaphore": "SEMAPHORE: permits acquired+released per second, against a plain lock",
    "multilock": "MULTI-LOCK: acquire+release cycles/s of 3 names, one thread",
    "upgrade": "UPGRADE: cycles/s of the upgradeable side, with and without an upgrade",
}


def print_kinds(results: Results, workload: str) -> None:
    semaphore = workload == "semaphore"
    title = [
        KIND_TITLES[workload],
        "(median [min-max] over the rounds; ÷ ref = cycles/s over those of "
        + ("the lock of the same flavour" if semaphore else reference(workload, ""))
        + ", same case; scripts/cycle = EVALSHA calls per cycle on each master)",
    ]
    if semaphore:
        title.append(
            "(contended: each holder does GET, SET +1 of a counter; exact = the counter "
            "equals the holds (P=1 and lock only); max held = most holds in force at once "
            "in the process, over the rounds)"
        )
    header = (
        f"{'case':21}  {'library':45}  {'cycles/s':>22}  {'÷ ref':>6}  {'µs/cycle':>8}  "
        f"{'scripts/cycle':>13}"
        + (f"  {'share':>17}  {'exact':5}  {'max held':>8}" if semaphore else "")
        + "  note"
    )
    rows = table(results, workload, title, header)
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
        if semaphore:
            exact = "-"
            if "share" in r.metrics and r.flags.get("permits") == 1:
                exact = "NO" if r.flags.get("lost_updates") else "yes"
            most = r.metrics.get("max holders")
            line += (
                f"  {cell(r, 'share', 2):>17}  {exact:5}  "
                f"{fmt_value(max(most) if most else None):>8}"
            )
        print(f"{line}  {note(r)}")
    if workload == "upgrade":
        for case in dict.fromkeys(r.case for r in rows):
            up = results.get(workload, case, UPGRADE)
            base_row = results.get(workload, case, UPGRADEABLE)
            a = up.median("cycles/s") if up else None
            b = base_row.median("cycles/s") if base_row else None
            if a and b:
                print(f"  {case}: upgrade() + downgrade() add {1e6 / a - 1e6 / b:.1f} µs a cycle")


def print_failover(results: Results) -> None:
    lease = results.facts.get("failover_lease_s", FAILOVER_LEASE_S)
    title = [
        f"FAILOVER: from a leader's end (killed: the parent's SIGKILL; resigned: resign() "
        f"called) to the next leader's campaign() returning, lease {lease:g}s renewed every "
        f"{lease / 3:.2g}s; leader, standby and observer are processes of their own",
        "(median [min-max] over every failover; past expiry = after the dead leader's hold "
        "ran out on a quorum (its PTTLs); observer = observe() told of the next leader, "
        "after the end; lag = after the next leader led)",
    ]
    header = (
        f"{'case':28}  {'next leader':>26}  {'÷ lease':>21}  {'past expiry ms':>20}  "
        f"{'observer':>26}  {'observer lag ms':>20}  {'n':>3}  note"
    )
    for r in table(results, "failover", title, header):
        if "next leader s" in r.metrics:
            to_next = f"{cell(r, 'next leader s', 3)} s"
            observer = f"{cell(r, 'observer s', 3)} s"
        else:
            to_next = f"{cell(r, 'next leader ms', 2)} ms"
            observer = f"{cell(r, 'observer ms', 2)} ms"
        print(
            f"{r.case:28}  {to_next:>26}  {cell(r, '÷ lease', 3):>21}  "
            f"{cell(r, 'past expiry ms', 1):>20}  {observer:>26}  "
            f"{cell(r, 'observer lag ms', 1):>20}  {len(r.metrics.get('÷ lease', [])):>3}  "
            f"{note(r)}"
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


def ok_median(row: Row | None, metric: str) -> float | None:
    """The median of ``metric`` of a row that measured without an error."""
    return row.median(metric) if row is not None and _ok(row) else None


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

    def add_ratio(
        what: str, goal: str, a: Row | None, b: Row | None, need: float, metric: str
    ) -> None:
        """``a``'s median of ``metric`` over ``b``'s, each round's ratio beside it."""
        va, vb = ok_median(a, metric), ok_median(b, metric)
        add(what, goal, va / vb if va and vb else None, need, rounds=per_round(a, b, metric))

    # Contended.
    rr_labels = {"threads": f"{RR} (one manager)", "processes": f"{RR} (manager/process)"}
    for mode, workers in (("threads", args.threads), ("processes", args.processes)):
        for n in (1, 5):
            case = f"{workers} {mode}, {masters_label(n)}"
            rr = results.get("contended", case, rr_labels[mode])
            if rr is None:
                continue
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
                goal = f"rr >= best non-starving peer ({best.library if best else 'none'})"
                add_ratio(f"contended {case}", goal, rr, best, 1.0, "incr/s")
                continue
            for peer, need in ((POTTERY, 2.0), (REDLOCK_PY, 1.0)):
                p = results.get("contended", case, peer)
                goal = f"rr >= {need:g}x {peer}"
                if p is not None and p.metrics and not ok_median(p, "incr/s"):
                    ratio = math.inf if ok_median(rr, "incr/s") else None
                    rounds = per_round(rr, p, "incr/s")
                    add(f"contended {case}", goal, ratio, need, "peer made no progress", rounds)
                else:
                    add_ratio(f"contended {case}", goal, rr, p, need, "incr/s")
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
    h50 = ok_median(healthy, "p50 ms")
    for cond in (FROZEN, BLACKHOLED):
        rr = results.get("badmaster", cond, RR)
        pot = results.get("badmaster", cond, POTTERY)
        if rr is None:
            continue
        r50 = ok_median(rr, "p50 ms")
        ratio = h50 / r50 * 2.0 if h50 and r50 else None  # >= 1 iff r50 <= 2 x h50
        text = f"{r50:.2f} ms vs healthy {h50:.2f} ms" if r50 and h50 else ""
        add(f"bad master: {cond}", "rr p50 <= 2x its healthy p50", ratio, 1.0, text)
        p50 = ok_median(pot, "p50 ms")
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
        goal = "rr sync >= 0.8x RAW floor (sync)"
        add_ratio(f"uncontended {case}", goal, rr, raw, 0.8, "cycles/s")
        add_ratio(f"uncontended {case}", "rr asyncio >= 0.9x rr sync", rra, rr, 0.9, "cycles/s")

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
        ("multilock", "", MULTI3, NESTED3, 1.0),
    ):
        for n in (1, 5):
            case = prefix + masters_label(n)
            row, ref = results.get(workload, case, label), results.get(workload, case, ref_label)
            if row is None:
                continue
            what, of = label.replace(RR + " ", "rr "), ref_label.replace(RR + " ", "")
            add_ratio(f"{workload} {case}", f"{what} >= {need:g}x {of}", row, ref, need, "cycles/s")
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
        frac = ok_median(r, "÷ lease")
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


def write_json(path: Path, results: Results, targets: Sequence[Target]) -> None:
    payload: dict[str, Any] = {
        **results.facts,
        "rows": [asdict(r) for r in results.rows.values()],
        "targets": [asdict(t) for t in targets],
    }
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"wrote {path}")
