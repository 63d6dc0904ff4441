"""Hand-offs between processes: what one contended increment costs on the masters.

    python benchmarks/bench_handoff.py                       # 8 processes, 1 and 5 masters
    python benchmarks/bench_handoff.py --processes 4 --sizes 1 --tree /path/to/other/checkout

P processes (``multiprocessing``, spawn), each with its own ``LockManager``, do K
increments each of a non-atomic counter (``GET``, 2 ms, ``SET``) under one plain lock.
The figures come from the masters' ``INFO commandstats`` before and after the run:
script calls (``EVALSHA``/``EVAL``) and ``SUBSCRIBE``/``UNSUBSCRIBE`` commands per
increment and per master, and increments per second. A release that woke a waiter in
every process showed as many script calls per increment as there were processes.
``--tree`` runs another source tree (an older revision, extracted with ``git archive``)
instead of this one. Nothing here is a test: it prints figures and exits 0.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from benchcommon import (  # noqa: E402  (a sibling module, after the path is set)
    add_masters_arg,
    check_masters_arg,
    cleanup,
    new_run_id,
    servers,
)


def contend(urls: list[str], name: str, counter: str, times: int, start: Any) -> None:
    from redreentrant import LockManager

    with LockManager(urls) as mgr, redis.Redis.from_url(urls[0]) as r:
        lock = mgr.lock(name)
        start.wait()
        for _ in range(times):
            with lock:
                value = int(r.get(counter) or 0)
                time.sleep(0.002)
                r.set(counter, value + 1)


def calls(url: str) -> dict[str, int]:
    with redis.Redis.from_url(url) as r:
        stats: dict[str, Any] = r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def run(urls: list[str], processes: int, times: int, name: str) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(processes + 1)
    counter = f"{name}:counter"
    procs = [
        ctx.Process(target=contend, args=(urls, name, counter, times, start))
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    before = [calls(u) for u in urls]
    start.wait()
    began = time.perf_counter()
    for p in procs:
        p.join()
    took = time.perf_counter() - began
    after = [calls(u) for u in urls]
    with redis.Redis.from_url(urls[0]) as r:
        value = int(r.get(counter) or 0)
        r.delete(counter)
    increments = processes * times

    def per_increment(*names: str) -> float:
        total = sum(
            a.get(n, 0) - b.get(n, 0) for a, b in zip(after, before, strict=True) for n in names
        )
        return total / len(urls) / increments

    return {
        "increments/s": increments / took,
        "script calls": per_increment("evalsha", "eval"),
        "(un)subscribes": per_increment("subscribe", "unsubscribe"),
        "exact": float(value == increments),
    }


def show(head: str, out: dict[str, float]) -> None:
    flag = "" if out["exact"] == 1 else "  MISMATCH"
    print(
        f"{head} {out['increments/s']:>12.0f} {out['script calls']:>12.2f}"
        f" {out['(un)subscribes']:>14.2f}{flag}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--processes", type=int, default=8)
    p.add_argument("--increments", type=int, default=40, help="per process")
    p.add_argument("--sizes", default="1,5", help="master counts to run (default 1,5)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--tree", help="a source tree to import redreentrant from instead")
    add_masters_arg(p)
    args = p.parse_args()
    check_masters_arg(p, args.masters)
    sys.path.insert(0, str(Path(args.tree).resolve() if args.tree else HERE.parent))
    run_id = new_run_id()
    with servers(args.masters) as urls:
        print(f"{args.processes} processes x {args.increments} increments, per increment:")
        print(
            f"{'masters':>7} {'round':>5} {'increments/s':>12} {'script calls':>12}"
            f" {'(un)subscribes':>14}  (per master)"
        )
        for size in (int(s) for s in args.sizes.split(",")):
            if size > len(urls):
                continue
            runs = []
            for r in range(args.rounds):
                name = f"{run_id}:handoff-{size}-{r}"
                out = run(urls[:size], args.processes, args.increments, name)
                runs.append(out)
                show(f"{size:>7} {r + 1:>5}", out)
            if len(runs) > 1:
                show(
                    f"{size:>7} {'med':>5}", {k: statistics.median(o[k] for o in runs) for k in out}
                )
        cleanup(urls, run_id)


if __name__ == "__main__":
    main()
