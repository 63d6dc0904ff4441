"""Mutual exclusion, checked directly: a non-atomic read-sleep-write counter.

A broken lock loses increments; the unlocked control run shows the counter does lose
them when nothing excludes, so these tests can fail.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from helpers import WORKERS, in_threads, increment, lock_keys, many_managers, wait_until

from redreentrant import LockManager
from redreentrant.testing import LocalEnsemble


def hammer(guard: Callable[[], AbstractContextManager[object]], threads: int, times: int) -> int:
    counter = [0]

    def work() -> None:
        for _ in range(times):
            with guard():
                increment(counter)

    in_threads(work, [()] * threads)
    return counter[0]


def test_the_counter_loses_updates_without_a_lock() -> None:
    assert hammer(nullcontext, threads=4, times=10) < 40


def test_threads_of_one_manager_exclude_each_other(manager: LockManager) -> None:
    lock = manager.lock("counter")
    assert hammer(lambda: lock, threads=6, times=15) == 90


def test_threads_with_their_own_managers_exclude_each_other(urls: list[str]) -> None:
    with many_managers(4, urls) as managers:
        local = threading.local()

        def guard() -> AbstractContextManager[object]:
            if not hasattr(local, "lock"):
                local.lock = managers[threading.get_ident() % 4].lock("counter2")
            return local.lock  # type: ignore[no-any-return]

        assert hammer(guard, threads=4, times=15) == 60


def test_exclusion_holds_with_two_of_five_masters_down(ensemble: LocalEnsemble) -> None:
    ensemble[0].kill()
    ensemble[3].pause()
    # Every round waits out the frozen master: keep its time-out short.
    with LockManager(ensemble.urls, master_timeout=0.03, lease=1.0) as mgr:
        lock = mgr.lock("degraded")
        assert hammer(lambda: lock, threads=4, times=8) == 32
    # Resumed, the frozen master runs what was queued for it: tries, and the clean-ups
    # sent after them, but not those never sent once its connection owed too many
    # replies (docs/safety.md, "Late answers and stray grants"). What they leave there
    # lapses within a lease.
    ensemble[3].resume()
    wait_until(lambda: not lock_keys(ensemble), "the frozen master's leftovers lapsed", 10)


def test_processes_exclude_each_other(urls: list[str], tmp_path: Path) -> None:
    counter = tmp_path / "counter"
    counter.write_text("0")
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKERS), "count", ",".join(urls), "proc", str(counter), "15"]
        )
        for _ in range(4)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    assert counter.read_text() == "60"
