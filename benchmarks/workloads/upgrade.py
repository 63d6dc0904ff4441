"""Upgrade: cycles/s of ``with rw.upgradeable:`` + ``upgrade()`` + ``downgrade()``
against ``with rw.upgradeable:`` alone, ``with rw.write:`` and a plain lock, from one
thread on 1 and 5 masters, sliced as the uncontended workload is; and the script calls
(EVALSHA) per cycle on each master. The report prints what an upgrade and a downgrade
add to a cycle.
"""

from __future__ import annotations

from benchcommon import RR, Context

from workloads.uncontended import RR_LOCK, run_kinds

UPGRADEABLE = f"{RR} rw.upgradeable"
UPGRADE = f"{RR} upgradeable+upgrade+downgrade"


def run(ctx: Context) -> None:
    kinds = [
        (UPGRADEABLE, "rw:upgradeable", RR),
        (UPGRADE, "upgrade", RR),
        (f"{RR} rw.write", "rw:write", RR),
        (RR_LOCK, "lock", RR),
    ]
    run_kinds(ctx, "upgrade", kinds)
