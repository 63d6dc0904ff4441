"""Multi-lock: acquire+release cycles/s of ``mgr.multi_lock([a, b, c])`` against three
nested plain locks (``with mgr.lock(a), mgr.lock(b), mgr.lock(c):``) and one plain
lock, from one thread on 1 and 5 masters, sliced as the uncontended workload is; and
the script calls (EVALSHA) per cycle on each master.
"""

from __future__ import annotations

from benchcommon import RR, Context

from workloads.uncontended import RR_LOCK, run_kinds

MULTI3 = f"{RR} multi_lock of 3"
NESTED3 = f"{RR} 3 nested locks"


def run(ctx: Context) -> None:
    kinds = [(RR_LOCK, "lock", RR), (MULTI3, "multi:3", RR), (NESTED3, "nested:3", RR)]
    run_kinds(ctx, "multilock", kinds)
