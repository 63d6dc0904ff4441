"""The asyncio driver: carries out the core's effects with tasks and redis.asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

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
from .._core.seams import AsyncHub, AsyncTransport

T = TypeVar("T")


class AsyncDriver:
    """Drives an algorithm's effects with one manager's transport and wake-up hub."""

    def __init__(
        self, transport: AsyncTransport, hub: AsyncHub, check_open: Callable[[], None]
    ) -> None:
        self.transport = transport
        self.hub = hub
        self._check_open = check_open
        # The runs under way: close() lets them finish their clean-up on the transport.
        self._active: set[object] = set()

    async def run(self, steps: Steps[T], shielded: bool = False, check: bool = True) -> T:
        """Run ``steps`` to their end in the calling task.

        ``shielded`` (releases): a cancellation does not stop the steps; it is passed on
        once they ended. The effect it interrupted is carried out again: a round it
        broke off left its connections behind (see the transport), and the calls of a
        release set absolute hold counts, so sending them twice changes nothing. No
        task is made for this. ``check=False`` runs them also while the manager
        closes (its last clean-ups, before the transport is closed)."""
        if check:
            self._check_open()
        watched: list[tuple[str, str]] = []
        held_back: asyncio.CancelledError | None = None
        self._active.add(steps)
        try:
            effect = next(steps)
            while True:
                try:
                    result = await self._carry_out(effect, watched)
                except asyncio.CancelledError as error:
                    if not shielded:
                        effect = steps.throw(error)  # the steps clean up
                        continue
                    held_back = error
                    continue
                except BaseException as error:
                    effect = steps.throw(error)
                    continue
                effect = steps.send(result)
        except StopIteration as stop:
            value: T = stop.value
        except Exception:
            if held_back is not None:
                # Cancelled meanwhile: the caller sees its cancellation. (A release
                # sent again finds that its first send freed the lock: a "loss".)
                raise held_back from None
            raise
        finally:
            self._active.discard(steps)
            for channel, owner in watched:
                self.hub.unwatch(channel, owner)
        if held_back is not None:
            raise held_back
        return value

    def finish(self, steps: Steps[T]) -> Coroutine[Any, Any, T]:
        """Run ``steps`` to their end, also while the manager closes."""
        return self.run(steps, check=False)

    def run_shielded(self, steps: Steps[T]) -> Coroutine[Any, Any, T]:
        """Run ``steps`` to their end even if the caller is cancelled (releases)."""
        return self.run(steps, shielded=True)  # awaited by the caller: no frame of its own

    def _carry_out(self, effect: object, watched: list[tuple[str, str]]) -> Awaitable[object]:
        if isinstance(effect, Fanout):
            # A cancellation mid-round leaves the round's connections behind (see the
            # transport): the undo that follows reaches each master after the round it
            # undoes, on the same connection. So no task or shield is made per round.
            # The transport's own awaitable: no coroutine of ours around each round.
            return self.transport.fanout(effect)
        return self._carry_out_other(effect, watched)

    async def _carry_out_other(self, effect: object, watched: list[tuple[str, str]]) -> object:
        if isinstance(effect, Wait):
            return await self.hub.wait(
                effect.channel, effect.owner, effect.generation, effect.timeout
            )
        if isinstance(effect, Notify):
            self.hub.notify(effect)
            return None
        if isinstance(effect, Pause):
            await self.hub.pause(effect.seconds)
            return None
        if isinstance(effect, Handed):
            return self.hub.handed(effect.channel, effect.owner)
        if isinstance(effect, Messages):
            return self.hub.messages(effect.channel, effect.owner)
        if isinstance(effect, Relay):
            self.hub.relay(effect.channel, effect.owner)
            return None
        if isinstance(effect, Watch):
            generation = await self.hub.watch(
                effect.channel, effect.owner, effect.broadcast, effect.targeted
            )
            watched.append((effect.channel, effect.owner))
            return generation
        raise TypeError(f"unknown effect {effect!r}")

    async def drain(self, timeout: float) -> None:
        """Wait (bounded) until no run is under way."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._active and loop.time() < deadline:
            await asyncio.sleep(0.005)
