"""Wake-ups for blocked acquirers: one pub/sub subscriber per manager.

A single daemon thread holds one pub/sub connection per master, subscribes to the
channels that local waiters need (reference-counted), and turns release messages into
a per-channel *generation* bump that waiting threads see through a condition. No
connection or thread is made per waiter, and nobody polls: a waiter sleeps until a
release is announced, or until the holder's TTL runs out (expiry announces nothing).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from .errors import ManagerClosedError

#: how long a master whose pub/sub connection failed is left alone before a retry
RECONNECT_DELAY = 0.5


#: how many recent release ids a channel remembers to drop duplicate wake-ups
RECENT_RELEASES = 32


@dataclass(eq=False)
class ChannelState:
    """A channel's bookkeeping, the same for the sync and the asyncio hubs."""

    broadcast: bool = False
    refs: int = 0
    generation: int = 0
    confirmed: set[int] = field(default_factory=set)
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT_RELEASES))

    def accept(self, release_id: str) -> bool:
        """Count a release once, however many masters announce it; True if it is new
        (the generation moved on, and waiters should be woken)."""
        if release_id in self.recent:
            return False
        self.recent.append(release_id)
        self.generation += 1
        return True


def decode_message(message: dict[str, Any]) -> tuple[str, str, str]:
    """A pub/sub message as (type, channel, data) text."""
    out = []
    for part in ("type", "channel", "data"):
        value = message.get(part)
        out.append(value.decode() if isinstance(value, bytes) else str(value))
    return out[0], out[1], out[2]


@dataclass(eq=False)
class _Channel(ChannelState):
    cond: threading.Condition = field(default_factory=threading.Condition)


class WakeupHub:
    """Per-manager hub of release wake-ups over N masters."""

    def __init__(
        self, clients: Sequence[redis.Redis], confirm_timeout: float, home_channel: str
    ) -> None:
        self._clients = list(clients)
        self._confirm_timeout = confirm_timeout
        # Always subscribed, so a pub/sub connection never drops to no subscription,
        # where redis-py stops reading it and unread replies would spin the selector.
        self._home = home_channel
        self._closed = False
        self._setup()

    def _setup(self) -> None:
        self._lock = threading.Lock()
        # Subscription confirmations are waited for on their own condition: a channel's
        # condition carries single wake-ups, which a confirmation waiter must not swallow.
        self._confirmations = threading.Condition(self._lock)
        self._channels: dict[str, _Channel] = {}
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        n = len(self._clients)
        self._pubsubs: list[Any] = [None] * n
        self._subscribed: list[set[str]] = [set() for _ in range(n)]
        self._retry_at = [0.0] * n
        self._live: set[int] = set()
        self._failed: set[int] = set()

    # -- waiter side ------------------------------------------------------------------

    def watch(self, channel: str, broadcast: bool = False) -> int:
        """Register interest in ``channel`` and wait (bounded) until the subscription is
        confirmed by the reachable masters. Returns the channel's generation.

        On a ``broadcast`` channel a release wakes every waiter, else one."""
        with self._lock:
            if self._closed:
                raise ManagerClosedError("the lock manager is closed")
            chan = self._channels.get(channel)
            if chan is None:
                chan = self._channels[channel] = _Channel(
                    broadcast=broadcast, cond=threading.Condition(self._lock)
                )
            chan.refs += 1
            self._ensure_thread()
        self._poke()
        end = time.monotonic() + self._confirm_timeout
        everyone = set(range(len(self._clients)))
        try:
            with self._lock:
                while not everyone <= chan.confirmed | self._failed:
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    self._confirmations.wait(left)
                return chan.generation
        except BaseException:
            self.unwatch(channel)  # interrupted: the caller will not unwatch it
            raise

    def unwatch(self, channel: str) -> None:
        with self._lock:
            chan = self._channels.get(channel)
            if chan is None:
                return
            chan.refs -= 1
        if chan.refs <= 0:
            self._poke()

    def wait(self, channel: str, generation: int, timeout: float) -> int:
        """Sleep until ``channel`` moves past ``generation`` or ``timeout`` passes."""
        with self._lock:
            chan = self._channels[channel]
            if chan.generation == generation and not self._closed:
                chan.cond.wait_for(lambda: chan.generation != generation or self._closed, timeout)
            return chan.generation

    def notify(self, channels: Sequence[str], release_id: str) -> None:
        """A release made in this process freed a lock: wake its waiters here at once."""
        if not any(c in self._channels for c in channels):
            return  # nobody here waits: skip the lock on the release path
        with self._lock:
            for channel in channels:
                self._bump(channel, release_id)

    def relay(self, channel: str) -> None:
        """A woken waiter gave up: wake another one in its place."""
        with self._lock:
            chan = self._channels.get(channel)
            if chan is not None:
                chan.cond.notify(1)

    def _bump(self, channel: str, release_id: str) -> None:
        """Count a release once (each master announces it), and wake one waiter: it
        takes the lock, or relays the wake-up when it gives up."""
        chan = self._channels.get(channel)
        if chan is None or not chan.accept(release_id):
            return
        if chan.broadcast:
            chan.cond.notify_all()
        else:
            chan.cond.notify(1)

    # -- subscriber thread ------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="redreentrant-wakeups", daemon=True
            )
            self._thread.start()

    def _poke(self) -> None:
        # A full or closed pipe means the thread is awake or gone anyway.
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, -1)
        registered: dict[int, Any] = {}
        try:
            while True:
                with self._lock:
                    if self._closed:
                        return
                    desired = {c for c, ch in self._channels.items() if ch.refs > 0}
                    desired.add(self._home)
                    for name in [c for c, ch in self._channels.items() if ch.refs <= 0]:
                        del self._channels[name]
                self._sync_subscriptions(desired)
                for i in range(len(self._clients)):
                    sock = self._socket(i)
                    if registered.get(i) is not sock:
                        if i in registered:
                            selector.unregister(registered.pop(i))
                        if sock is not None:
                            selector.register(sock, selectors.EVENT_READ, i)
                            registered[i] = sock
                timeout = RECONNECT_DELAY if len(self._live) < len(self._clients) else None
                for key, _ in selector.select(timeout):
                    if key.data == -1:
                        self._drain_wake_pipe()
                    else:
                        self._read_messages(int(key.data))
        finally:
            selector.close()

    def _drain_wake_pipe(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _socket(self, i: int) -> Any:
        ps = self._pubsubs[i]
        conn = getattr(ps, "connection", None) if ps is not None else None
        return getattr(conn, "_sock", None)

    def _sync_subscriptions(self, desired: set[str]) -> None:
        now = time.monotonic()
        for i, client in enumerate(self._clients):
            add = desired - self._subscribed[i]
            drop = self._subscribed[i] - desired
            if not add and not drop and i in self._live:
                continue
            if i not in self._live and now < self._retry_at[i]:
                continue
            try:
                if self._pubsubs[i] is None:
                    self._pubsubs[i] = client.pubsub()  # type: ignore[no-untyped-call]
                    add = set(desired)
                ps = self._pubsubs[i]
                if add:
                    ps.subscribe(*sorted(add))
                if drop:
                    ps.unsubscribe(*sorted(drop))
                self._subscribed[i] = set(desired)
                with self._lock:
                    self._live.add(i)
                    self._failed.discard(i)
            except Exception:
                self._lose(i)

    def _read_messages(self, i: int) -> None:
        ps = self._pubsubs[i]
        if ps is None:
            return
        try:
            while True:
                message = ps.get_message(timeout=0.0)
                if message is None:
                    return
                self._dispatch(i, message)
        except Exception:
            self._lose(i)

    def _dispatch(self, i: int, message: dict[str, Any]) -> None:
        kind, channel, data = decode_message(message)
        with self._lock:
            chan = self._channels.get(channel)
            if chan is None:
                return
            if kind == "message":
                self._bump(channel, data)
            elif kind == "subscribe":
                chan.confirmed.add(i)
                self._confirmations.notify_all()

    def _lose(self, i: int) -> None:
        """A master's pub/sub connection failed: forget it, retry later."""
        ps = self._pubsubs[i]
        self._pubsubs[i] = None
        self._subscribed[i] = set()
        self._retry_at[i] = time.monotonic() + RECONNECT_DELAY
        if ps is not None:
            with contextlib.suppress(Exception):
                ps.close()
        with self._lock:
            self._live.discard(i)
            self._failed.add(i)
            for chan in self._channels.values():
                chan.confirmed.discard(i)
            self._confirmations.notify_all()

    # -- life cycle -------------------------------------------------------------------

    def after_fork(self) -> None:
        """In a forked child: the parent's thread, locks and sockets are not ours to use
        (closing the sockets would shut them for the parent too), so start afresh."""
        self._setup()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for chan in self._channels.values():
                chan.cond.notify_all()
            self._confirmations.notify_all()
            thread = self._thread
        self._poke()
        if thread is not None and self._pid == os.getpid():
            thread.join(timeout=5)
        for ps in self._pubsubs:
            if ps is not None:
                with contextlib.suppress(Exception):
                    ps.close()
        self._wake_r.close()
        self._wake_w.close()
