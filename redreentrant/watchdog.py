"""The watchdog: renews the leases of held locks and reports the ones it loses.

One daemon thread per manager (an asyncio task in the asyncio API) wakes every
``lease / 3``, renews every watchdog-managed hold in one round (one script call per
master per lock kind, batched), and judges each hold with :func:`judge`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from .holds import Hold, Holds
from .quorum import Quorum, Steps
from .steps import Renewal, renew_steps

log = logging.getLogger("redreentrant")
R = TypeVar("R")  # what a round gives: the lost holds, or an awaitable of them


def judge(renewals: Sequence[Renewal], holds: Holds, interval: float) -> list[Hold]:
    """Apply one renewal round to the holds; return the holds found lost.

    A hold is lost when its owner's hold is gone from too many masters to ever reach a
    quorum again, or when this round failed and the next one would come after its
    validity ends: loss is reported before the validity runs out, not after.
    """
    now = time.monotonic()
    lost: list[Hold] = []
    for r in renewals:
        h = r.hold
        if h.lost is not None or not holds.is_current(h):
            continue  # released (or already lost) while the round was under way
        if r.valid_until is not None:
            h.valid_until = r.valid_until
        elif r.gone:
            h.lost = "the lock's key was deleted or taken over on a majority of masters"
            lost.append(h)
        elif now + interval >= h.valid_until:
            h.lost = "the lease could not be renewed on a quorum before its validity ended"
            lost.append(h)
    return lost


def tick_steps(
    q: Quorum, holds: Holds, lease: float, cluster: set[int], interval: float
) -> Steps[list[Hold]]:
    """One watchdog round over every managed hold; returns the holds found lost."""
    held = holds.managed()
    if not held:
        return []
    renewals = yield from renew_steps(q, held, lease, cluster)
    return judge(renewals, holds, interval)


class WatchdogBase(Generic[R]):
    """What the sync and asyncio watchdogs share: their manager's rounds and holds."""

    def __init__(
        self,
        run: Callable[[Steps[list[Hold]]], R],
        quorum: Quorum,
        holds: Holds,
        lease: float,
        report: Callable[[Hold], object],
    ) -> None:
        self._run = run
        self._quorum = quorum
        self._holds = holds
        self._lease = lease
        self._report = report
        self.interval = lease / 3
        # masters found to be Redis Cluster nodes: renewals are split by hash slot there
        self._cluster: set[int] = set()

    def _tick(self) -> R:
        return self._run(
            tick_steps(self._quorum, self._holds, self._lease, self._cluster, self.interval)
        )


class Watchdog(WatchdogBase[list[Hold]]):
    """The sync watchdog thread of one manager."""

    def __init__(
        self,
        run: Callable[[Steps[list[Hold]]], list[Hold]],
        quorum: Quorum,
        holds: Holds,
        lease: float,
        report: Callable[[Hold], object],
    ) -> None:
        super().__init__(run, quorum, holds, lease, report)
        self._reset()

    def _reset(self) -> None:
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def ensure_started(self) -> None:
        if self._thread is not None:
            return
        with self._guard:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._loop, name="redreentrant-watchdog", daemon=True
                )
                self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()

    def tick(self) -> None:
        """One renewal round over all managed holds."""
        try:
            lost = self._tick()
        except Exception:
            log.exception("redreentrant watchdog: renewal round failed")
            return
        for hold in lost:
            self._report(hold)

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def after_fork(self) -> None:
        """In a forked child: no thread runs, and the parent's holds are not renewed."""
        self._reset()
