#!/usr/bin/env python3
"""Instructions per acquire+release cycle, counted by valgrind: bench_instructions.py.

    python benchmarks/bench_instructions.py                      # raw floor, sync, asyncio
    python benchmarks/bench_instructions.py --masters-count 1,5 --subjects rr,raw
    python benchmarks/bench_instructions.py --base HEAD~1        # also the rr side at a revision

On a shared machine the timings of the other scripts move by 10% and more from one
minute to the next, so a change to the hot path that saves 2% cannot be told from
noise there. This script counts the instructions the client process executes per
uncontended acquire+release cycle instead (valgrind's callgrind, user space only):
the same figure from run to run, whatever else the machine does, so two revisions
compare exactly. It is a measure of client CPU, not of speed: the time a cycle
takes also depends on the round trips (see docs/performance.md).

Each subject runs in a fresh process under valgrind, twice (``--short`` and
``--long`` counted cycles, after the same warm-up, with ``PYTHONHASHSEED=0`` and the
garbage collector's warm-up objects frozen), and the difference of the two totals,
divided by the difference of the cycle counts, is the figure: what the process does
once (start-up, imports, connecting) cancels out.

Subjects: ``raw`` (redreentrant's two script calls on a raw redis-py connection per
master, the RAW floor of bench_all.py), ``rr`` (the sync API), ``rr-async`` (the
asyncio API), ``redis-py`` (redis-py's ``Lock``, 1 master only). Prints figures and
exits 0; needs ``valgrind`` on the PATH. Not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # for the sibling module, imported after it

from benchcommon import REPO_ROOT, revision_tree, servers  # noqa: E402

SUBJECTS = ("raw", "rr", "rr-async", "redis-py")

# The child: imports the tree given first, warms up, freezes what the garbage collector
# has seen so far (so that a full collection of the imports' objects cannot fall into
# one run and not the other), then runs the counted cycles.
CHILD = r"""
import asyncio, gc, sys
tree, bench, subject, urls, n = sys.argv[1:6]
urls, n = urls.split(","), int(n)
sys.path[:0] = [tree, bench]
WARMUP = 200

def settle():
    gc.collect()
    gc.freeze()

if subject == "raw":
    from benchcommon import RawFloor
    raw = RawFloor(urls, "ins:raw")
    for _ in range(WARMUP): raw.cycle()
    settle()
    for _ in range(n): raw.cycle()
elif subject == "rr":
    from redreentrant import LockManager
    mgr = LockManager(urls)
    lock = mgr.lock("ins:rr")
    for _ in range(WARMUP): lock.acquire(); lock.release()
    settle()
    for _ in range(n): lock.acquire(); lock.release()
    mgr.close()
elif subject == "rr-async":
    from redreentrant.asyncio import LockManager as AsyncLockManager
    async def main():
        async with AsyncLockManager(urls) as mgr:
            lock = mgr.lock("ins:rr-async")
            for _ in range(WARMUP): await lock.acquire(); await lock.release()
            settle()
            for _ in range(n): await lock.acquire(); await lock.release()
    asyncio.run(main())
elif subject == "redis-py":
    import redis
    client = redis.Redis.from_url(urls[0])
    lock = client.lock("ins:redis-py", timeout=30)
    for _ in range(WARMUP): lock.acquire(); lock.release()
    settle()
    for _ in range(n): lock.acquire(); lock.release()
"""


def instructions(tree: Path, subject: str, urls: list[str], cycles: int) -> int:
    """The instructions valgrind counted in one child run of ``cycles`` counted cycles."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-c",
            CHILD,
            str(tree),
            str(HERE),
            subject,
            ",".join(urls),
            str(cycles),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"{subject}: valgrind run failed:\n{out.stderr[-2000:]}")
    return int(found[1])


def per_cycle(tree: Path, subject: str, urls: list[str], short: int, long: int) -> float:
    return (instructions(tree, subject, urls, long) - instructions(tree, subject, urls, short)) / (
        long - short
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument(
        "--subjects", default="raw,rr,rr-async", help=f"comma-separated, of {','.join(SUBJECTS)}"
    )
    p.add_argument("--masters-count", default="1", help="comma-separated master counts (1)")
    p.add_argument("--short", type=int, default=300, help="counted cycles of the short run")
    p.add_argument("--long", type=int, default=1300, help="counted cycles of the long run")
    p.add_argument("--base", help="also count the rr subjects at this git revision")
    args = p.parse_args()
    subjects = [s for s in args.subjects.split(",") if s]
    unknown = set(subjects) - set(SUBJECTS)
    if unknown or args.long <= args.short:
        p.error(f"unknown subjects {sorted(unknown)}" if unknown else "--long must exceed --short")
    if shutil.which("valgrind") is None:
        print("valgrind is not on the PATH: nothing counted", file=sys.stderr)
        return 2
    counts = [int(c) for c in args.masters_count.split(",")]
    rows: list[tuple[int, str, float]] = []
    with contextlib.ExitStack() as stack:
        trees = [("", REPO_ROOT)]
        if args.base:
            trees.append((f" @ {args.base}", stack.enter_context(revision_tree(args.base))))
        urls, _ = stack.enter_context(servers(None))
        for count in counts:
            for subject in subjects:
                if subject == "redis-py" and count != 1:
                    continue
                for label, tree in trees if subject.startswith("rr") else trees[:1]:
                    figure = per_cycle(tree, subject, urls[:count], args.short, args.long)
                    rows.append((count, subject + label, figure))
                    print(f"  {count} master(s), {subject}{label}: {figure:,.0f}", file=sys.stderr)
    print("INSTRUCTIONS per uncontended acquire+release cycle (client process, user space)")
    print(f"{'masters':8} {'subject':28} {'instructions':>13} {'÷ raw':>7}")
    for count, subject, figure in rows:
        raw = next((f for c, s, f in rows if c == count and s == "raw"), None)
        ratio = f"{figure / raw:7.2f}" if raw else f"{'':7}"
        print(f"{count:<8} {subject:28} {figure:13,.0f} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
