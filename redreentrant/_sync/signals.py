"""The sync :class:`LostSignal`: tells a hold's work that the hold was lost."""

from __future__ import annotations

import threading
import time

from .._core.engine import Engine
from .._core.holds import Hold


class LostSignal:
    """Set once the calling owner's hold is lost: the watchdog found it gone or could
    not renew it in time, a re-entry or release found it lost, it reached its
    ``max_hold``, or its validity ran out (a fixed lease that expired counts).

    Poll it (``if lock.lost.is_set(): ...``) or wait on it (``lock.lost.wait(t)``),
    like a :class:`threading.Event` that only the library sets. A release is not a
    loss: the signal of a hold released normally is never set.
    """

    def __init__(self, engine: Engine, hold: Hold) -> None:
        self._engine = engine
        self._hold = hold
        self._event = threading.Event()

    def notify_lost(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        """Whether the hold is lost (or its validity ran out)."""
        engine = self._engine
        return self._event.is_set() or engine.valid_until(self._hold) <= engine.clock()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the hold is lost, at most ``timeout`` seconds (None: no limit);
        True if it was lost, False on time-out."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            step = self._engine.valid_until(self._hold) - self._engine.clock()
            if end is not None:  # and wake when the validity ends, if that is sooner
                step = min(step, end - time.monotonic())
                if step <= 0:
                    return False
            self._event.wait(max(step, 0.0))
        return True

    def __repr__(self) -> str:
        return f"<LostSignal {self._hold.name!r} {'set' if self.is_set() else 'clear'}>"
