"""Asyncio wake-ups: per master, one task that keeps its pub/sub connection and
subscriptions and one that reads it, shared by all the manager's tasks.

They carry out what the shared subscription state machine
(:class:`~redreentrant._core.subscriptions.Subscriptions`) decides, as the sync hub's
thread does: every connection always hears the manager's home channel, on which the
masters wake registered waiters by name. Only a master's keeper task sends on its
connection, and it computes what to (un)subscribe at the moment it sends, so a watch
during a (re)connect is never skipped and a stale unsubscribe never removes a fresh
subscription. A waiting task sleeps on a future of its own; no task is made per waiter.
A member that is a Redis Cluster is heard on one of its nodes, as in the sync hub.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from .._core.effects import Handover, Notify
from .._core.errors import ManagerClosedError
from .._core.subscriptions import RECONNECT_DELAY, Subscriptions, Waiter


def _wake(waiters: Sequence[Waiter]) -> None:
    """Wake the tasks the state machine counted a wake-up for."""
    for waiter in waiters:
        future = waiter.signal
        if future is not None and not future.done():
            future.set_result(None)


class AsyncWakeupHub:
    """Per-manager hub of release wake-ups over N masters (asyncio); ``pubsubs[i]()``
    makes a pub/sub connection to master ``i`` (see the sync hub)."""

    def __init__(
        self, pubsubs: Sequence[Callable[[], Any]], confirm_timeout: float, home: str
    ) -> None:
        self._pubsubs_of = list(pubsubs)
        self._confirm_timeout = confirm_timeout
        self._subs = Subscriptions(len(self._pubsubs_of), home)
        self._tasks: list[asyncio.Task[None]] = []
        self._dirty: list[asyncio.Event] = []
        self._confirmed: asyncio.Event | None = None
        self._closed = False

    # -- waiter side ------------------------------------------------------------------

    async def watch(
        self,
        channel: str,
        owner: str,
        broadcast: bool = False,
        targeted: bool = False,
        log: bool = False,
    ) -> int:
        """``owner`` waits on ``channel`` from now on; have the masters subscribe what
        its wake-ups come through, and wait (bounded) for their confirmations. Returns
        its generation. A ``targeted`` channel needs nothing but the home channel; a
        ``log`` channel keeps every message for its waiters (:meth:`messages`)."""
        if self._closed:
            raise ManagerClosedError("the lock manager is closed")
        generation = self._subs.watch(channel, owner, broadcast, targeted, log)
        chan = self._subs.channels[channel]
        if self._subs.settled(chan) and self._tasks:
            return generation
        try:
            self._start()
            self._changed()
            loop = asyncio.get_running_loop()
            end = loop.time() + self._confirm_timeout
            while not self._subs.settled(chan) and not self._closed:
                left = end - loop.time()
                if left <= 0:
                    break
                event = self._confirmed = self._confirmed or asyncio.Event()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), left)
            return generation
        except BaseException:
            self.unwatch(channel, owner)  # interrupted: the caller will not unwatch it
            raise

    def unwatch(self, channel: str, owner: str) -> None:
        if self._subs.unwatch(channel, owner) and not self._closed:
            self._changed()

    async def wait(self, channel: str, owner: str, generation: int, timeout: float) -> int:
        """Sleep until ``owner``'s wake-ups on ``channel`` move past ``generation`` or
        ``timeout`` passes."""
        waiter = self._subs.waiter(channel, owner)
        if waiter.wakes == generation and not self._closed:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            waiter.signal = future
            try:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(future, timeout)
            finally:
                if waiter.signal is future:
                    waiter.signal = None
        return waiter.wakes

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds`` (a back-off); a cancellation ends it."""
        await asyncio.sleep(seconds)

    def notify(self, notice: Notify) -> None:
        """A release made in this process freed a lock: wake its waiters here at once
        (on a targeted channel, the one the masters woke, if it waits here, with the
        lock if they handed it over to it)."""
        _wake(self._subs.notified(notice))

    def messages(self, channel: str, owner: str) -> list[tuple[int, str]]:
        """A log channel's messages for ``owner`` since it last took them."""
        return self._subs.take_messages(channel, owner)

    def handed(self, channel: str, owner: str) -> Handover | None:
        """The lock, if it was handed over to ``owner`` with its last wake-up."""
        return self._subs.take_handover(channel, owner)

    def relay(self, channel: str, owner: str) -> None:
        """``owner`` was woken but gave up: wake another waiter here in its place."""
        _wake(self._subs.relay(channel, owner))

    # -- the tasks of each master -------------------------------------------------------

    def _start(self) -> None:
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._dirty = [asyncio.Event() for _ in self._pubsubs_of]
            self._tasks = [loop.create_task(self._keep(i)) for i in range(len(self._pubsubs_of))]

    def _changed(self) -> None:
        for event in self._dirty:
            event.set()

    async def _keep(self, i: int) -> None:
        """Keep master ``i``'s connection, and its subscriptions in step with the state."""
        loop = asyncio.get_running_loop()
        while not self._closed:
            pubsub = self._pubsubs_of[i]()
            reader: asyncio.Task[None] | None = None
            try:
                await asyncio.wait_for(
                    pubsub.subscribe(*self._subs.connected(i)), self._confirm_timeout
                )
                reader = loop.create_task(self._read(i, pubsub))
                # Checked after every wake-up as well as cancelled: on 3.11,
                # asyncio.wait_for can swallow a cancellation that comes as its
                # awaitable finishes, and close() must not wait for this task forever.
                while not self._closed:
                    self._dirty[i].clear()
                    add, drop = self._subs.changes(i)
                    if add:
                        await asyncio.wait_for(pubsub.subscribe(*add), self._confirm_timeout)
                    if drop:
                        await asyncio.wait_for(pubsub.unsubscribe(*drop), self._confirm_timeout)
                    if reader.done():
                        reader.result()  # the connection broke: raises
                        raise ConnectionError("the pub/sub reader ended")
                    await self._dirty[i].wait()
            except asyncio.CancelledError:
                raise
            except Exception:
                self._lose(i)
                await asyncio.sleep(RECONNECT_DELAY)
            finally:
                if reader is not None:
                    reader.cancel()
                    with contextlib.suppress(BaseException):
                        await reader
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def _read(self, i: int, pubsub: Any) -> None:
        try:
            while True:
                message = await pubsub.get_message(timeout=None)
                if message is None:
                    continue
                woken, confirmed = self._subs.on_message(i, message)
                _wake(woken)
                if confirmed:
                    self._signal()
        finally:
            if i < len(self._dirty):
                self._dirty[i].set()  # the keeper finds out and reconnects

    def _lose(self, i: int) -> None:
        self._subs.lost(i)
        self._signal()

    def _signal(self) -> None:
        """Wake the tasks waiting for subscription confirmations to look again."""
        if self._confirmed is not None:
            self._confirmed.set()
            self._confirmed = None

    async def close(self) -> None:
        self._closed = True
        self._changed()  # a keeper that missed its cancellation sees the close
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        for chan in self._subs.channels.values():
            _wake(list(chan.waiters.values()))
        self._signal()
