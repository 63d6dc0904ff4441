#!/usr/bin/env python3
"""Every workload, side by side with the peers, in one command: bench_all.py.

    python benchmarks/bench_all.py --json all.json --plot all.png   # every workload
    python benchmarks/bench_all.py --quick                          # a smoke run
    python benchmarks/bench_all.py --only uncontended,badmaster --rounds 5

Workloads (``--only`` takes their names), one module each in ``workloads/``, which
says what it measures: ``uncontended``, ``contended``, ``handoff``, ``badmaster``,
``held``, ``semaphore``, ``multilock``, ``upgrade``, ``failover``. The tables, the
TARGETS and the JSON and plot files are ``report.py``'s; what the workloads share
(servers, the libraries under test, the contending workers) is ``benchcommon.py``.

Libraries are interleaved (A, B, C, then A, B, C again) and every measurement is
repeated ``--rounds`` times; tables show the median and [min-max] over the rounds.
Prints figures and exits 0: it is not a test. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import report
from benchcommon import (
    Context,
    Results,
    add_masters_arg,
    check_masters_arg,
    cleanup,
    ensure_repo_importable,
    fail_text,
    log,
    new_run_id,
    server_version,
    servers,
    versions,
)
from workloads import (
    badmaster,
    contended,
    failover,
    handoff,
    held,
    multilock,
    semaphore,
    uncontended,
    upgrade,
)

#: every workload, in the order they run and are reported
WORKLOADS: dict[str, Callable[[Context], None]] = {
    "uncontended": uncontended.run,
    "contended": contended.run,
    "handoff": handoff.run,
    "badmaster": badmaster.run,
    "held": held.run,
    "semaphore": semaphore.run,
    "multilock": multilock.run,
    "upgrade": upgrade.run,
    "failover": failover.run,
}
PEERS = ("redis", "hiredis", "pottery", "python-redis-lock", "redlock-py", "aioredlock", "aioredis")


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
    if args.held < held.HELD_HOLDER_THREADS:
        p.error(f"--held must be at least {held.HELD_HOLDER_THREADS}")
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
    dists = versions(PEERS)
    print("versions: " + ", ".join(f"{k} {v}" for k, v in dists.items()))
    started = time.monotonic()
    interrupted = False
    with servers(args.masters) as (urls, ensemble):
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
                WORKLOADS[workload](ctx)
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
    report.print_tables(results)
    targets = report.evaluate(results, args)
    report.print_targets(targets)
    print(
        f"\ntotal {results.facts['seconds_total']:.0f}s" + (" (interrupted)" if interrupted else "")
    )
    if args.json:
        report.write_json(args.json, results, targets)
    if args.plot:
        try:
            report.write_plot(args.plot, results)
        except ImportError as exc:
            print(f"no plot: {fail_text(exc)} (pip install -e '.[bench]')")
        except Exception as exc:  # a plot must not lose the figures printed above
            traceback.print_exception(exc, file=sys.stderr)
            print(f"no plot: {fail_text(exc)}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
