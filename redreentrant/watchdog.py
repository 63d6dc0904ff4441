"""The watchdog: renews the leases of held locks and reports the ones it loses.

Each manager has one (a pair of daemon threads in the sync API, of tasks in the asyncio
API), started with its first watchdog-managed hold:

- the **renewer** renews every managed hold every ``lease / 3`` on a fixed schedule
  (one script call per master per lock kind, batched), and frees at once the holds of
  owners (threads, tasks) that ended while holding a lock;
- the **deadline clock** declares a hold lost when its validity is about to end
  without a renewal (:func:`verdict_margin` before it), whatever the renewer is doing:
  a slow or stalled round can never delay the verdict past the validity's end;
- every loss is reported outside both (a thread or task per report), so a slow
  ``on_lost`` callback delays neither renewals nor other reports.

A hold is lost when the renewer finds it gone from too many masters to reach a quorum
again, when the deadline clock finds it overdue, or when its owner ended.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from .errors import ManagerClosedError
from .holds import Hold, Holds
from .owner import listen_for_owner_ends, owner_alive
from .quorum import Quorum, Steps
from .steps import Renewal, release_steps, renew_steps

log = logging.getLogger("redreentrant")
R = TypeVar("R")  # what a round gives: the lost holds, or an awaitable of them


def verdict_margin(interval: float) -> float:
    """How long before a hold's validity ends the deadline clock declares it lost if it
    was not renewed: a tenth of the renewal interval, at least 50 ms, at most half the
    interval (room for the report to start before the validity ends)."""
    return min(interval / 2, max(interval / 10, 0.05))


def judge(renewals: Sequence[Renewal], holds: Holds) -> list[Hold]:
    """Apply one renewal round to the holds; return the holds found lost (gone from so
    many masters that no renewal can reach a quorum). A hold that merely failed to renew
    is tried again at the next tick, until the deadline clock calls it lost."""
    lost: list[Hold] = []
    for r in renewals:
        if r.valid_until is not None:
            holds.renewed(r.hold, r.valid_until)
        elif r.gone and holds.mark_lost(
            r.hold, "the lock's key was deleted or taken over on a majority of masters"
        ):
            lost.append(r.hold)
    return lost


def tick_steps(
    q: Quorum,
    holds: Holds,
    lease: float,
    cluster: set[int],
    alive: Callable[[str], bool],
    renew: bool = True,
) -> Steps[list[Hold]]:
    """One watchdog round: free the holds of owners that ended, then (``renew``) renew
    every other managed hold. Returns the holds found lost (dead owners included)."""
    dead = holds.take_dead(alive)
    for h in dead:
        # Best effort: what cannot be freed now lapses within one lease.
        with contextlib.suppress(Exception):
            yield from release_steps(q, h.kind, h.name, h.owner, 0)
    held = holds.managed() if renew else []
    if not held:
        return dead
    renewals = yield from renew_steps(q, held, lease, cluster)
    return dead + judge(renewals, holds)


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
        self.margin = verdict_margin(self.interval)
        # masters found to be Redis Cluster nodes: renewals are split by hash slot there
        self._cluster: set[int] = set()
        self._stopping = False
        listen_for_owner_ends(self)

    def _round(self, renew: bool = True) -> R:
        steps = tick_steps(
            self._quorum, self._holds, self._lease, self._cluster, owner_alive, renew
        )
        return self._run(steps)

    def _failed(self) -> None:
        """A round raised: quiet when the manager is closing, else logged."""
        if not self._stopping:
            log.exception("redreentrant watchdog: renewal round failed")

    def owner_ended(self, token: str) -> None:
        """An owner (thread or task) ended: free its holds now if it had any here."""
        if not self._stopping and self._holds.owned_by(token):
            self._sweep_soon()

    def _sweep_soon(self) -> None:
        raise NotImplementedError


class Watchdog(WatchdogBase[list[Hold]]):
    """The sync watchdog of one manager: a renewer thread and a deadline-clock thread."""

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
        self._sweep = threading.Event()  # an owner ended: free its holds now
        self._clock = threading.Event()  # a new hold: the deadline clock looks again
        self._threads: list[threading.Thread] = []

    def ensure_started(self) -> None:
        self._clock.set()
        if self._threads:
            return
        with self._guard:
            if not self._threads and not self._stop.is_set():
                self._threads = [
                    threading.Thread(target=loop, name=name, daemon=True)
                    for loop, name in (
                        (self._renewer, "redreentrant-watchdog"),
                        (self._deadline_clock, "redreentrant-deadlines"),
                    )
                ]
                for thread in self._threads:
                    thread.start()

    def _renewer(self) -> None:
        next_tick = time.monotonic() + self.interval
        while not self._stop.is_set():
            if self._sweep.wait(max(0.0, next_tick - time.monotonic())):
                self._sweep.clear()
                if not self._stop.is_set():
                    self.tick(renew=False)
                continue
            self.tick()
            # A fixed schedule: the period does not drift by the rounds' durations.
            next_tick = max(next_tick + self.interval, time.monotonic())

    def _deadline_clock(self) -> None:
        while not self._stop.is_set():
            self._clock.clear()
            now = time.monotonic()
            for hold in self._holds.overdue(now, self.margin):
                self._deliver(hold)
            due = self._holds.next_deadline(self.margin)
            self._clock.wait(None if due is None else max(0.0, due - now))

    def tick(self, renew: bool = True) -> None:
        """One round: free dead owners' holds, renew the others (``renew``)."""
        try:
            lost = self._round(renew)
        except ManagerClosedError:
            return
        except Exception:
            self._failed()
            return
        for hold in lost:
            self._deliver(hold)

    def _deliver(self, hold: Hold) -> None:
        # A thread per report: losses are rare, and a slow on_lost must not hold up
        # renewals or the report of another loss.
        threading.Thread(
            target=self._report, args=(hold,), name="redreentrant-on-lost", daemon=True
        ).start()

    def _sweep_soon(self) -> None:
        self._sweep.set()

    def stop(self) -> None:
        self._stopping = True
        self._stop.set()
        self._sweep.set()
        self._clock.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)

    def after_fork(self) -> None:
        """In a forked child: no thread runs, and the parent's holds are not renewed."""
        self._reset()
