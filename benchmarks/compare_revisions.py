"""Compare redreentrant at two git revisions, in one run: is a change a slow-down?

    python benchmarks/compare_revisions.py --base HEAD~3            # base vs working tree
    python benchmarks/compare_revisions.py --base v0.1.0 --rounds 7

Each side runs the same workloads, through the public API only, in a fresh subprocess
with that side's source tree first on ``sys.path``; the sides alternate, round after
round, against the same local masters, and the medians (with their spread) and the
ratio new/base are printed. A ratio well below 1 is a slow-down. The base revision is
checked out into a temporary ``git worktree``, removed afterwards.

Workloads: acquire+release cycles per second, uncontended, on 1 and on 5 masters (sync
and asyncio), and increments per second of 4 threads contending for one lock on 1
master and of 16 threads on 5 masters. Nothing here is a test: it prints figures and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # for the sibling module, imported after it

from benchcommon import REPO_ROOT, revision_tree, servers  # noqa: E402

WORKLOAD = r"""
import asyncio, json, sys, threading, time
sys.path.insert(0, sys.argv[1])
from redreentrant import LockManager
from redreentrant.asyncio import LockManager as AsyncLockManager
urls, duration, name = sys.argv[2].split(","), float(sys.argv[3]), sys.argv[4]

def cycles(masters):
    with LockManager(masters) as mgr:
        lock = mgr.lock(name + ":u%d" % len(masters))
        for _ in range(50):
            lock.acquire(); lock.release()
        n, end = 0, time.perf_counter() + duration
        while time.perf_counter() < end:
            lock.acquire(); lock.release(); n += 1
        return n / duration

async def async_cycles(masters):
    async with AsyncLockManager(masters) as mgr:
        lock = mgr.lock(name + ":a%d" % len(masters))
        for _ in range(50):
            await lock.acquire(); await lock.release()
        n, end = 0, time.perf_counter() + duration
        while time.perf_counter() < end:
            await lock.acquire(); await lock.release(); n += 1
        return n / duration

def contended(masters, threads=4):
    import redis
    counter = name + ":counter%d" % threads
    with LockManager(masters) as mgr, redis.Redis.from_url(masters[0]) as r:
        r.set(counter, 0)
        stop, done = time.perf_counter() + duration, [0]
        def work():
            lock = mgr.lock(name + ":c%d" % threads)
            while time.perf_counter() < stop:
                with lock:
                    value = int(r.get(counter)); r.set(counter, value + 1)
                    done[0] += 1
        ts = [threading.Thread(target=work) for _ in range(threads)]
        for t in ts: t.start()
        for t in ts: t.join()
        ok = int(r.get(counter)) == done[0]
        r.delete(counter)
        return done[0] / duration if ok else -1.0

print(json.dumps({
    "sync, 1 master": cycles(urls[:1]),
    "sync, 5 masters": cycles(urls),
    "asyncio, 1 master": asyncio.run(async_cycles(urls[:1])),
    "asyncio, 5 masters": asyncio.run(async_cycles(urls)),
    "4 threads contended, 1 master": contended(urls[:1]),
    "16 threads contended, 5 masters": contended(urls, 16),
}))
"""


def run_side(tree: Path, urls: list[str], duration: float, name: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", WORKLOAD, str(tree), ",".join(urls), str(duration), name],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--base", required=True, help="the git revision to compare against")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds per side (5)")
    p.add_argument("--duration", type=float, default=1.5, help="seconds per workload (1.5)")
    args = p.parse_args()
    samples: dict[str, dict[str, list[float]]] = {"base": {}, "new": {}}
    with revision_tree(args.base) as base, servers(None) as (urls, _):
        for r in range(args.rounds):
            sides = [("base", base), ("new", REPO_ROOT)]
            if r % 2:
                sides.reverse()  # neither side always goes first
            for side, tree in sides:
                figures = run_side(tree, urls, args.duration, f"cmp{r}{side}")
                for workload, value in figures.items():
                    samples[side].setdefault(workload, []).append(value)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"base {args.base} vs the working tree, median of {args.rounds} (min-max), ops/s")
    print(f"{'workload':32} {'base':>22} {'new':>22} {'new/base':>9}")
    for workload, base_values in samples["base"].items():
        new_values = samples["new"][workload]
        b, n = statistics.median(base_values), statistics.median(new_values)
        spread_b = f"{b:8.0f} ({min(base_values):.0f}-{max(base_values):.0f})"
        spread_n = f"{n:8.0f} ({min(new_values):.0f}-{max(new_values):.0f})"
        ratio = n / b if b > 0 else float("nan")
        print(f"{workload:32} {spread_b:>22} {spread_n:>22} {ratio:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
