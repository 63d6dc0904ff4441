"""The sync watchdog: a renewer thread and a deadline-clock thread per manager, over
the shared rounds and verdicts of :mod:`redreentrant._core.watchdog`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .._core.effects import Steps
from .._core.engine import Engine
from .._core.errors import ManagerClosedError
from .._core.holds import Hold
from .._core.watchdog import WatchdogBase


class Watchdog(WatchdogBase[list[Hold]]):
    """The sync watchdog of one manager: a renewer thread and a deadline-clock thread."""

    def __init__(
        self,
        run: Callable[[Steps[list[Hold]]], list[Hold]],
        engine: Engine,
        report: Callable[[Hold], object],
    ) -> None:
        super().__init__(run, engine, report)
        self._reset()

    def _reset(self) -> None:
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._sweep = threading.Event()  # an owner ended: free its holds now
        self._clock = threading.Event()  # a new hold: the deadline clock looks again
        self._threads: list[threading.Thread] = []

    def ensure_started(self, hold: Hold) -> None:
        if self.clock_needed(hold):
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
        # Scheduled on the real monotonic clock: a thread sleeps in real time.
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
            lost, wait = self._overdue()
            for hold in lost:
                self._deliver(hold)
            self._clock.wait(wait)

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
