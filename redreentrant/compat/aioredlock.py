"""aioredlock's ``Aioredlock`` (module ``aioredlock``, 0.7.3) on redreentrant's asyncio
flavour: replace ``from aioredlock import Aioredlock, LockError`` with ``from
redreentrant.compat.aioredlock import Aioredlock, LockError``.

``Aioredlock(redis_connections, retry_count, retry_delay_min, retry_delay_max,
internal_lock_timeout)`` checks its arguments as aioredlock does. ``redis_connections``
are the quorum's masters (a majority of them), distinct servers (two databases of one
server raise ``ValueError`` at the first call): URL strings (``redis://``,
``rediss://``, ``unix://``), unix socket paths, ``(host, port)`` tuples, dicts of
``host``, ``port``, ``db`` and ``password`` (``minsize``, ``maxsize`` and ``encoding``
are ignored: they shape aioredis's pool and replies), and ``redis.asyncio.Redis``
clients. aioredis 1.x pools and ``Sentinel`` raise ``TypeError``. ``lock()`` returns a
:class:`Lock`, ``unlock()``, ``extend()``, ``is_locked()``, ``get_lock()`` and
``get_active_locks()`` return and raise as aioredlock's do. What differs:

- ``lock_timeout=None`` (aioredlock's lock renewed every 0.6 * ``internal_lock_timeout``
  until unlocked) is a lock renewed by the watchdog, with the manager's lease (30 s):
  ``internal_lock_timeout`` is checked but not used, so the lock of a process that dies
  frees itself within 30 s. ``lock_timeout=seconds`` is a fixed lease, never renewed,
  judged on a monotonic clock with the same drift allowance (2 ms plus 1 %); one
  shorter than about 4 ms raises ``LockError('Lock timeout')``.
- Not reentrant, as aioredlock: the owner of a lock is its ``(resource, id)``, so
  ``lock()`` of a held resource raises ``LockAcquiringError``, and ``lock()`` with the
  ``lock_identifier`` that holds it sets the lock again, without counting (one
  ``unlock()`` frees it). That lock keeps its kind of lease: a renewed one stays
  renewed; a fixed one gets ``lock_timeout`` (or ``internal_lock_timeout``) from now.
- ``lock()`` waits at most ``(retry_count - 1) * retry_delay_max`` seconds, the longest
  aioredlock's retries wait, and is woken by the release (no polling). It retries after
  a random delay only when too many masters fail; then it raises ``LockRuntimeError``.
- ``extend()`` of a renewed lock makes a round that proves it still held and leaves it
  renewed (``lock_timeout`` unused); of a fixed one, it sets its lease to
  ``lock_timeout`` (or the lock's) from now. A lock that was lost is taken again if it
  is free, as aioredlock's ``extend()`` does.
- A lock belongs to this process: its ``id`` cannot take or release it from another.
  ``destroy()`` unlocks this object's locks; the manager and its connections, shared
  with the other adapters of the same masters on the event loop, stay.
- Keys are redreentrant's (``redreentrant:v1:{resource}``), not ``resource`` itself;
  ``resource`` is a non-empty ``str``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import re
import time
import uuid
from collections.abc import Sequence
from types import TracebackType
from typing import Any
from urllib.parse import quote

import redis.asyncio

import redreentrant.asyncio
from redreentrant.asyncio import LockLostError, LockNotOwnedError, QuorumUnavailableError
from redreentrant.compat.managers import async_manager
from redreentrant.compat.owners import Owner, registry

__all__ = [
    "Aioredlock",
    "AioredlockError",
    "Lock",
    "LockAcquiringError",
    "LockError",
    "LockRuntimeError",
    "Sentinel",
]

log = logging.getLogger(__name__)


class AioredlockError(Exception):
    """Base exception for aioredlock"""


class LockError(AioredlockError):
    """Error in acquiring or releasing the lock"""


class LockAcquiringError(LockError):
    """Error in acquiring the lock during normal operation"""


class LockRuntimeError(LockError):
    """Error in acquiring or releasing the lock due to an unexpected event"""


class Sentinel:
    """aioredlock's Redis Sentinel address: not supported. A Redlock quorum needs masters
    that do not fail over (a replica promoted may lack the lock): pass each master's
    URL instead."""

    def __init__(self, connection: Any, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "redreentrant takes no Sentinel: a Redlock quorum needs independent masters"
            " that do not fail over; pass each master's URL"
        )


@dataclasses.dataclass
class Lock:
    """A lock taken by :meth:`Aioredlock.lock` (``valid`` until unlocked), an async
    context manager that unlocks it on exit."""

    lock_manager: Any
    resource: str
    id: Any
    lock_timeout: float | None = 10.0
    valid: bool = False

    async def __aenter__(self) -> Lock:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.lock_manager.unlock(self)

    async def extend(self) -> None:
        await self.lock_manager.extend(self)

    async def release(self) -> None:
        await self.lock_manager.unlock(self)

    async def is_locked(self) -> bool:
        return bool(await self.lock_manager.is_locked(self))


# -- the masters ------------------------------------------------------------------------

#: dict keys with nothing to honour: aioredis's pool sizes and reply decoding
IGNORED = frozenset({"minsize", "maxsize", "encoding"})
URL_SCHEMES = ("redis://", "rediss://", "unix://")


def _url(
    host: object = "localhost", port: object = 6379, db: object = 0, password: object = None
) -> str:
    host = str(host)
    where = f"[{host}]" if ":" in host else host
    auth = f":{quote(str(password), safe='')}@" if password else ""
    return f"redis://{auth}{where}:{int(port)}/{int(db)}"  # type: ignore[call-overload]


def master_of(connection: Any) -> Any:
    """The master (URL or client) of one of aioredlock's ``redis_connections``."""
    if isinstance(connection, str):
        if connection.startswith(URL_SCHEMES):
            return connection
        return "unix://" + os.path.abspath(connection)  # aioredis: a socket's path
    if isinstance(connection, dict):
        unknown = set(connection) - {"host", "port", "db", "password"} - IGNORED
        if unknown:
            raise TypeError(
                f"connection options {sorted(unknown)} are not supported: pass a URL, or"
                " a redis.asyncio.Redis client made with them"
            )
        return _url(**{k: v for k, v in connection.items() if k not in IGNORED})
    if isinstance(connection, (tuple, list)) and len(connection) == 2:
        return _url(*connection)
    module = type(connection).__module__
    if isinstance(connection, redis.asyncio.Redis) or module.startswith("valkey.asyncio"):
        return connection
    raise TypeError(
        f"{type(connection).__name__} is not a master redreentrant takes: pass a URL, a"
        " (host, port) tuple, a dict of host, port, db and password, or a"
        " redis.asyncio.Redis client (aioredis 1.x pools are not supported)"
    )


# -- the owners of the locks ----------------------------------------------------------


class _Owner(Owner):
    """The owner of one ``(resource, id)``'s hold (see :mod:`.owners`): any task may use
    it; ``fixed``: taken with a fixed lease (else renewed by the watchdog)."""

    __slots__ = ("fixed",)

    def __init__(self, mgr: redreentrant.asyncio.LockManager, resource: str, fixed: bool) -> None:
        self.lock = mgr.lock(resource, owner=self)
        self.fixed = fixed


async def _released(lock: redreentrant.asyncio.Lock) -> bool:
    """Release a hold: False if it was lost or is not held (QuorumUnavailableError
    passes)."""
    try:
        await lock.release()
    except (LockLostError, LockNotOwnedError):
        return False
    return True


def _positive(value: Any, message: str) -> float:
    number = float(value)
    if number <= 0:
        raise ValueError(message)
    return number


def _clean_password(details: Any) -> str:
    """``details`` as text, passwords starred (as aioredlock shows its connections)."""
    if isinstance(details, dict):
        details = {k: "*******" if k == "password" else v for k, v in details.items()}
    elif isinstance(details, list):
        return str([_clean_password(d) if isinstance(d, (dict, str)) else d for d in details])
    elif isinstance(details, str):
        details = re.sub(r"(rediss?:\/\/)(:.+@)?(.*)", "\\1:*******@\\3", details)
    return str(details)


def _fields(manager: Aioredlock) -> tuple[Any, ...]:
    """What an Aioredlock is compared by (its arguments, as aioredlock's)."""
    return (
        manager.redis_connections,
        manager.retry_count,
        manager.retry_delay_min,
        manager.retry_delay_max,
        manager.internal_lock_timeout,
    )


class Aioredlock:
    """aioredlock's lock manager over ``redis_connections`` (see the module's
    documentation for what differs)."""

    def __init__(
        self,
        redis_connections: Sequence[Any] = [{"host": "localhost", "port": 6379}],
        retry_count: int = 3,
        retry_delay_min: float = 0.1,
        retry_delay_max: float = 0.3,
        internal_lock_timeout: float = 10.0,
    ) -> None:
        self.redis_connections = redis_connections
        self.retry_count = int(retry_count)
        if self.retry_count < 1:
            raise ValueError("Retry count must be greater or equal 1.")
        delay = "Retry delay must be greater than 0 seconds."
        self.retry_delay_min = _positive(retry_delay_min, delay)
        self.retry_delay_max = _positive(retry_delay_max, delay)
        self.internal_lock_timeout = _positive(
            internal_lock_timeout, "Internal lock_timeout must be greater than 0 seconds."
        )
        self._masters = [master_of(c) for c in redis_connections]
        self._locks: dict[str, Lock] = {}

    def __repr__(self) -> str:
        return (
            f"Aioredlock(redis_connections={_clean_password(self.redis_connections)},"
            f" retry_count={self.retry_count!r}, retry_delay_min={self.retry_delay_min!r},"
            f" retry_delay_max={self.retry_delay_max!r},"
            f" internal_lock_timeout={self.internal_lock_timeout!r})"
        )

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self) or not isinstance(other, Aioredlock):
            return NotImplemented
        return _fields(self) == _fields(other)

    __hash__ = None  # type: ignore[assignment]  # as aioredlock's: compared by value

    @property
    def log(self) -> logging.Logger:
        return log

    def _manager(self) -> redreentrant.asyncio.LockManager:
        return async_manager(self._masters)

    async def _set_lock(self, resource: str, lock_identifier: Any, fixed: float | None) -> None:
        """Take ``resource`` for ``lock_identifier``, or set it again if that identifier
        holds it: renewed by the watchdog (``fixed`` None) or for ``fixed`` seconds.
        Raises LockError when it is not obtained."""
        if not isinstance(resource, str):
            raise TypeError(f"resource must be a str, not {type(resource).__name__}")
        mgr = self._manager()
        held = registry(mgr)
        key = (resource, lock_identifier)
        owner = held.get(key)
        if isinstance(owner, _Owner) and owner.fixed and not owner.lock.is_owned():
            held.pop(key)  # a fixed lease that ran out, never unlocked: forgotten
        elif isinstance(owner, _Owner):
            try:
                await self._set_again(owner, fixed)
                return
            except LockLostError:
                if held.get(key) is owner:
                    held.pop(key)
                with contextlib.suppress(QuorumUnavailableError):
                    await _released(owner.lock)
            except QuorumUnavailableError as error:
                raise LockRuntimeError("Can not set lock") from error
        owner = _Owner(mgr, resource, fixed is not None)
        if fixed is not None and fixed < mgr.shortest_lease:
            raise LockError("Lock timeout")
        deadline = time.monotonic() + (self.retry_count - 1) * self.retry_delay_max
        for tries_left in reversed(range(self.retry_count)):
            try:
                got = await owner.lock.acquire(
                    timeout=max(0.0, deadline - time.monotonic()), lease=fixed
                )
                break
            except QuorumUnavailableError as error:
                if not tries_left:
                    raise LockRuntimeError("Can not set lock") from error
            await asyncio.sleep(random.uniform(self.retry_delay_min, self.retry_delay_max))
        if not got:
            raise LockAcquiringError("Can not set lock")
        held.add(key, owner)

    async def _set_again(self, owner: _Owner, fixed: float | None) -> None:
        """Set a lock its identifier holds again (LockLostError if it was lost)."""
        lock = owner.lock
        if owner.fixed:
            await lock.extend(self.internal_lock_timeout if fixed is None else fixed, replace=True)
        else:
            # A re-entry is a round that proves the hold and refreshes its lease.
            await lock.acquire(blocking=False)
            await lock.release()

    async def lock(
        self, resource: str, lock_timeout: float | None = None, lock_identifier: Any = None
    ) -> Lock:
        """Take ``resource``: renewed until unlocked (``lock_timeout=None``) or for
        ``lock_timeout`` seconds. Returns a valid :class:`Lock`; raises
        :class:`LockError` (:class:`LockAcquiringError`: held by another) if it is not
        obtained."""
        lock_identifier = lock_identifier or str(uuid.uuid4())
        if lock_timeout is not None and lock_timeout <= 0:
            raise ValueError("Lock timeout must be greater than 0 seconds.")
        await self._set_lock(resource, lock_identifier, lock_timeout)
        lock = Lock(self, resource, lock_identifier, lock_timeout, valid=True)
        self._locks[resource] = lock
        return lock

    async def extend(self, lock: Lock, lock_timeout: float | None = None) -> None:
        """Set ``lock``'s lease again: ``lock_timeout`` (else the lock's) from now for a
        fixed lease; a renewed lock is proven held. ``RuntimeError`` if the lock is not
        valid; :class:`LockError` (the lock unlocked) if it cannot be extended."""
        log.debug('Extending lock "%s"', lock.resource)
        if not lock.valid:
            raise RuntimeError("Lock is not valid")
        if lock_timeout is not None and lock_timeout <= 0:
            raise ValueError("Lock timeout must be greater than 0 seconds.")
        fixed = None if lock.lock_timeout is None else (lock_timeout or lock.lock_timeout)
        try:
            await self._set_lock(lock.resource, lock.id, fixed)
        except Exception:
            with contextlib.suppress(LockError):
                await self.unlock(lock)
            raise

    async def unlock(self, lock: Lock) -> None:
        """Release ``lock`` and make it invalid. :class:`LockError` if another holds the
        resource, or too many masters failed; a lock that is not held is ignored."""
        log.debug('Releasing lock "%s"', lock.resource)
        lock.valid = False
        mgr = self._manager()
        owner = registry(mgr).pop((lock.resource, lock.id))
        try:
            released = owner is not None and await _released(owner.lock)
            if not released and await mgr.lock(lock.resource).locked():
                raise LockAcquiringError("Can not unset lock")
        except QuorumUnavailableError as error:
            raise LockRuntimeError("Can not unset lock") from error
        self._locks.pop(lock.resource, None)

    async def is_locked(self, resource_or_lock: Lock | str) -> bool:
        """Whether anyone holds the resource (or the lock's resource) on a quorum;
        False when too many masters fail to answer, as aioredlock's."""
        if isinstance(resource_or_lock, Lock):
            resource = resource_or_lock.resource
        elif isinstance(resource_or_lock, str):
            resource = resource_or_lock
        else:
            raise TypeError(
                "Argument should be ether aioredlock.Lock instance or string, "
                f"{type(resource_or_lock)} is given."
            )
        try:
            return await self._manager().lock(resource).locked()
        except QuorumUnavailableError:
            return False  # as aioredlock: not locked on a majority that answered

    async def destroy(self) -> None:
        """Unlock this object's valid locks (errors are logged)."""
        log.debug("Destroying %r", self)
        for resource, lock in self._locks.copy().items():
            if lock.valid:
                try:
                    await self.unlock(lock)
                except Exception:
                    log.exception('Can not unlock "%s"', resource)
        self._locks.clear()

    async def get_active_locks(self) -> list[Lock]:
        """This object's locks that are valid and held by anyone."""
        return [
            lock for lock in self._locks.values() if lock.valid is True and await lock.is_locked()
        ]

    async def get_lock(self, resource: str, lock_identifier: Any) -> Lock:
        """A :class:`Lock` of ``resource`` held by ``lock_identifier`` here, its
        ``lock_timeout`` the seconds left (rounded); :class:`LockAcquiringError` if that
        identifier does not hold it."""
        owner = registry(self._manager()).get((resource, lock_identifier))
        if owner is None or not owner.lock.is_owned():
            raise LockAcquiringError("Can not get lock")
        return Lock(self, resource, lock_identifier, round(owner.lock.remaining()), valid=True)
