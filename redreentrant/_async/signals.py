"""The asyncio :class:`LostSignal`: tells a hold's work that the hold was lost, and
(``cancel_on_loss``) cancels the owning task."""

from __future__ import annotations

import asyncio
import contextlib

from .._core.engine import Engine
from .._core.holds import Hold


class LostSignal:
    """The asyncio twin of :class:`redreentrant.LostSignal`: poll it with
    :meth:`is_set`, or ``await lock.lost.wait()``.

    Made in the owner's event loop; it may be told of the loss from any thread.
    """

    def __init__(self, engine: Engine, hold: Hold | None = None) -> None:
        self._engine = engine
        self._hold = hold
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        #: with cancel_on_loss: the task to cancel, and whether this signal cancelled it
        self.task: asyncio.Task[object] | None = None
        self.cancelled = False
        self._timer: asyncio.TimerHandle | None = None

    def attach(self, hold: Hold) -> None:
        """The hold this signal stands for (made before the hold, for cancel_on_loss);
        a fixed lease's end is then watched, since no watchdog renews it."""
        self._hold = hold
        if self.task is not None and not hold.managed:
            self._watch()

    def notify_lost(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self._loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        self._event.set()
        if self._timer is not None:
            self._timer.cancel()
        task = self.task
        if task is not None and not task.done() and not self.cancelled:
            self.cancelled = True
            name = self._hold.name if self._hold is not None else "?"
            task.cancel(f"lock {name!r} was lost (cancel_on_loss)")

    def _watch(self) -> None:
        """Mark a fixed-lease hold lost when its validity ends (extend() moves it)."""
        hold = self._hold
        engine = self._engine
        if hold is None or hold.lost is not None or not engine.holds.is_current(hold):
            return  # lost (and told) already, or released
        left = hold.valid_until - engine.clock()
        if left <= 0:
            engine.lose(hold, "its fixed lease ran out")
            return
        self._timer = self._loop.call_later(left, self._watch)

    def is_set(self) -> bool:
        """Whether the hold is lost (or its validity ran out)."""
        engine = self._engine
        return self._event.is_set() or engine.valid_until(self._hold) <= engine.clock()

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until the hold is lost, at most ``timeout`` seconds (None: no limit);
        True if it was lost, False on time-out."""
        end = None if timeout is None else self._loop.time() + timeout
        while not self.is_set():
            step = self._engine.valid_until(self._hold) - self._engine.clock()
            if end is not None:  # and wake when the validity ends, if that is sooner
                step = min(step, end - self._loop.time())
                if step <= 0:
                    return False
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._event.wait(), max(step, 0.0))
        return True

    def __repr__(self) -> str:
        name = self._hold.name if self._hold is not None else "?"
        return f"<LostSignal {name!r} {'set' if self.is_set() else 'clear'}>"
