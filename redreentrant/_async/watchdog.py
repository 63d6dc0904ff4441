"""The asyncio watchdog: a renewer task and a deadline-clock task per manager, with the
same rounds and loss rules as the sync watchdog (:mod:`redreentrant._core.watchdog`)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable

from .._core.effects import Steps
from .._core.engine import Engine
from .._core.errors import ManagerClosedError
from .._core.holds import Hold
from .._core.watchdog import WatchdogBase, log


class AsyncWatchdog(WatchdogBase[Awaitable[list[Hold]]]):
    """Renews the manager's watchdog-managed leases every ``lease / 3``."""

    def __init__(
        self,
        run: Callable[[Steps[list[Hold]]], Awaitable[list[Hold]]],
        engine: Engine,
        report: Callable[[Hold], object],
    ) -> None:
        super().__init__(run, engine, report)
        self._tasks: list[asyncio.Task[None]] = []
        self._reports: set[asyncio.Task[object]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweep = asyncio.Event()
        self._clock = asyncio.Event()

    def ensure_started(self, hold: Hold) -> None:
        if self.clock_needed(hold):
            self._clock.set()
        tasks = self._tasks  # none yet, or the renewer and the deadline clock
        if self._stopping or (tasks and not (tasks[0].done() or tasks[1].done())):
            return
        for task in self._tasks:
            task.cancel()
        self._loop = loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._renewer()), loop.create_task(self._deadlines())]

    async def _renewer(self) -> None:
        next_tick = time.monotonic() + self.interval
        # ``_stopping`` is checked as well as the cancellation: on 3.11, wait_for can
        # swallow a cancellation that comes as its awaitable finishes.
        while not self._stopping:
            try:
                await asyncio.wait_for(self._sweep.wait(), max(0.0, next_tick - time.monotonic()))
            except asyncio.TimeoutError:
                await self.tick()
                # A fixed schedule: the period does not drift by the rounds' durations.
                next_tick = max(next_tick + self.interval, time.monotonic())
            else:
                self._sweep.clear()
                if not self._stopping:
                    await self.tick(renew=False)

    async def _deadlines(self) -> None:
        while not self._stopping:
            self._clock.clear()
            lost, wait = self._overdue()
            for hold in lost:
                self._deliver(hold)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._clock.wait(), wait)

    async def tick(self, renew: bool = True) -> None:
        """One round: free dead owners' holds, renew the others (``renew``)."""
        try:
            lost = await self._round(renew)
        except ManagerClosedError:
            return
        except Exception:
            self._failed()
            return
        for hold in lost:
            self._deliver(hold)

    def _deliver(self, hold: Hold) -> None:
        # Reported on the loop's next turn, outside the round; a coroutine on_lost runs
        # as a task of its own, so a slow one delays neither renewals nor other reports.
        asyncio.get_running_loop().call_soon(self._report_now, hold)

    def _report_now(self, hold: Hold) -> None:
        result = self._report(hold)
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(self._await_report(result))
            self._reports.add(task)
            task.add_done_callback(self._reports.discard)

    async def _await_report(self, result: Awaitable[object]) -> object:
        try:
            return await result
        except Exception:
            log.exception("redreentrant: on_lost hook raised")
            return None

    def _sweep_soon(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._sweep.set()
        else:  # an owner of another thread ended: hand over to our loop
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._sweep.set)

    async def stop(self) -> None:
        self._stopping = True
        self._sweep.set()
        self._clock.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
