"""The asyncio watchdog: one task per manager, the same rounds and loss rules as the
sync watchdog (:func:`redreentrant.watchdog.tick_steps`)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable

from ..holds import Hold, Holds
from ..quorum import Quorum, Steps
from ..watchdog import WatchdogBase, log


class AsyncWatchdog(WatchdogBase[Awaitable[list[Hold]]]):
    """Renews the manager's watchdog-managed leases every ``lease / 3``."""

    def __init__(
        self,
        run: Callable[[Steps[list[Hold]]], Awaitable[list[Hold]]],
        quorum: Quorum,
        holds: Holds,
        lease: float,
        report: Callable[[Hold], object],
    ) -> None:
        super().__init__(run, quorum, holds, lease, report)
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def ensure_started(self) -> None:
        if not self._stopped and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.tick()

    async def tick(self) -> None:
        """One renewal round over all managed holds."""
        try:
            lost = await self._tick()
        except Exception:
            log.exception("redreentrant watchdog: renewal round failed")
            return
        for hold in lost:
            result = self._report(hold)
            if inspect.isawaitable(result):
                try:
                    await result
                except Exception:
                    log.exception("redreentrant: on_lost hook raised")

    async def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
