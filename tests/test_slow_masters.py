"""Masters whose round trip nears the master timeout stay usable (real packet delays,
jitter and loss in a network lab: :mod:`redreentrant.testing.netlab`).

A master that answers a command within ``master_timeout`` must be usable, by a manager
that knew it before a cut as by a new one: connecting, loading the scripts and probing
each fit in their own deadline, and loading scripts costs a connection's first round
no round trip of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers import aw, entered, run

import redreentrant.asyncio as aio
from redreentrant import LockManager, QuorumUnavailableError
from redreentrant.testing import NetLab

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

#: each way, ms: a round trip of 180 ms, against a master timeout of 250 ms
DELAY_MS = 90
MASTER_TIMEOUT = 0.25
LEASE = 3.0
#: what happens between two counts of grants (``lab`` is passed): nothing, or a cut of
#: every master for 1.5 s, healed
Between = Callable[[NetLab], None]


def nothing(lab: NetLab) -> None:
    pass


def cut_everything_and_heal(lab: NetLab) -> None:
    for i in range(lab.masters):
        lab.cut(i)
    time.sleep(1.5)
    for i in range(lab.masters):
        lab.heal(i)
        lab.delay(i, DELAY_MS)


def counts(lab: NetLab, urls: list[str], flavour: str, between: Between) -> tuple[int, int]:
    """How many non-blocking acquires (each released) one new manager gets in 3 s,
    then, after ``between(lab)``, in 6 s more; a try whose masters failed counts as
    none. Run inside the lab."""
    manager = LockManager if flavour == "sync" else aio.LockManager

    async def main() -> tuple[int, int]:
        async with entered(manager(urls, lease=LEASE, master_timeout=MASTER_TIMEOUT)) as mgr:
            before = await grants(mgr, 3.0)
            between(lab)
            return before, await grants(mgr, 6.0)

    return run(main())


async def grants(mgr: Any, seconds: float) -> int:
    got, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        lock = mgr.lock("slow")
        try:
            if await aw(lock.acquire(blocking=False)):
                got += 1
                await aw(lock.release())
        except QuorumUnavailableError:
            await asyncio.sleep(0.05)
    return got


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_masters_whose_round_trip_nears_the_master_timeout_are_used_also_after_a_cut(
    make_lab: Callable[..., NetLab], flavour: str
) -> None:
    lab = make_lab(5, 0)
    for i in range(5):
        lab.delay(i, DELAY_MS)
    with lab.entered():
        # Each acquire and each release is a round trip (180 ms): about two grants a
        # second, by a new manager, and again once a cut of every master healed.
        before, after = counts(lab, lab.urls(), flavour, cut_everything_and_heal)
    assert before >= 3 and after >= 5, (before, after)


@pytest.mark.parametrize("fault", ["loss", "jitter"])
def test_a_client_whose_path_loses_or_jitters_packets_still_gets_the_lock(
    make_lab: Callable[..., NetLab], fault: str
) -> None:
    lab = make_lab(5, 1)
    for i in range(5):
        if fault == "loss":
            lab.loss(i, 20, client=0)
        else:
            lab.delay(i, 120, jitter_ms=60, client=0)  # 60 to 180 ms each way
    with lab.entered():
        before, after = counts(lab, lab.urls(client=0), "sync", nothing)
    assert before + after >= 3, (before, after)
