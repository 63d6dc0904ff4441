"""The sync :class:`LockManager`: the masters, the watchdog, wake-ups and the locks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar, overload

import redis
import redis.cluster
from redis.connection import AbstractConnection

from .._core.cluster import ClusterMember
from .._core.decorators import Synchronized, SyncKind
from .._core.engine import Engine
from .._core.keys import validate_name
from .._core.kinds import FAMILIES, LockKind, MultiKind, multi_kind, multi_names, semaphore_kind
from .._core.listeners import LockListener
from .._core.manager import SCAN_COUNT, ManagerCore, names_match, owner_token
from .._core.masters import no_handshake, with_valkey
from .._core.sentinel import is_sentinel_url
from .._core.settings import Settings, check_permits
from .._core.views import MasterView
from .cluster import NodeClients, cluster_types
from .decorators import synchronize
from .driver import SyncDriver
from .election import Election
from .lock import FairLock, Lock, ReadLock, UpgradeableReadLock, WriteLock
from .multilock import MultiLock
from .owner import thread_token
from .semaphore import Semaphore
from .sentinel import sentinel_client
from .transport import SyncTransport
from .waker import Waker
from .wakeups import WakeupHub
from .watchdog import Watchdog

if TYPE_CHECKING:  # valkey-py is optional; its clients are masters too
    from valkey import Valkey

    Master = str | redis.Redis | redis.cluster.RedisCluster | Valkey
else:
    Master = str | redis.Redis | redis.cluster.RedisCluster
P = ParamSpec("P")
R = TypeVar("R")

#: the registry of lock classes: the class of each kind's lock objects, by the kind's
#: label (a multi-lock's kind is made per set of names)
LOCK_CLASSES: dict[str, type[Lock]] = {
    k.kind.label: k
    for k in (Lock, ReadLock, WriteLock, UpgradeableReadLock, FairLock, Semaphore, Election)
} | {MultiKind.label: MultiLock}


def url_client(url: str, timeout: float) -> redis.Redis:
    """A client for one master, with ``timeout`` for connecting and reading (of a
    Sentinel-managed one for a ``redis+sentinel://`` URL)."""
    if is_sentinel_url(url):
        return sentinel_client(url, timeout)
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        **no_handshake(AbstractConnection),
    )


class LockManager(ManagerCore[Lock, UpgradeableReadLock]):
    """Locks over a Redlock quorum of N independent Redis masters (threads own locks).

    ``masters`` are redis URLs or ``redis.Redis`` (or valkey-py's ``valkey.Valkey``)
    clients (a single one is legal), or one string of URLs separated by commas (bare
    ``host:port`` allowed). A member may also be a Redis Cluster, one vote like a
    master: a ``redis.cluster.RedisCluster`` (or valkey-py's ``ValkeyCluster``) client,
    or a ``redis+cluster://host:port`` URL (see the cluster page of the docs). A lock
    is held when a majority (``N // 2 + 1``) granted it within the lease's validity:
    ``lease - elapsed - (lease * drift_factor + 2 ms)``, measured on a monotonic clock.

    ``lease`` (seconds) is the watchdog-managed lease: the watchdog renews held locks
    every ``lease / 3``. ``master_timeout`` bounds one master's answer in a round (default
    ``min(0.25, lease / 10)``); clients made from URLs get it as their socket time-outs,
    and clients you pass in should have time-outs of their own. ``retry_jitter`` is the
    upper bound (seconds) of the random pause after a first split vote (twice that
    after further splits). ``on_lost(lock)`` is
    called, in a thread of its own, when a held lock's lease is lost or its owner thread
    ended while holding it; always before the lease's validity ends. ``fencing=True``
    gives every first hold a fencing token (``lock.token``, one more round per acquire;
    each lock may say otherwise: ``mgr.lock(name, fencing=...)``). ``max_hold``
    (seconds) caps every watchdog-managed hold: the watchdog stops renewing it then and
    reports it lost (each acquire may pass its own). ``listener`` (a
    :class:`LockListener`) is told of every lock's events, for metrics and tracing.
    ``quarantine`` (seconds) is how long a master whose memory began lately (first use,
    a restart without its data, ``FLUSHALL``, eviction, a promoted replica) does not
    vote; default the longest lease the manager hands out, 0 never (see
    docs/safety.md); a fixed lease longer than a quarantine set is refused.
    ``durability`` (``"replicas:N"``, ``"aof"`` or None, for every master or one per
    master) makes a master's grants, re-entries and renewals count only once N
    replicas acknowledged them (``WAIT``) or they were fsynced (``WAITAOF``), in the
    same round (see docs/deployments.md).
    Bad settings raise
    ``ValueError``/``TypeError`` naming the argument.

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
        on_lost: Callable[[Any], object] | None = None,
        fencing: bool = False,
        max_hold: float | None = None,
        listener: LockListener | None = None,
        quarantine: float | None = None,
        durability: str | Sequence[str | None] | None = None,
    ) -> None:
        settings = Settings.check(
            lease,
            drift_factor,
            master_timeout,
            retry_jitter,
            on_lost,
            fencing,
            max_hold,
            listener,
            quarantine,
            durability,
        )
        # The holds table's guard is a thread lock in both flavours: the news of an
        # owner's end may come from another thread.
        engine, clients, self._own_clients = Engine.connect(
            masters,
            settings,
            with_valkey(redis.Redis, "valkey", "Valkey"),
            url_client,
            thread_token,
            threading.Lock,
            cluster_types(),
        )
        timeout = settings.master_timeout
        self._members = clients
        self._nodes = NodeClients(clients, timeout)
        pubsubs = [
            self._nodes.pubsub(i) if isinstance(c, ClusterMember) else c.pubsub
            for i, c in enumerate(clients)
        ]
        # Confirmations of a subscription may take a round trip from every master.
        self._hub = WakeupHub(pubsubs, 2 * timeout, engine.home_channel)
        # The clients made here from URLs: their rounds may use wire connections.
        wired = [i for i, c in enumerate(clients) if any(c is o for o in self._own_clients)]
        self._transport = SyncTransport(
            clients, timeout, settings.probe_interval, self._nodes, wired
        )
        self._driver = SyncDriver(self._transport, self._hub, engine.check_open)
        self._watchdog = Watchdog(self._driver.run, engine, self._report)
        engine.on_managed_hold = self._watchdog.ensure_started
        self._waker = Waker(engine, self._driver.finish)
        engine.on_deferred_wake = self._waker.arm
        super().__init__(engine, self._make)

    def semaphore(self, name: str, permits: int, *, owner: object = None) -> Semaphore:
        """A semaphore named ``name`` of ``permits`` permits (an int from 1 to 1024): at
        most that many owners hold a permit at once (see :class:`Semaphore`). Every
        client should give a name the same number of permits: see the semaphore docs
        for what happens while they differ. ``owner`` as for :meth:`lock`."""
        self._engine.check_open()
        permits = check_permits(permits)
        kind = semaphore_kind(permits)
        return Semaphore(self._engine, self._driver, name, None, owner_token(owner), kind)

    def multi_lock(
        self, names: Iterable[str], *, fencing: bool | None = None, owner: object = None
    ) -> MultiLock:
        """The locks of ``names`` (``lock(name)`` of each), taken and released together:
        all of them or none (see :class:`MultiLock`). ``fencing`` (default: the
        manager's) gives each name a token (``tokens``); ``owner`` as for :meth:`lock`."""
        self._engine.check_open()
        if isinstance(names, str):
            raise TypeError("multi_lock takes several names (a list), not one str")
        kind = multi_kind(multi_names(names))
        token = owner_token(owner)
        return MultiLock(self._engine, self._driver, kind.label_of_names, fencing, token, kind)

    def election(self, name: str, *, owner: object = None) -> Election:
        """Leader election on ``name`` (see :class:`Election`): ``campaign()`` to lead,
        ``leader()`` and ``observe()`` to see who does; ``owner`` as for :meth:`lock`."""
        self._engine.check_open()
        return Election(self._engine, self._driver, name, None, owner_token(owner))

    def _make(self, kind: LockKind, name: str, fencing: bool | None, owner: str | None) -> Lock:
        made = LOCK_CLASSES.get(kind.label, Lock)  # a kind without a class of its own
        return made(self._engine, self._driver, name, fencing, owner, kind.seen_as())

    @overload
    def synchronized(
        self,
        name: str,
        *,
        kind: SyncKind = ...,
        timeout: float = ...,
        blocking: Literal[True] = ...,
        lease: float | None = ...,
    ) -> Callable[[Callable[P, R]], Callable[P, R]]: ...

    @overload
    def synchronized(
        self,
        name: str,
        *,
        kind: SyncKind = ...,
        timeout: float = ...,
        blocking: bool,
        lease: float | None = ...,
    ) -> Callable[[Callable[P, R]], Callable[P, R | None]]: ...

    def synchronized(
        self,
        name: str,
        *,
        kind: SyncKind = "lock",
        timeout: float = -1,
        blocking: bool = True,
        lease: float | None = None,
    ) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
        """A decorator: each call of the function runs holding the lock ``name``,
        owned by the calling thread.

        ``name`` is a lock name, or a :meth:`str.format` template whose fields name
        the function's parameters (``"order:{order_id}"``, ``"account:{self.id}"``):
        each call locks the name made from its own arguments, defaults applied. A
        field that names no parameter is a ``ValueError`` when the function is
        decorated. ``kind`` is ``"lock"`` (:meth:`lock`), ``"fair"`` (:meth:`fair_lock`),
        or ``"read"``/``"write"`` (the sides of :meth:`rw_lock`).

        ``timeout`` and ``lease`` mean what they mean for :meth:`Lock.acquire`. A call
        that does not get the lock within ``timeout`` raises :class:`LockTimeoutError`
        without running the function. With ``blocking=False`` a call that finds the
        lock held by another owner is skipped: the function does not run and the call
        returns None (for at-most-once jobs).

        The lock is reentrant: a decorated function that calls itself, or another one
        decorated with the same name, re-enters it. The lock is released when the
        function returns or raises, as at the end of a ``with lock:`` block. Bad
        options raise ``TypeError``/``ValueError`` at once, and so does decorating a
        coroutine or generator function. See the decorators page of the docs.
        """
        self._engine.check_open()
        options = Synchronized.check(
            name, kind=kind, blocking=blocking, timeout=timeout, lease=lease
        )

        def decorate(fn: Callable[P, R]) -> Callable[P, R | None]:
            return synchronize(self, options, fn)

        return decorate

    def inspect(self, name: str) -> list[MasterView]:
        """Every master's view of the locks (of all kinds) named ``name``: holders, hold
        counts, TTL, mode and queue. One read-only round; a master that fails to answer
        has ``error`` set."""
        validate_name(name)
        return self._driver.run(self._engine.probe(FAMILIES, name))

    def quorum_votes_at(self) -> float:
        """When (on ``time.monotonic()``) a quorum of the masters' votes count, as this
        manager saw in its rounds: a time past (``-inf`` if no master was ever counted
        out) when they count now. A refused acquire that started before it may have been
        refused for want of counted votes (masters quarantined after a restart or a
        failover, or whose clock was seen to step: see docs/safety.md), not by a
        holder. No I/O."""
        return self._engine.quorum.votes_at()

    def quarantined(self) -> list[float]:
        """Seconds before each master's votes count, in order: 0.0 for a master whose
        votes count (or that did not answer). A master whose memory began lately (first
        use, a restart without its data, ``FLUSHALL``, an eviction, a failover) is
        quarantined: see docs/safety.md. One read-only round."""
        return self._driver.run(self._engine.quarantined())

    def names(self, pattern: str = "*") -> dict[str, tuple[str, ...]]:
        """The names of the locks matching the glob ``pattern`` that are held or waited
        for on the masters, in name order, each with its families present (of
        ``"lock"``, ``"rw"``, ``"fair"``, ``"semaphore"``, ``"election"``: the plain lock
        and the multi-lock are ``"lock"``). One ``SCAN`` of each master (of each primary
        node of a cluster member): a name held on a quorum is listed while a quorum
        answers; :class:`QuorumUnavailableError` when too few do. Fencing counters alone
        (kept after their lock is gone) are not listed."""
        match = names_match(pattern)
        found: list[list[object] | BaseException] = []
        for i in range(len(self._members)):
            try:
                clients = self._clients_of(i)
                found.append(
                    [k for c in clients for k in c.scan_iter(match=match, count=SCAN_COUNT)]
                )
            except Exception as error:
                found.append(error)
        return self._names_found(pattern, found)

    def ping(self) -> list[float | BaseException]:
        """Each master's answer to a ``PING``, in order: the seconds it took (a cluster
        member: a ``PING`` of each primary node, one after another), or the error it
        raised (for a master given as a URL, a time-out after ``master_timeout``)."""
        out: list[float | BaseException] = []
        for i in range(len(self._members)):
            started = time.perf_counter()
            try:
                for client in self._clients_of(i):
                    client.ping()
                out.append(time.perf_counter() - started)
            except Exception as error:
                out.append(error)
        return out

    def _clients_of(self, i: int) -> list[Any]:
        """The clients of master ``i``: itself, or a cluster member's primary nodes."""
        member = self._members[i]
        return self._nodes.primaries(i) if isinstance(member, ClusterMember) else [member]

    def force_unlock(self, name: str) -> bool:
        """Delete every kind of lock named ``name`` on every master, whoever holds it, and
        wake the waiters. Returns True if any master had one. The holders are not told
        until their next renewal, re-entry or release raises :class:`LockLostError`."""
        validate_name(name)
        return self._driver.run(self._engine.force_unlock_families(FAMILIES, name))

    def close(self) -> None:
        """Stop the watchdog and the wake-up subscriber, and close the clients made from
        URLs. Held locks are not released: their leases run out (release them first).

        Threads waiting in ``acquire`` wake and fail with :class:`ManagerClosedError`
        (taking no hold), and so does every later call on the manager."""
        engine = self._engine
        if engine.closed:
            return
        engine.closed = True  # from now on, no release defers its wake-up
        self._watchdog.stop()
        self._hub.close()
        # Woken waiters undo what they took and leave queues: let them, on an open
        # transport (bounded: each round is).
        self._driver.drain(2.0 + 4 * engine.settings.master_timeout)
        # Then the wake-ups still deferred, those of releases that ended meanwhile too.
        self._waker.stop()
        self._transport.close()
        self._nodes.close()
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

    def _after_fork_in_child(self) -> None:
        super()._after_fork_in_child()
        self._watchdog.after_fork()
        self._waker.after_fork()
        self._hub.after_fork(self._engine.home_channel)
