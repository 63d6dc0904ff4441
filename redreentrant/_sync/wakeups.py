"""Sync wake-ups for blocked acquirers: one subscriber thread per manager.

The thread holds one pub/sub connection per master, always subscribed to the manager's
home channel, and carries out what the shared subscription state machine
(:class:`~redreentrant._core.subscriptions.Subscriptions`) decides: which channels each
master must hear, which release messages are new, and which waiters they wake. Each
waiting thread sleeps on a condition of its own until its count of wake-ups moves on.
No connection or thread is made per waiter, and nobody polls: a waiter sleeps until a
release wakes it, or until the holder's TTL runs out (expiry announces nothing).

A member that is a Redis Cluster is heard on one of its nodes (a classic ``PUBLISH``
reaches every node of a cluster, on Redis 6.2 too): its maker of pub/sub connections
picks the next node at each reconnect, so a node that died is left for another.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._core.effects import Handover, Notify
from .._core.errors import ManagerClosedError
from .._core.subscriptions import RECONNECT_DELAY, Subscriptions, Waiter


class WakeupHub:
    """Per-manager hub of release wake-ups over N masters; ``pubsubs[i]()`` makes a
    pub/sub connection to master ``i`` (``client.pubsub``, or one node's of a cluster)."""

    def __init__(
        self, pubsubs: Sequence[Callable[[], Any]], confirm_timeout: float, home_channel: str
    ) -> None:
        self._pubsubs_of = list(pubsubs)
        self._confirm_timeout = confirm_timeout
        self._home = home_channel
        self._closed = False
        self._setup()

    def _setup(self) -> None:
        self._lock = threading.Lock()
        # Confirmations and releases are waited for on conditions of one lock: a wake-up
        # on a channel's condition must not be swallowed by a confirmation waiter.
        self._confirmations = threading.Condition(self._lock)
        # The home channel keeps every pub/sub connection subscribed to something:
        # redis-py stops reading one with no subscription, and unread replies would
        # spin the selector.
        self._subs = Subscriptions(len(self._pubsubs_of), self._home)
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        n = len(self._pubsubs_of)
        self._pubsubs: list[Any] = [None] * n
        self._retry_at = [0.0] * n

    # -- waiter side ------------------------------------------------------------------

    def watch(
        self,
        channel: str,
        owner: str,
        broadcast: bool = False,
        targeted: bool = False,
        log: bool = False,
    ) -> int:
        """``owner`` waits on ``channel`` from now on; wait (bounded) until the reachable
        masters confirmed what its wake-ups come through. Returns its generation.

        On a ``broadcast`` channel a release wakes every waiter, else one. A
        ``targeted`` channel is subscribed nowhere: its waiters are woken by name on the
        home channel, so once that is confirmed a watch costs no round trip. A ``log``
        channel keeps every message for its waiters (:meth:`messages`)."""
        with self._lock:
            if self._closed:
                raise ManagerClosedError("the lock manager is closed")
            generation = self._subs.watch(channel, owner, broadcast, targeted, log)
            chan = self._subs.channels[channel]
            settled = self._subs.settled(chan)
            self._ensure_thread()
        if settled:
            return generation
        self._poke()
        end = time.monotonic() + self._confirm_timeout
        try:
            with self._lock:
                while not self._subs.settled(chan) and not self._closed:
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    self._confirmations.wait(left)
                return generation
        except BaseException:
            self.unwatch(channel, owner)  # interrupted: the caller will not unwatch it
            raise

    def unwatch(self, channel: str, owner: str) -> None:
        with self._lock:
            unused = self._subs.unwatch(channel, owner)
        if unused:
            self._poke()

    def wait(self, channel: str, owner: str, generation: int, timeout: float) -> int:
        """Sleep until ``owner``'s wake-ups on ``channel`` move past ``generation`` or
        ``timeout`` passes."""
        with self._lock:
            waiter = self._subs.waiter(channel, owner)
            if waiter.wakes == generation and not self._closed:
                if waiter.signal is None:
                    waiter.signal = threading.Condition(self._lock)
                waiter.signal.wait_for(lambda: waiter.wakes != generation or self._closed, timeout)
            return waiter.wakes

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds`` (a back-off), cut short only by closing the manager."""
        with self._lock:
            if not self._closed:
                self._confirmations.wait_for(lambda: self._closed, seconds)

    def notify(self, notice: Notify) -> None:
        """A release made in this process freed a lock: wake its waiters here at once
        (on a targeted channel, the one the masters woke, if it waits here, with the
        lock if they handed it over to it)."""
        if not notice.handovers and self._subs.channels.keys().isdisjoint(notice.channels):
            return  # nobody here waits: skip the lock on the release path
        with self._lock:
            self._wake(self._subs.notified(notice))

    def messages(self, channel: str, owner: str) -> list[tuple[int, str]]:
        """A log channel's messages for ``owner`` since it last took them."""
        with self._lock:
            return self._subs.take_messages(channel, owner)

    def handed(self, channel: str, owner: str) -> Handover | None:
        """The lock, if it was handed over to ``owner`` with its last wake-up."""
        with self._lock:
            return self._subs.take_handover(channel, owner)

    def relay(self, channel: str, owner: str) -> None:
        """``owner`` was woken but gave up: wake another waiter here in its place."""
        with self._lock:
            self._wake(self._subs.relay(channel, owner))

    @staticmethod
    def _wake(waiters: Sequence[Waiter]) -> None:
        """Wake the threads the state machine counted a wake-up for (with the lock)."""
        for waiter in waiters:
            if waiter.signal is not None:
                waiter.signal.notify()

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
                self._keep_subscriptions()
                for i in range(len(self._pubsubs_of)):
                    sock = self._socket(i)
                    if registered.get(i) is not sock:
                        if i in registered:
                            selector.unregister(registered.pop(i))
                        if sock is not None:
                            selector.register(sock, selectors.EVENT_READ, i)
                            registered[i] = sock
                with self._lock:
                    timeout = None if self._subs.all_live() else RECONNECT_DELAY
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

    def _keep_subscriptions(self) -> None:
        """Connect the masters that need it and send each what it must (un)subscribe."""
        now = time.monotonic()
        for i, make in enumerate(self._pubsubs_of):
            try:
                if self._pubsubs[i] is None:
                    if now < self._retry_at[i]:
                        continue
                    ps = make()
                    with self._lock:
                        channels = self._subs.connected(i)
                    self._pubsubs[i] = ps
                    ps.subscribe(*channels)
                with self._lock:
                    add, drop = self._subs.changes(i)
                if add:
                    self._pubsubs[i].subscribe(*add)
                if drop:
                    self._pubsubs[i].unsubscribe(*drop)
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
                with self._lock:
                    woken, confirmed = self._subs.on_message(i, message)
                    self._wake(woken)
                    if confirmed:
                        self._confirmations.notify_all()
        except Exception:
            self._lose(i)

    def _lose(self, i: int) -> None:
        """A master's pub/sub connection failed: forget it, retry later."""
        ps = self._pubsubs[i]
        self._pubsubs[i] = None
        self._retry_at[i] = time.monotonic() + RECONNECT_DELAY
        if ps is not None:
            with contextlib.suppress(Exception):
                ps.close()
        with self._lock:
            self._subs.lost(i)
            self._confirmations.notify_all()

    # -- life cycle -------------------------------------------------------------------

    def after_fork(self, home_channel: str) -> None:
        """In a forked child: the parent's thread, locks and sockets are not ours to use
        (closing the sockets would shut them for the parent too), so start afresh, on
        the child's own home channel (its manager has a new id)."""
        self._home = home_channel
        self._setup()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for chan in self._subs.channels.values():
                self._wake(list(chan.waiters.values()))
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
