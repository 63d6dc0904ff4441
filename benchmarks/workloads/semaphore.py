"""Semaphore: permits acquired+released/s of ``mgr.semaphore(name, permits=P)``, P = 1
and 4, against ``mgr.lock(name)`` (same manager settings), on 1 and 5 masters: from one
thread (and one asyncio task, P = 1), sliced as the uncontended workload is; then from
16 threads (``--threads``) on one manager, each holder doing the contended workload's
GET and SET +1: the share, whether the counter is exact (P = 1 and the lock) and the
most holds in force at once in the process (counted around ``acquire()``'s return and
``release()``'s call, at most P). Also the script calls (EVALSHA) per cycle on each
master, one thread.
"""

from __future__ import annotations

from benchcommon import RR, RR_ASYNC, Context, LibSpec

from workloads.contended import ContendedCase
from workloads.uncontended import RR_ASYNC_LOCK, RR_LOCK, run_kinds

SEM_PERMITS = (1, 4)


def sem_label(lib: str, permits: int) -> str:
    return f"{lib} semaphore P={permits}"


def run(ctx: Context) -> None:
    kinds = [
        (RR_LOCK, "lock", RR),
        *((sem_label(RR, p), f"semaphore:{p}", RR) for p in SEM_PERMITS),
        (RR_ASYNC_LOCK, "lock", RR_ASYNC),
        (sem_label(RR_ASYNC, 1), "semaphore:1", RR_ASYNC),
    ]
    # Every contending row counts its holds in force (the lock's too: the same cost).
    specs = [(RR_LOCK, "lock", 1), *((sem_label(RR, p), f"semaphore:{p}", p) for p in SEM_PERMITS)]
    cases = [
        ContendedCase(
            "threads",
            ctx.args.threads,
            n,
            LibSpec(RR, label, {"kind": kind, "count_holders": True}),
            permits=p,
        )
        for n in (1, 5)
        if n <= len(ctx.urls)
        for label, kind, p in specs
    ]
    run_kinds(ctx, "semaphore", kinds, cases, "1 thread, ")
