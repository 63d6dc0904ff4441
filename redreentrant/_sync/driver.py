"""The sync driver: carries out the core's effects with threads and redis-py."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from .._core.effects import (
    Fanout,
    Handed,
    Messages,
    Notify,
    Pause,
    Relay,
    Steps,
    Wait,
    Watch,
)
from .._core.seams import Hub, Transport

T = TypeVar("T")


class SyncDriver:
    """Drives an algorithm's effects with one manager's transport and wake-up hub."""

    def __init__(self, transport: Transport, hub: Hub, check_open: Callable[[], None]) -> None:
        self.transport = transport
        self.hub = hub
        self._check_open = check_open
        # The runs under way: close() lets them finish their clean-up on the transport.
        self._active: set[object] = set()

    def run(self, steps: Steps[T]) -> T:
        """Run ``steps`` to their end in the calling thread."""
        self._check_open()
        return self.finish(steps)

    def finish(self, steps: Steps[T]) -> T:
        """Run ``steps`` to their end, also while the manager closes (its last
        clean-ups, before the transport is closed)."""
        watched: list[tuple[str, str]] = []
        fanout = self.transport.fanout
        self._active.add(steps)
        try:
            effect = next(steps)
            result: object
            while True:
                try:
                    # Most effects are rounds: carried out without a dispatch call.
                    if type(effect) is Fanout:
                        result = fanout(effect)
                    elif type(effect) is Notify:  # the next most common: every release
                        self.hub.notify(effect)
                        result = None
                    else:
                        result = self._carry_out(effect, watched)
                except BaseException as error:
                    effect = steps.throw(error)
                    continue
                effect = steps.send(result)
        except StopIteration as stop:
            value: T = stop.value
            return value
        finally:
            self._active.discard(steps)
            for channel, owner in watched:
                self.hub.unwatch(channel, owner)

    def _carry_out(self, effect: object, watched: list[tuple[str, str]]) -> object:
        """Any effect but a round and a notice (carried out in :meth:`finish`)."""
        if isinstance(effect, Wait):
            return self.hub.wait(effect.channel, effect.owner, effect.generation, effect.timeout)
        if isinstance(effect, Pause):
            self.hub.pause(effect.seconds)
            return None
        if isinstance(effect, Handed):
            return self.hub.handed(effect.channel, effect.owner)
        if isinstance(effect, Messages):
            return self.hub.messages(effect.channel, effect.owner)
        if isinstance(effect, Relay):
            self.hub.relay(effect.channel, effect.owner)
            return None
        if isinstance(effect, Watch):
            generation = self.hub.watch(
                effect.channel, effect.owner, effect.broadcast, effect.targeted
            )
            watched.append((effect.channel, effect.owner))
            return generation
        raise TypeError(f"unknown effect {effect!r}")

    def drain(self, timeout: float) -> None:
        """Wait (bounded) until no run is under way."""
        deadline = time.monotonic() + timeout
        while self._active and time.monotonic() < deadline:
            time.sleep(0.005)
