"""The sync :class:`LockManager`: the masters, the watchdog, wake-ups and the locks."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import redis

from .fairlock import FairLock
from .keys import validate_name
from .kinds import FAMILIES
from .lock import Lock
from .managerbase import ManagerBase, no_handshake
from .owner import thread_token
from .quorum import Fanout, Notify, Relay, Steps, Wait, Watch
from .rwlock import ReadLock, WriteLock
from .steps import force_unlock_steps, probe_steps
from .transport import SyncTransport
from .views import MasterView
from .wakeups import WakeupHub
from .watchdog import Watchdog

T = TypeVar("T")

Master = str | redis.Redis


def url_client(url: str, timeout: float) -> redis.Redis:
    """A client for one master, with ``timeout`` for connecting and reading."""
    return redis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, **no_handshake()
    )


class LockManager(ManagerBase[Lock]):
    """Locks over a Redlock quorum of N independent Redis masters (threads own locks).

    ``masters`` are redis URLs or ``redis.Redis`` clients (a single one is legal), or one
    string of URLs separated by commas (bare ``host:port`` allowed). A lock
    is held when a majority (``N // 2 + 1``) granted it within the lease's validity:
    ``lease - elapsed - (lease * drift_factor + 2 ms)``, measured on a monotonic clock.

    ``lease`` (seconds) is the watchdog-managed lease: the watchdog renews held locks
    every ``lease / 3``. ``master_timeout`` bounds one master's answer in a round (default
    ``min(0.25, lease / 10)``); clients made from URLs get it as their socket time-outs,
    and clients you pass in should have time-outs of their own. ``retry_jitter`` is the
    upper bound (seconds) of the random pause after a split vote. ``on_lost(lock)`` is
    called, in a thread of its own, when a held lock's lease is lost or its owner thread
    ended while holding it; always before the lease's validity ends. Bad settings raise
    ``ValueError``/``TypeError`` naming the argument.

    Use it as a context manager, or call :meth:`close`.
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
        self._wire(masters, redis.Redis, url_client, SyncTransport, WakeupHub, Watchdog)

    def owner_id(self) -> str:
        """The calling thread's owner id under this manager."""
        return f"{self.id}:{thread_token()}"

    def inspect(self, name: str) -> list[MasterView]:
        """Every master's view of the locks (of all kinds) named ``name``: holders, hold
        counts, TTL, mode and queue. One read-only round; a master that fails to answer
        has ``error`` set."""
        validate_name(name)
        return self._run(probe_steps(self._quorum, FAMILIES, name))

    def force_unlock(self, name: str) -> bool:
        """Delete every kind of lock named ``name`` on every master, whoever holds it, and
        wake the waiters. Returns True if any master had one. The holders are not told
        until their next renewal, re-entry or release raises :class:`LockLostError`."""
        validate_name(name)
        return self._run(force_unlock_steps(self._quorum, FAMILIES, name))

    def close(self) -> None:
        """Stop the watchdog and the wake-up subscriber, and close the clients made from
        URLs. Held locks are not released: their leases run out (release them first).

        Threads waiting in ``acquire`` wake and fail with :class:`ManagerClosedError`
        (taking no hold), and so does every later call on the manager."""
        if self._closed:
            return
        self._closed = True
        self._watchdog.stop()
        self._hub.close()
        # Woken waiters undo what they took and leave queues: let them, on an open
        # transport (bounded: each round is).
        deadline = time.monotonic() + self._close_timeout()
        while self._runs and time.monotonic() < deadline:
            time.sleep(0.005)
        self._transport.close()
        for client in self._own_clients:
            client.close()

    def __enter__(self) -> LockManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self, steps: Steps[T]) -> T:
        """Drive an algorithm's effects with this manager's transport and wake-ups."""
        self._check_open()
        watched: list[str] = []
        self._runs.add(steps)
        try:
            effect = next(steps)
            while True:
                try:
                    result = self._carry_out(effect, watched)
                except BaseException as error:
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

    def _carry_out(self, effect: object, watched: list[str]) -> object:
        if isinstance(effect, Fanout):
            return self._transport.fanout(effect.calls)
        if isinstance(effect, Wait):
            return self._hub.wait(effect.channel, effect.generation, effect.timeout)
        if isinstance(effect, Notify):
            self._hub.notify(effect.channels, effect.release_id)
            return None
        if isinstance(effect, Relay):
            self._hub.relay(effect.channel)
            return None
        if isinstance(effect, Watch):
            generation = self._hub.watch(effect.channel, effect.broadcast)
            watched.append(effect.channel)
            return generation
        raise TypeError(f"unknown effect {effect!r}")

    def _after_fork_in_child(self) -> None:
        super()._after_fork_in_child()
        self._watchdog = Watchdog(self._run, self._quorum, self._holds, self.lease, self._lost)
        self._hub.after_fork()
