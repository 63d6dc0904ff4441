"""Asyncio wake-ups: one pub/sub reader task per master, shared by the manager's tasks.

The channel bookkeeping (reference counts, release de-duplication, generations) is the
sync hub's :class:`~redreentrant.wakeups.ChannelState`; waiting is on futures.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ManagerClosedError
from ..wakeups import RECONNECT_DELAY, ChannelState, decode_message


@dataclass(eq=False)
class _Channel(ChannelState):
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    def wake(self, everyone: bool) -> None:
        while self.waiters:
            waiter = self.waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                if not everyone:
                    return


class AsyncWakeupHub:
    """Per-manager hub of release wake-ups over N masters (asyncio)."""

    def __init__(self, clients: Sequence[Any], confirm_timeout: float, home: str) -> None:
        self._clients = list(clients)
        self._confirm_timeout = confirm_timeout
        # Always subscribed, so a reader never sits on a connection with no subscription.
        self._home = home
        self._channels: dict[str, _Channel] = {}
        self._pubsubs: list[Any] = [None] * len(self._clients)
        self._readers: list[asyncio.Task[None]] = []
        self._live: set[int] = set()
        self._failed: set[int] = set()
        self._confirmed: asyncio.Event | None = None
        self._closed = False

    # -- waiter side ------------------------------------------------------------------

    async def watch(self, channel: str, broadcast: bool = False) -> int:
        """Register interest in ``channel``, subscribe on the reachable masters and wait
        (bounded) for their confirmations. Returns the channel's generation."""
        if self._closed:
            raise ManagerClosedError("the lock manager is closed")
        chan = self._channels.get(channel)
        if chan is None:
            chan = self._channels[channel] = _Channel(broadcast=broadcast)
        chan.refs += 1
        try:
            self._start_readers()
            await self._subscribe(chan, channel)
            return chan.generation
        except BaseException:
            self.unwatch(channel)  # interrupted: the caller will not unwatch it
            raise

    async def _subscribe(self, chan: _Channel, channel: str) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + self._confirm_timeout
        for i in sorted(self._live):
            try:
                await asyncio.wait_for(self._pubsubs[i].subscribe(channel), self._confirm_timeout)
            except Exception:
                self._lose(i)
        everyone = set(range(len(self._clients)))
        while not everyone <= chan.confirmed | self._failed:
            left = end - loop.time()
            if left <= 0:
                return
            event = self._confirmed = self._confirmed or asyncio.Event()
            try:
                await asyncio.wait_for(event.wait(), left)
            except asyncio.TimeoutError:
                return

    def unwatch(self, channel: str) -> None:
        chan = self._channels.get(channel)
        if chan is None:
            return
        chan.refs -= 1
        if chan.refs <= 0 and not self._closed:
            asyncio.get_running_loop().create_task(self._unsubscribe(channel))

    async def _unsubscribe(self, channel: str) -> None:
        chan = self._channels.get(channel)
        if chan is None or chan.refs > 0:
            return
        del self._channels[channel]
        for i in sorted(self._live):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pubsubs[i].unsubscribe(channel), self._confirm_timeout)

    async def wait(self, channel: str, generation: int, timeout: float) -> int:
        """Sleep until ``channel`` moves past ``generation`` or ``timeout`` passes."""
        chan = self._channels[channel]
        if chan.generation == generation and not self._closed:
            waiter = asyncio.get_running_loop().create_future()
            chan.waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, timeout)
            except asyncio.TimeoutError:
                pass
            finally:
                if waiter in chan.waiters:
                    chan.waiters.remove(waiter)
        return chan.generation

    def notify(self, channels: Sequence[str], release_id: str) -> None:
        """A release made in this process freed a lock: wake its waiters here at once."""
        for channel in channels:
            self._bump(channel, release_id)

    def relay(self, channel: str) -> None:
        """A woken waiter gave up: wake another one in its place."""
        chan = self._channels.get(channel)
        if chan is not None:
            chan.wake(everyone=False)

    def _bump(self, channel: str, release_id: str) -> None:
        chan = self._channels.get(channel)
        if chan is not None and chan.accept(release_id):
            chan.wake(everyone=chan.broadcast)

    # -- reader tasks -------------------------------------------------------------------

    def _start_readers(self) -> None:
        if not self._readers:
            loop = asyncio.get_running_loop()
            self._readers = [loop.create_task(self._read(i)) for i in range(len(self._clients))]

    async def _read(self, i: int) -> None:
        while not self._closed:
            pubsub = self._clients[i].pubsub()
            try:
                desired = [c for c, ch in self._channels.items() if ch.refs > 0]
                await asyncio.wait_for(
                    pubsub.subscribe(self._home, *desired), self._confirm_timeout
                )
                self._pubsubs[i] = pubsub
                self._live.add(i)
                self._failed.discard(i)
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is not None:
                        self._dispatch(i, message)
            except asyncio.CancelledError:
                raise
            except Exception:
                self._lose(i)
                await asyncio.sleep(RECONNECT_DELAY)
            finally:
                self._pubsubs[i] = None
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    def _dispatch(self, i: int, message: dict[str, Any]) -> None:
        kind, channel, data = decode_message(message)
        chan = self._channels.get(channel)
        if chan is None:
            return
        if kind == "message":
            self._bump(channel, data)
        elif kind == "subscribe":
            chan.confirmed.add(i)
            self._signal()

    def _lose(self, i: int) -> None:
        self._live.discard(i)
        self._failed.add(i)
        for chan in self._channels.values():
            chan.confirmed.discard(i)
        self._signal()

    def _signal(self) -> None:
        """Wake the tasks waiting for subscription confirmations to look again."""
        if self._confirmed is not None:
            self._confirmed.set()
            self._confirmed = None

    async def close(self) -> None:
        self._closed = True
        for reader in self._readers:
            reader.cancel()
        for reader in self._readers:
            with contextlib.suppress(BaseException):
                await reader
        for chan in self._channels.values():
            chan.wake(everyone=True)
