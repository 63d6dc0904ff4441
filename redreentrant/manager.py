"""The sync :class:`LockManager`: the masters, the watchdog, wake-ups and the locks."""

from __future__ import annotations

import inspect
import logging
import math
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import redis
from redis.connection import AbstractConnection

from . import keys
from .fairlock import FairLock
from .holds import Hold, Holds
from .keys import validate_name
from .kinds import FAIR, FAMILIES, READ, WRITE, LockKind
from .lock import Lock
from .owner import new_manager_id, thread_token
from .quorum import Fanout, Notify, Quorum, Relay, Steps, Wait, Watch
from .rwlock import ReadLock, ReadWriteLock, WriteLock
from .steps import force_unlock_steps, probe_steps
from .transport import SyncTransport, master_name
from .views import MasterView
from .wakeups import WakeupHub
from .watchdog import Watchdog

log = logging.getLogger("redreentrant")
T = TypeVar("T")

Master = str | redis.Redis


def default_master_timeout(lease: float) -> float:
    """How long one master may take to answer: small against the lease."""
    return min(0.25, lease / 10)


def _no_handshake() -> dict[str, Any]:
    """Client options that make connecting send nothing (no HELLO, no CLIENT SETINFO):
    on a frozen master a handshake would block every reconnect for a socket time-out."""
    params = inspect.signature(AbstractConnection.__init__).parameters
    if "driver_info" in params:
        return {"protocol": 2, "driver_info": None}
    return {"protocol": 2, "lib_name": None, "lib_version": None}


def url_client(url: str, timeout: float) -> redis.Redis:
    """A client for one master, with ``timeout`` for connecting and reading."""
    return redis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, **_no_handshake()
    )


def master_identity(client: Any) -> tuple[object, ...]:
    """What makes two clients the same master (host, port, db or socket path, db)."""
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return ("unix", kw["path"], int(kw.get("db", 0) or 0))
    host = str(kw.get("host", "localhost"))
    if host in ("localhost", "::1"):
        host = "127.0.0.1"
    return (host, int(kw.get("port", 6379)), int(kw.get("db", 0) or 0))


class LockManager:
    """Locks over a Redlock quorum of N independent Redis masters.

    ``masters`` are redis URLs or ``redis.Redis`` clients (a single one is legal). A lock
    is held when a majority (``N // 2 + 1``) granted it within the lease's validity:
    ``lease - elapsed - (lease * drift_factor + 2 ms)``, measured on a monotonic clock.

    ``lease`` (seconds) is the watchdog-managed lease: the watchdog renews held locks
    every ``lease / 3``. ``master_timeout`` bounds one master's answer in a round (default
    ``min(0.25, lease / 10)``); clients made from URLs get it as their socket time-outs,
    and clients you pass in should have time-outs of their own. ``retry_jitter`` is the
    upper bound (seconds) of the random pause after a split vote. ``on_lost(lock)`` is
    called from the watchdog when a held lock's lease is lost.

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        masters: Master | Sequence[Master],
        *,
        lease: float = 30.0,
        drift_factor: float = 0.01,
        master_timeout: float | None = None,
        retry_jitter: float = 0.05,
        on_lost: Callable[[Any], None] | None = None,
    ) -> None:
        if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not lease > 0:
            raise ValueError(f"lease must be a positive number of seconds, not {lease!r}")
        if not 0 <= drift_factor < 0.5:
            raise ValueError(f"drift_factor must be in [0, 0.5), not {drift_factor!r}")
        timeout = default_master_timeout(lease) if master_timeout is None else master_timeout
        if not 0 < timeout < lease / 3:
            raise ValueError(f"master_timeout must be > 0 and < lease / 3, not {timeout!r}")
        if not retry_jitter >= 0:
            raise ValueError(f"retry_jitter must be >= 0, not {retry_jitter!r}")
        if on_lost is not None and not callable(on_lost):
            raise TypeError("on_lost must be callable")
        self.lease = float(lease)
        self.master_timeout = float(timeout)
        self.on_lost = on_lost
        self._clients, self._own_clients = self._connect(masters, timeout)
        self._quorum = Quorum(
            tuple(master_name(c) for c in self._clients), drift_factor, retry_jitter
        )
        self._transport = SyncTransport(self._clients, timeout)
        self.id = new_manager_id()
        self._holds = Holds()
        self._hub = WakeupHub(self._clients, 2 * timeout, keys.PREFIX + "hub:" + self.id)
        self._watchdog = Watchdog(self._run, self._quorum, self._holds, self.lease, self._lost)
        self._closed = False
        _after_fork.add(self)

    @staticmethod
    def _connect(masters: Master | Sequence[Master], timeout: float) -> tuple[list[Any], list[Any]]:
        if isinstance(masters, (str, redis.Redis)):
            masters = [masters]
        masters = list(masters)
        if not masters:
            raise ValueError("at least one master is needed")
        clients: list[Any] = []
        own: list[Any] = []
        for m in masters:
            if isinstance(m, str):
                client = url_client(m, timeout)
                own.append(client)
            elif isinstance(m, redis.Redis):
                client = m
            else:
                raise TypeError(f"a master is a redis URL or a redis.Redis, not {m!r}")
            clients.append(client)
        seen: dict[tuple[object, ...], int] = {}
        for i, c in enumerate(clients):
            ident = master_identity(c)
            if ident in seen:
                for client in own:
                    client.close()
                raise ValueError(
                    f"master {master_name(c)} is given twice (positions {seen[ident]} and {i})"
                )
            seen[ident] = i
        return clients, own

    # -- public API --------------------------------------------------------------------

    @property
    def masters(self) -> tuple[str, ...]:
        """The masters' addresses, in order."""
        return self._quorum.masters

    @property
    def quorum(self) -> int:
        """How many masters must grant a lock: ``N // 2 + 1``."""
        return self._quorum.needed

    def lock(self, name: str) -> Lock:
        """A reentrant lock named ``name``, owned by the thread that acquires it."""
        self._check_open()
        return Lock(self, name)

    def rw_lock(self, name: str) -> ReadWriteLock:
        """A read/write lock named ``name``: ``.read`` (shared) and ``.write`` (exclusive)."""
        self._check_open()
        return ReadWriteLock(self, name)

    def fair_lock(self, name: str) -> FairLock:
        """A reentrant lock named ``name`` that is granted in order of arrival."""
        self._check_open()
        return FairLock(self, name)

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

    def owner_id(self) -> str:
        """The calling thread's owner id under this manager."""
        return f"{self.id}:{thread_token()}"

    def close(self) -> None:
        """Stop the watchdog and the wake-up subscriber, and close the clients made from
        URLs. Held locks are not released: their leases run out (release them first)."""
        if self._closed:
            return
        self._closed = True
        self._watchdog.stop()
        self._hub.close()
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

    # -- internals shared by the lock kinds ---------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the lock manager is closed")

    def _check_lease(self, lease: float | None) -> float:
        if lease is None:
            return self.lease
        if isinstance(lease, bool) or not isinstance(lease, (int, float)):
            raise TypeError(f"lease must be a number of seconds, not {type(lease).__name__}")
        if math.isnan(lease) or lease <= 0:
            raise ValueError(f"lease must be > 0 seconds, not {lease!r}")
        if lease <= self._quorum.drift(lease) + self.master_timeout:
            raise ValueError(
                f"lease {lease!r}s is too short: it must exceed the clock drift allowance"
                f" plus the master timeout ({self.master_timeout}s)"
            )
        return float(lease)

    def _run(self, steps: Steps[T]) -> T:
        """Drive an algorithm's effects with this manager's transport and wake-ups."""
        self._check_open()
        watched: list[str] = []
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

    def _front(self, kind: LockKind, name: str) -> Lock:
        """The lock object for a hold (handed to ``on_lost``)."""
        front = {READ.label: ReadLock, WRITE.label: WriteLock, FAIR.label: FairLock}
        return front.get(kind.label, Lock)(self, name)

    def _lost(self, hold: Hold) -> None:
        log.warning("redreentrant: lost lock %r (%s)", hold.name, hold.lost)
        if self.on_lost is not None:
            try:
                self.on_lost(self._front(hold.kind, hold.name))
            except Exception:
                log.exception("redreentrant: on_lost hook raised")

    def _after_fork_in_child(self) -> None:
        # The child is a new owner: it never renews nor releases the parent's holds.
        self.id = new_manager_id()
        self._holds = Holds()
        self._watchdog = Watchdog(self._run, self._quorum, self._holds, self.lease, self._lost)
        self._hub.after_fork()


class _ForkRegistry:
    """Managers alive in this process, reset in a forked child."""

    def __init__(self) -> None:
        self._managers: weakref.WeakSet[LockManager] = weakref.WeakSet()
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._in_child)

    def add(self, manager: LockManager) -> None:
        with self._lock:
            self._managers.add(manager)

    def _in_child(self) -> None:
        self._lock = threading.Lock()
        for manager in list(self._managers):
            manager._after_fork_in_child()


_after_fork = _ForkRegistry()
