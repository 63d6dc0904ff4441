"""The asyncio :class:`LockManager`: the same algorithm as the sync one, driven by tasks."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import redis.asyncio
from redis.asyncio.connection import AbstractConnection

from ..holds import Hold
from ..keys import validate_name
from ..kinds import FAMILIES
from ..managerbase import ManagerBase, no_handshake
from ..owner import task_token
from ..quorum import Fanout, Notify, Relay, Steps, Wait, Watch
from ..steps import force_unlock_steps, probe_steps
from ..views import MasterView
from .lock import FairLock, Lock, ReadLock, WriteLock
from .transport import AsyncTransport
from .wakeups import AsyncWakeupHub
from .watchdog import AsyncWatchdog

T = TypeVar("T")

Master = str | redis.asyncio.Redis


def url_client(url: str, timeout: float) -> redis.asyncio.Redis:
    """An asyncio client for one master, with ``timeout`` for connecting.

    No socket time-out: the transport bounds every master's part of a round itself, and
    redis.asyncio would wrap each read and write in a task of its own to enforce one."""
    return redis.asyncio.Redis.from_url(
        url,
        socket_timeout=None,
        socket_connect_timeout=timeout,
        **no_handshake(AbstractConnection),
    )


async def finish(task: asyncio.Future[T]) -> T:
    """Await ``task``; if the caller is cancelled meanwhile, let the task run to its end
    first (it is bounded by the master timeout), then pass the cancellation on."""
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({task})
        raise


class LockManager(ManagerBase[Lock]):
    """The asyncio twin of :class:`redreentrant.LockManager`: locks owned by tasks.

    ``masters`` are redis URLs or ``redis.asyncio.Redis`` clients; every other argument
    means what it means for the sync manager. ``on_lost`` may be a plain function or a
    coroutine function. Use ``async with LockManager(...)``, or ``await mgr.close()``.
    """

    _lock_class = Lock
    _read_class = ReadLock
    _write_class = WriteLock
    _fair_class = FairLock

    def __init__(
        self,
        masters: Master | Sequence[Master],
        *,
        lease: float = 30.0,
        drift_factor: float = 0.01,
        master_timeout: float | None = None,
        retry_jitter: float = 0.05,
        on_lost: Callable[[Any], object] | None = None,
    ) -> None:
        super().__init__(lease, drift_factor, master_timeout, retry_jitter, on_lost)
        self._wire(
            masters, redis.asyncio.Redis, url_client, AsyncTransport, AsyncWakeupHub, AsyncWatchdog
        )

    def owner_id(self) -> str:
        """The current task's owner id under this manager."""
        return f"{self.id}:{task_token()}"

    async def inspect(self, name: str) -> list[MasterView]:
        """Every master's view of the locks named ``name`` (see the sync manager)."""
        validate_name(name)
        return await self._run(probe_steps(self._quorum, FAMILIES, name))

    async def force_unlock(self, name: str) -> bool:
        """Delete every kind of lock named ``name`` on every master (see the sync manager)."""
        validate_name(name)
        return await self._run(force_unlock_steps(self._quorum, FAMILIES, name))

    async def close(self) -> None:
        """Stop the watchdog task and the wake-up readers, and close the clients made
        from URLs. Held locks are not released: their leases run out.

        Tasks waiting in ``acquire`` wake and fail with :class:`ManagerClosedError`
        (taking no hold), and so does every later call on the manager."""
        if self._closed:
            return
        self._closed = True
        await self._watchdog.stop()
        await self._hub.close()
        # Woken waiters undo what they took and leave queues: let them, on an open
        # transport (bounded: each round is).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._close_timeout()
        while self._runs and loop.time() < deadline:
            await asyncio.sleep(0.005)
        await self._transport.close()
        for client in self._own_clients:
            await client.aclose()

    async def __aenter__(self) -> LockManager:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _run(self, steps: Steps[T], shielded: bool = False) -> T:
        """Drive an algorithm's effects with this manager's transport and wake-ups.

        ``shielded``: the caller already runs these steps where no cancellation reaches
        (a release): rounds then need no shield of their own."""
        self._check_open()
        watched: list[str] = []
        self._runs.add(steps)
        try:
            effect = next(steps)
            while True:
                try:
                    result = await self._carry_out(effect, watched, shielded)
                except BaseException as error:  # cancellation too: the steps clean up
                    effect = steps.throw(error)
                    continue
                effect = steps.send(result)
        except StopIteration as stop:
            value: T = stop.value
            return value
        finally:
            self._runs.discard(steps)
            for channel in watched:
                self._hub.unwatch(channel)

    async def _run_shielded(self, steps: Steps[T]) -> T:
        """Run ``steps`` to their end even if the caller is cancelled (releases)."""
        return await finish(asyncio.ensure_future(self._run(steps, shielded=True)))

    async def _carry_out(self, effect: object, watched: list[str], shielded: bool) -> object:
        if isinstance(effect, Fanout):
            if shielded:
                return await self._transport.fanout(effect.calls)
            # A round under way is let finish before a cancellation is acted on, so the
            # undo that follows reaches each master after the round it undoes.
            return await finish(asyncio.ensure_future(self._transport.fanout(effect.calls)))
        if isinstance(effect, Wait):
            return await self._hub.wait(effect.channel, effect.generation, effect.timeout)
        if isinstance(effect, Notify):
            self._hub.notify(effect.channels, effect.release_id)
            return None
        if isinstance(effect, Relay):
            self._hub.relay(effect.channel)
            return None
        if isinstance(effect, Watch):
            generation = await self._hub.watch(effect.channel, effect.broadcast)
            watched.append(effect.channel)
            return generation
        raise TypeError(f"unknown effect {effect!r}")

    def _lost(self, hold: Hold) -> object:
        result = super()._lost(hold)
        return result if inspect.isawaitable(result) else None
