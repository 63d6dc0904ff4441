"""The sync sender of deferred wake-ups (see :mod:`redreentrant._core.turns`): one
thread per manager, started with the first deferral, that sleeps until the next one is
due and sends the wake-ups whose turns are over.

A thread of its own rather than the watchdog's: a manager may hold no managed lock at
all, and the watchdog's deadline clock must never wait on a round. Not a daemon: a
program that ends right after a release (its manager not closed) still sends the
wake-up that release deferred, or the waiters would sleep until their own time-outs.
Once the main thread has ended and nothing is pending, the thread ends too (it looks
every :data:`IDLE_LOOK` seconds), so it never keeps a program from exiting.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from .._core.effects import Steps
from .._core.engine import Engine

#: how often (seconds) an idle waker looks whether the main thread has ended
IDLE_LOOK = 0.1


class Waker:
    """Sends ``engine``'s deferred wake-ups with ``run`` when they are due."""

    def __init__(self, engine: Engine, run: Callable[[Steps[None]], None]) -> None:
        self._engine = engine
        self._run = run
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._next: float | None = None  # when the thread looks next (None: idle)
        self._thread: threading.Thread | None = None
        self._stopped = False

    def arm(self, due: float) -> None:
        """A wake-up is due at ``due`` (monotonic): look then at the latest."""
        with self._cond:
            if self._stopped or (self._next is not None and self._next <= due):
                return  # the thread looks by then anyway: no need to wake it
            self._next = due
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="redreentrant-waker", daemon=False
                )
                try:
                    self._thread.start()
                except RuntimeError:  # the interpreter is finalizing: no new thread
                    self._thread = None
                    self._next = None
            else:
                self._cond.notify()

    def _loop(self) -> None:
        turns = self._engine.turns
        main = threading.main_thread()
        while True:
            with self._cond:
                while not self._stopped:
                    at = self._next
                    if at is None:
                        if not main.is_alive():
                            self._thread = None  # the program ends: a new arm starts one
                            return
                        self._cond.wait(IDLE_LOOK)
                        continue
                    delay = at - self._engine.clock()
                    if delay <= 0:
                        break
                    self._cond.wait(delay)
                if self._stopped:
                    return
                self._next = None
            due, later = turns.due()
            if later is not None:
                self.arm(later)
            if due:
                with contextlib.suppress(Exception):  # a master that failed: see send_wakes
                    self._run(self._engine.send_wakes(due))

    def stop(self) -> None:
        """Send what is pending now, and stop the thread."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
            thread = self._thread
        due = self._engine.turns.flush()
        if due:
            with contextlib.suppress(Exception):
                self._run(self._engine.send_wakes(due))
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def after_fork(self) -> None:
        """In a forked child: the parent's thread does not run here."""
        self._reset()
