"""The asyncio sender of deferred wake-ups (see :mod:`redreentrant._core.turns`): a
timer on the manager's loop, and a task per batch of wake-ups whose turns are over.

A timer alone would be dropped with its loop: ``asyncio.run`` ending right after a
release (its manager not closed) would leave the waiters asleep until their own
time-outs. So a *guard* task, made with the first deferral, waits for the loop's end:
``asyncio.run`` cancels it with the other tasks, and it sends what is still pending
before the loop closes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from .._core.effects import Steps
from .._core.engine import Engine
from .._core.turns import Due


class AsyncWaker:
    """Sends ``engine``'s deferred wake-ups with ``run`` when they are due."""

    def __init__(self, engine: Engine, run: Callable[[Steps[None]], Awaitable[None]]) -> None:
        self._engine = engine
        self._run = run
        self._timer: asyncio.TimerHandle | None = None
        self._next: float | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._guard: asyncio.Task[None] | None = None
        self._stopped = False

    def arm(self, due: float) -> None:
        """A wake-up is due at ``due`` (monotonic): look then at the latest. Called on
        the manager's loop (a release's steps run there)."""
        if self._stopped or (self._next is not None and self._next <= due):
            return
        loop = asyncio.get_running_loop()
        if self._guard is None:
            self._guard = loop.create_task(self._guarding(), name="redreentrant-waker")
        if self._timer is not None:
            self._timer.cancel()
        self._next = due
        # A delay, not call_at: another loop's clock need not be time.monotonic.
        self._timer = loop.call_later(max(0.0, due - self._engine.clock()), self._look)

    def _look(self) -> None:
        self._timer = None
        self._next = None
        due, later = self._engine.turns.due()
        if later is not None:
            self.arm(later)
        if due:
            task = asyncio.get_running_loop().create_task(self._send(due))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _guarding(self) -> None:
        """Wait for the loop's end (a cancellation), then send what is pending."""
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            if not self._stopped:
                await self._send(self._engine.turns.flush())
            raise

    async def _send(self, due: list[Due]) -> None:
        with contextlib.suppress(Exception):  # a master that failed: see send_wakes
            await self._run(self._engine.send_wakes(due))

    async def stop(self) -> None:
        """Send what is pending now, and stop the timer."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.cancel()
            await asyncio.wait({guard})  # ended here, not left pending on a loop that closes
        due = self._engine.turns.flush()
        if due:
            await self._send(due)
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
