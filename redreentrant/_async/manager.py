"""The asyncio :class:`LockManager`: the same algorithm as the sync one, driven by tasks."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar, overload

import redis.asyncio
import redis.asyncio.cluster
from redis.asyncio.connection import AbstractConnection

from .._core.cluster import ClusterMember
from .._core.decorators import Synchronized, SyncKind
from .._core.engine import Engine
from .._core.holds import Hold
from .._core.keys import validate_name
from .._core.kinds import FAMILIES, LockKind, MultiKind, multi_kind, multi_names, semaphore_kind
from .._core.listeners import LockListener
from .._core.locking import ReadWriteLock
from .._core.manager import SCAN_COUNT, ManagerCore, names_match, owner_token
from .._core.masters import no_handshake, with_valkey
from .._core.sentinel import is_sentinel_url
from .._core.settings import Settings, check_permits
from .._core.views import MasterView
from .cluster import NodeClients, cluster_types
from .decorators import synchronize
from .driver import AsyncDriver
from .election import Election
from .lock import FairLock, Lock, ReadLock, UpgradeableReadLock, WriteLock
from .multilock import MultiLock
from .owner import task_token
from .semaphore import Semaphore
from .sentinel import sentinel_client
from .transport import AsyncTransport
from .waker import AsyncWaker
from .wakeups import AsyncWakeupHub
from .watchdog import AsyncWatchdog

if TYPE_CHECKING:  # valkey-py is optional; its clients are masters too
    from valkey.asyncio import Valkey

    Master = str | redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster | Valkey
else:
    Master = str | redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster
P = ParamSpec("P")
R = TypeVar("R")

#: the registry of lock classes: the class of each kind's lock objects, by the kind's
#: label (a multi-lock's kind is made per set of names)
LOCK_CLASSES: dict[str, type[Lock]] = {
    k.kind.label: k
    for k in (Lock, ReadLock, WriteLock, UpgradeableReadLock, FairLock, Semaphore, Election)
} | {MultiKind.label: MultiLock}
L = TypeVar("L", bound=Lock)


def url_client(url: str, timeout: float) -> redis.asyncio.Redis:
    """An asyncio client for one master, with ``timeout`` for connecting.

    No socket time-out: the transport bounds every master's part of a round itself, and
    redis.asyncio would wrap each read and write in a task of its own to enforce one.
    A ``redis+sentinel://`` URL makes a client of a Sentinel-managed master."""
    if is_sentinel_url(url):
        return sentinel_client(url, timeout)
    return redis.asyncio.Redis.from_url(
        url,
        socket_timeout=None,
        socket_connect_timeout=timeout,
        **no_handshake(AbstractConnection),
    )


class LockManager(ManagerCore[Lock, UpgradeableReadLock]):
    """The asyncio twin of :class:`redreentrant.LockManager`: locks owned by tasks.

    ``masters`` are redis URLs or ``redis.asyncio.Redis`` (or valkey-py's
    ``valkey.asyncio.Valkey``) clients, and cluster members:
    ``redis.asyncio.cluster.RedisCluster`` (or valkey-py's asyncio ``ValkeyCluster``)
    clients or ``redis+cluster://`` URLs; every other argument
    means what it means for the sync manager. ``on_lost`` may be a plain function or a
    coroutine function. Use ``async with LockManager(...)``, or ``await mgr.close()``.

    ``lock()``, ``rw_lock()`` and ``fair_lock()`` also take ``cancel_on_loss=True``: a
    task's first hold of such a lock cancels the task once the hold is lost, and the
    ``async with`` block it runs in then raises :class:`LockLostError` (see the asyncio
    docs).
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
            with_valkey(redis.asyncio.Redis, "valkey.asyncio", "Valkey"),
            url_client,
            task_token,
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
        self._hub = AsyncWakeupHub(pubsubs, 2 * timeout, engine.home_channel)
        # The clients made here from URLs: their rounds may use wire connections.
        wired = [i for i, c in enumerate(clients) if any(c is o for o in self._own_clients)]
        self._transport = AsyncTransport(
            clients, timeout, settings.probe_interval, self._nodes, wired
        )
        self._driver = AsyncDriver(self._transport, self._hub, engine.check_open)
        self._watchdog = AsyncWatchdog(self._driver.run, engine, self._report)
        engine.on_managed_hold = self._watchdog.ensure_started
        self._waker = AsyncWaker(engine, self._driver.finish)
        engine.on_deferred_wake = self._waker.arm
        super().__init__(engine, self._make)

    def lock(
        self,
        name: str,
        *,
        fencing: bool | None = None,
        cancel_on_loss: bool = False,
        owner: object = None,
    ) -> Lock:
        """A reentrant lock named ``name`` (see :meth:`redreentrant.LockManager.lock`):
        owned by the task that acquires it, or by the object ``owner``, whose holds any
        task may take and release; ``cancel_on_loss`` cancels the owning task when its
        hold is lost."""
        return self._cancelling(super().lock(name, fencing=fencing, owner=owner), cancel_on_loss)

    def rw_lock(
        self,
        name: str,
        *,
        fencing: bool | None = None,
        cancel_on_loss: bool = False,
        owner: object = None,
    ) -> ReadWriteLock[Lock, UpgradeableReadLock]:
        """A read/write lock named ``name``; ``cancel_on_loss`` applies to every side."""
        rw = super().rw_lock(name, fencing=fencing, owner=owner)
        self._cancelling(rw.read, cancel_on_loss)
        self._cancelling(rw.write, cancel_on_loss)
        self._cancelling(rw.upgradeable, cancel_on_loss)
        return rw

    def fair_lock(
        self,
        name: str,
        *,
        fencing: bool | None = None,
        cancel_on_loss: bool = False,
        owner: object = None,
    ) -> Lock:
        """A fair lock named ``name``; ``cancel_on_loss`` and ``owner`` as for :meth:`lock`."""
        lock = super().fair_lock(name, fencing=fencing, owner=owner)
        return self._cancelling(lock, cancel_on_loss)

    def election(
        self, name: str, *, cancel_on_loss: bool = False, owner: object = None
    ) -> Election:
        """Leader election on ``name`` (see :meth:`redreentrant.LockManager.election`);
        ``cancel_on_loss`` cancels the leading task when its leadership is lost."""
        self._engine.check_open()
        return Election(self._engine, self._driver, name, None, cancel_on_loss, owner_token(owner))

    def semaphore(
        self, name: str, permits: int, *, cancel_on_loss: bool = False, owner: object = None
    ) -> Semaphore:
        """A semaphore of ``permits`` permits named ``name`` (see
        :meth:`redreentrant.LockManager.semaphore`); ``cancel_on_loss`` and ``owner`` as
        for :meth:`lock`."""
        self._engine.check_open()
        permits = check_permits(permits)
        kind = semaphore_kind(permits)
        token = owner_token(owner)
        return Semaphore(self._engine, self._driver, name, None, cancel_on_loss, token, kind)

    @staticmethod
    def _cancelling(lock: L, cancel_on_loss: bool) -> L:
        if not isinstance(cancel_on_loss, bool):
            raise TypeError(f"cancel_on_loss must be True or False, not {cancel_on_loss!r}")
        lock.cancel_on_loss = cancel_on_loss
        return lock

    def multi_lock(
        self,
        names: Iterable[str],
        *,
        fencing: bool | None = None,
        cancel_on_loss: bool = False,
        owner: object = None,
    ) -> MultiLock:
        """The locks of ``names``, taken and released together (see
        :meth:`redreentrant.LockManager.multi_lock`); ``cancel_on_loss`` and ``owner``
        as for :meth:`lock`."""
        self._engine.check_open()
        if isinstance(names, str):
            raise TypeError("multi_lock takes several names (a list), not one str")
        kind = multi_kind(multi_names(names))
        token, name = owner_token(owner), kind.label_of_names
        return MultiLock(self._engine, self._driver, name, fencing, cancel_on_loss, token, kind)

    def _make(self, kind: LockKind, name: str, fencing: bool | None, owner: str | None) -> Lock:
        made = LOCK_CLASSES.get(kind.label, Lock)  # a kind without a class of its own
        return made(self._engine, self._driver, name, fencing, False, owner, kind.seen_as())

    @overload
    def synchronized(
        self,
        name: str,
        *,
        kind: SyncKind = ...,
        timeout: float = ...,
        blocking: Literal[True] = ...,
        lease: float | None = ...,
    ) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]: ...

    @overload
    def synchronized(
        self,
        name: str,
        *,
        kind: SyncKind = ...,
        timeout: float = ...,
        blocking: bool,
        lease: float | None = ...,
    ) -> Callable[
        [Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R | None]]
    ]: ...

    def synchronized(
        self,
        name: str,
        *,
        kind: SyncKind = "lock",
        timeout: float = -1,
        blocking: bool = True,
        lease: float | None = None,
    ) -> Callable[
        [Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R | None]]
    ]:
        """A decorator for ``async def`` functions: each call runs holding the lock
        ``name``, acquired in the task that awaits the call, which owns it.

        The options mean what they mean for the sync
        :meth:`redreentrant.LockManager.synchronized`. A recursive await of the
        decorated function in the same task re-enters the lock; a call run as a task
        of its own (``create_task``, ``gather``) is another owner. Decorating a
        function that is not ``async def`` raises ``TypeError``.
        """
        self._engine.check_open()
        options = Synchronized.check(
            name, kind=kind, blocking=blocking, timeout=timeout, lease=lease
        )

        def decorate(
            fn: Callable[P, Coroutine[Any, Any, R]],
        ) -> Callable[P, Coroutine[Any, Any, R | None]]:
            return synchronize(self, options, fn)

        return decorate

    async def inspect(self, name: str) -> list[MasterView]:
        """Every master's view of the locks named ``name`` (see the sync manager)."""
        validate_name(name)
        return await self._driver.run(self._engine.probe(FAMILIES, name))

    def quorum_votes_at(self) -> float:
        """When (on ``time.monotonic()``) a quorum of the masters' votes count, as this
        manager saw in its rounds: a time past (``-inf`` if no master was ever counted
        out) when they count now. A refused acquire that started before it may have been
        refused for want of counted votes (masters quarantined after a restart or a
        failover, or whose clock was seen to step: see docs/safety.md), not by a
        holder. No I/O."""
        return self._engine.quorum.votes_at()

    async def quarantined(self) -> list[float]:
        """Seconds before each master's votes count, in order: 0.0 for a master whose
        votes count (or that did not answer). A master whose memory began lately (first
        use, a restart without its data, ``FLUSHALL``, an eviction, a failover) is
        quarantined: see docs/safety.md. One read-only round."""
        return await self._driver.run(self._engine.quarantined())

    async def names(self, pattern: str = "*") -> dict[str, tuple[str, ...]]:
        """The names of the locks matching ``pattern`` held or waited for on the
        masters, with their families (see the sync manager)."""
        match = names_match(pattern)
        found: list[list[object] | BaseException] = []
        for i in range(len(self._members)):
            try:
                keys: list[object] = []
                for client in await self._clients_of(i):
                    cursor: int | None = None
                    while cursor != 0:  # each step bounded: the clients have no time-out
                        step = client.scan(cursor or 0, match=match, count=SCAN_COUNT)
                        cursor, some = await asyncio.wait_for(step, self.master_timeout)
                        keys += some
                found.append(keys)
            except Exception as error:
                found.append(error)
        return self._names_found(pattern, found)

    async def ping(self) -> list[float | BaseException]:
        """Each master's answer to a ``PING`` (see the sync manager); a master that does
        not answer within ``master_timeout`` gives a ``TimeoutError``."""
        out: list[float | BaseException] = []
        for i in range(len(self._members)):
            started = time.perf_counter()
            try:
                for client in await self._clients_of(i):
                    await asyncio.wait_for(client.ping(), self.master_timeout)
                out.append(time.perf_counter() - started)
            except Exception as error:
                out.append(error)
        return out

    async def _clients_of(self, i: int) -> list[Any]:
        """The clients of master ``i``: itself, or a cluster member's primary nodes."""
        member = self._members[i]
        if isinstance(member, ClusterMember):
            return await self._nodes.primaries(i)
        return [member]

    async def force_unlock(self, name: str) -> bool:
        """Delete every kind of lock named ``name`` on every master (see the sync manager)."""
        validate_name(name)
        return await self._driver.run(self._engine.force_unlock_families(FAMILIES, name))

    async def close(self) -> None:
        """Stop the watchdog task and the wake-up readers, and close the clients made
        from URLs. Held locks are not released: their leases run out.

        Tasks waiting in ``acquire`` wake and fail with :class:`ManagerClosedError`
        (taking no hold), and so does every later call on the manager."""
        engine = self._engine
        if engine.closed:
            return
        engine.closed = True  # from now on, no release defers its wake-up
        await self._watchdog.stop()
        await self._hub.close()
        # Woken waiters undo what they took and leave queues: let them, on an open
        # transport (bounded: each round is).
        await self._driver.drain(2.0 + 4 * engine.settings.master_timeout)
        # Then the wake-ups still deferred, those of releases that ended meanwhile too.
        await self._waker.stop()
        await self._transport.close()
        await self._nodes.close()
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

    def _report(self, hold: Hold) -> object:
        result = super()._report(hold)
        return result if inspect.isawaitable(result) else None
