"""redis-py's lock on redreentrant: ``Lock`` for ``redis.lock.Lock`` and ``AsyncLock``
for ``redis.asyncio.lock.Lock``, with their constructor signatures (those of the
installed redis-py: ``raise_on_release_error`` where it has it), attributes (``name``,
``timeout``, ``sleep``, ``blocking``, ``blocking_timeout``, ``thread_local``,
``local.token``), methods, return values and exceptions (redis-py's own ``LockError``
and ``LockNotOwnedError``, raised where redis-py raises them)::

    lock = r.lock("reports", timeout=60, blocking_timeout=5, lock_class=Lock)
    lock = Lock(r, "reports", timeout=60)               # the same
    alock = ar.lock("reports", lock_class=AsyncLock)    # on a redis.asyncio.Redis

The client the lock is made on is the one master (a quorum of one), through the
manager shared by every adapter of that server (:mod:`redreentrant.compat.managers`).
What maps onto what:

- ``timeout=seconds``: a fixed lease, never renewed (one shorter than the shortest
  redreentrant honours, about 4 ms, is raised to it; one under 1 ms is refused with the
  ``ResponseError`` redis-py gets from the server). ``timeout=None`` (or ``0``), which
  redis-py keeps forever: a lease renewed by the watchdog while the process lives; after
  the process dies the lock lapses within the manager's lease (30 s), never stays.
  ``extend()`` and ``reacquire()`` refuse it, as redis-py does (``LockError``; for
  ``0``, ``LockNotOwnedError``).
- ``blocking_timeout`` and ``sleep``: redis-py tries every ``sleep`` seconds and gives
  up when its next try would come after ``blocking_timeout``; the adapter waits as
  long (the last multiple of ``sleep`` within ``blocking_timeout``; none when ``sleep``
  is longer: one try), but does not poll: the wait is woken by the holder's release
  or by its lease's end.
- Not reentrant, as redis-py: every acquire takes a token (a new one, or ``token=``),
  and each token of a name is an owner of its own. An acquire while the same token
  holds the name waits (``blocking=False``: False at once), as redis-py's ``SET NX``.
- ``thread_local=True``: a thread sees only the token it acquired with, so it cannot
  release another thread's hold (a thread without a token gets ``owned()`` False and
  ``LockError`` from ``release()``, where redis-py raises ``AttributeError``);
  ``thread_local=False``: the token is the lock object's, and any thread may release
  it. ``token=`` names the owner in this
  process: lock objects of a name that hold the same token (acquired with it, or
  given it in ``local.token``) share its hold, and any of them may extend or release
  it. Another process cannot release it with the token.
- ``owned()`` and the errors of ``extend()``, ``reacquire()`` and ``release()`` judge
  the hold's validity on a monotonic clock (no round trip for ``owned()``); a hold
  whose validity ran out, or that the masters lost, is no longer owned
  (``LockNotOwnedError``). ``locked()`` asks the master.
- A master that fails raises its client's error (``ConnectionError``,
  ``TimeoutError``, ...), and an acquire that fails is undone.
- The keys are redreentrant's (``redreentrant:v1:{name}``), never ``name``: a lock of
  this adapter and one of redis-py do not exclude each other, and the key ``name``
  is never read or written. A ``bytes`` name is decoded as UTF-8.
"""

from __future__ import annotations

import inspect
import logging
import math
import threading
import uuid
from collections.abc import Awaitable
from types import SimpleNamespace, TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import redis
from redis.exceptions import LockError, LockNotOwnedError, ResponseError

import redreentrant
import redreentrant.asyncio
from redreentrant.compat._steps import Steps, arun, run
from redreentrant.compat.managers import async_manager, sync_manager
from redreentrant.compat.owners import Owner, registry

__all__ = ["AsyncLock", "Lock", "LockError", "LockNotOwnedError"]

# The constructor takes raise_on_release_error where the installed redis-py's does
# (its sync and asyncio lock got it together; its Redis.lock passes it on then).
_RAISE_ON_RELEASE = "raise_on_release_error" in inspect.signature(redis.Redis.lock).parameters


def _error(cls: type[LockError], message: str, name: Any) -> LockError:
    """redis-py's ``cls(message)``, with ``lock_name`` where its LockError has one."""
    try:
        return cls(message, lock_name=name)  # type: ignore[call-arg,unused-ignore]
    except TypeError:
        return cls(message)


def _master_error(error: redreentrant.QuorumUnavailableError) -> Exception:
    """What redis-py would have raised: the master's own error."""
    for cause in error.errors.values():
        if isinstance(cause, redis.exceptions.RedisError):
            return cause
    return redis.exceptions.ConnectionError(str(error))


def _lock_name(name: object) -> str:
    if isinstance(name, str):
        return name
    if isinstance(name, (bytes, bytearray, memoryview)):
        return bytes(name).decode("utf-8")
    return str(name)


def _encode(client: Any, token: object) -> bytes:
    """``token`` as redis-py stores it: encoded by the client's encoder."""
    get_encoder = getattr(client, "get_encoder", None) or client.connection_pool.get_encoder
    return bytes(get_encoder().encode(token))


def _lease(
    timeout: Any, mgr: redreentrant.LockManager | redreentrant.asyncio.LockManager
) -> float | None:
    """The lease of an acquire with redis-py's ``timeout``: None (the watchdog) for a
    falsy one, as redis-py's ``SET`` without ``PX``; at least ``mgr.shortest_lease``."""
    if not timeout:
        return None
    if int(timeout * 1000) <= 0:
        raise ResponseError("invalid expire time in 'set' command")
    return max(float(timeout), mgr.shortest_lease)


def _wait(blocking: Any, blocking_timeout: Any, sleep: Any) -> dict[str, Any]:
    """The acquire arguments of redis-py's ``blocking``, ``blocking_timeout`` and
    ``sleep``: redis-py tries every ``sleep`` seconds and gives up when its next try
    would come after ``blocking_timeout``, so it waits the last multiple of ``sleep``
    within ``blocking_timeout`` (none: one try)."""
    if not blocking:
        return {"blocking": False}
    if blocking_timeout is None:
        return {"blocking": True, "timeout": -1}
    wait = float(blocking_timeout)
    if sleep > 0:
        wait = sleep * math.floor(wait / sleep + 1e-9)
    if wait <= 0:
        return {"blocking": False}  # one try
    return {"blocking": True, "timeout": wait}


class RedisPyToken(Owner):
    """The owner of the hold one token has of one name (see :mod:`.owners`)."""

    __slots__ = ()


class _ThreadLocal(threading.local):
    """Each thread's token: None in a thread that has none (redis-py's ``local`` has no
    ``token`` there, so its ``owned()`` and ``release()`` raise ``AttributeError``)."""

    token: bytes | None = None


class _Common:
    """What the sync and the asyncio lock share: redis-py's constructor and attributes,
    and the bodies of their methods (see ._steps); each flavour gives ``_manager``, its
    shared manager of the client's server, and ``_logger``, redis-py's logger."""

    _logger: ClassVar[logging.Logger]

    def __init__(
        self,
        redis: Any,
        name: str | bytes | memoryview,
        timeout: float | None = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
    ) -> None:
        self.redis = redis
        self.name = name
        self.timeout = timeout
        self.sleep = sleep
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self.local: Any = _ThreadLocal() if self.thread_local else SimpleNamespace(token=None)
        self._key = _lock_name(name)
        self._made()

    if not TYPE_CHECKING and not _RAISE_ON_RELEASE:  # redis-py 5: not an argument
        _init = __init__

        def __init__(
            self, redis, name, timeout=None, sleep=0.1, blocking=True, blocking_timeout=None,
            thread_local=True,
        ):  # fmt: skip
            self._init(redis, name, timeout, sleep, blocking, blocking_timeout, thread_local)

    def _made(self) -> None:
        """The end of the constructor (the sync lock finds its manager there)."""

    def _manager(self) -> Any:
        raise NotImplementedError

    def _error(self, cls: type[LockError], message: str) -> LockError:
        return _error(cls, message, self.name)

    def _check_extend(self, what: str) -> None:
        if self.local.token is None:
            raise self._error(LockError, f"Cannot {what} an unlocked lock")
        if self.timeout is None:
            raise self._error(LockError, f"Cannot {what} a lock with no timeout")

    def _not_owned(self, what: str = "release") -> LockError:
        return self._error(LockNotOwnedError, f"Cannot {what} a lock that's no longer owned")

    def _entered(self, acquired: bool) -> None:
        """``with``'s check of its acquire."""
        if not acquired:
            raise self._error(LockError, "Unable to acquire lock within the time specified")

    def _exit_error(self, error: LockError) -> None:
        """``with``'s handling of its release's error."""
        if self.raise_on_release_error:
            raise error
        self._logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    def _owned(self) -> bool:
        token = self.local.token
        if token is None:
            return False
        owner = registry(self._manager()).get((self._key, token))
        return owner is not None and bool(owner.lock.is_owned())

    # -- the bodies of the methods, the same for Lock and AsyncLock (see ._steps) --------

    def _acquire(
        self, blocking: Any, blocking_timeout: Any, sleep: Any, token: object
    ) -> Steps[bool]:
        token_b = uuid.uuid1().hex.encode() if token is None else _encode(self.redis, token)
        wait = _wait(
            self.blocking if blocking is None else blocking,
            self.blocking_timeout if blocking_timeout is None else blocking_timeout,
            self.sleep if sleep is None else sleep,
        )
        mgr = self._manager()
        lease = _lease(self.timeout, mgr)
        owner = RedisPyToken()
        owner.lock = mgr.lock(self._key, owner=owner)
        try:
            got = yield lambda: owner.lock.acquire(lease=lease, **wait)
        except redreentrant.QuorumUnavailableError as error:
            raise _master_error(error) from error
        if not got:
            return False
        self.local.token = token_b
        registry(mgr).add((self._key, token_b), owner)
        return True

    def _locked(self) -> Steps[bool]:
        lock = self._manager().lock(self._key)
        try:
            return bool((yield lock.locked))
        except redreentrant.QuorumUnavailableError as error:
            raise _master_error(error) from error

    def _release(self) -> Steps[None]:
        expected = self.local.token
        if expected is None:
            raise self._error(
                LockError, "Cannot release a lock that's not owned or is already unlocked."
            )
        self.local.token = None
        owner = registry(self._manager()).pop((self._key, expected))
        if owner is None:
            raise self._not_owned()
        valid = owner.lock.is_owned()  # else removed where it is left, and not owned
        try:
            yield owner.lock.release
        except (redreentrant.LockNotOwnedError, redreentrant.LockLostError) as error:
            raise self._not_owned() from error
        except redreentrant.QuorumUnavailableError as error:
            raise _master_error(error) from error
        if not valid:
            raise self._not_owned()

    def _extend(self, seconds: Any, replace: bool, what: str) -> Steps[Literal[True]]:
        """The body of ``extend`` and ``reacquire``: for the owner of this thread's
        token, which holds with a fixed lease; else redis-py's LockNotOwnedError (a
        ``timeout=0`` key has no TTL to extend)."""
        mgr = self._manager()
        owner = registry(mgr).get((self._key, self.local.token))
        if owner is None or not self.timeout or not owner.lock.is_owned():
            raise self._not_owned(what)
        lease = _lease(seconds, mgr) if replace else seconds
        try:
            yield lambda: owner.lock.extend(lease, replace=replace)
        except (redreentrant.LockNotOwnedError, redreentrant.LockLostError) as error:
            raise self._not_owned(what) from error
        except redreentrant.QuorumUnavailableError as error:
            raise _master_error(error) from error
        return True


class Lock(_Common):
    """redis-py's ``redis.lock.Lock`` on a redreentrant manager (see the module)."""

    _logger = logging.getLogger("redis.lock")

    def _made(self) -> None:
        self._mgr = sync_manager([self.redis])

    def _manager(self) -> redreentrant.LockManager:
        return self._mgr

    def __enter__(self) -> Lock:
        self._entered(self.acquire())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockError as error:
            self._exit_error(error)

    def acquire(
        self,
        sleep: float | None = None,
        blocking: bool | None = None,
        blocking_timeout: float | None = None,
        token: str | bytes | None = None,
    ) -> bool:
        """Take the lock with a new token (or ``token``); True once held, False when
        the wait ran out first (``blocking=False``: at once). The wait is redis-py's (see
        the module), woken rather than polled."""
        return run(self._acquire(blocking, blocking_timeout, sleep, token))

    def locked(self) -> bool:
        """Whether anyone holds the lock (one round trip)."""
        return run(self._locked())

    def owned(self) -> bool:
        """Whether this thread's token (``thread_local=False``: the lock object's)
        holds the lock, with validity left (local: no round trip)."""
        return self._owned()

    def release(self) -> None:
        """Release the token's hold: ``LockError`` if there is no token,
        ``LockNotOwnedError`` if the hold was lost or its lease ran out."""
        run(self._release())

    def extend(self, additional_time: float, replace_ttl: bool = False) -> Literal[True]:
        """Add ``additional_time`` seconds to the fixed lease (``replace_ttl``: make it
        that long from now)."""
        self._check_extend("extend")
        return run(self._extend(additional_time, replace_ttl, "extend"))

    def reacquire(self) -> Literal[True]:
        """Make the fixed lease ``timeout`` long again, from now."""
        self._check_extend("reacquire")
        return run(self._extend(self.timeout, True, "reacquire"))


class AsyncLock(_Common):
    """redis-py's ``redis.asyncio.lock.Lock`` on the redreentrant manager of the
    running event loop (see the module). As redis-py's, ``thread_local=True`` keeps the
    token per thread, so the tasks of one loop share it."""

    _logger = logging.getLogger("redis.asyncio.lock")

    def _manager(self) -> redreentrant.asyncio.LockManager:
        return async_manager([self.redis])

    async def __aenter__(self) -> AsyncLock:
        self._entered(await self.acquire())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await self.release()
        except LockError as error:
            self._exit_error(error)

    async def acquire(
        self,
        blocking: bool | None = None,
        blocking_timeout: float | None = None,
        token: str | bytes | None = None,
    ) -> bool:
        """See :meth:`Lock.acquire`."""
        return await arun(self._acquire(blocking, blocking_timeout, None, token))

    async def locked(self) -> bool:
        """See :meth:`Lock.locked`."""
        return await arun(self._locked())

    async def owned(self) -> bool:
        """See :meth:`Lock.owned`."""
        return self._owned()

    async def release(self) -> None:
        """See :meth:`Lock.release`. Once under way it runs to its end, also when the
        task is cancelled; cancelled before it began, the token stays for a retry."""
        await arun(self._release())

    def extend(self, additional_time: float, replace_ttl: bool = False) -> Awaitable[Literal[True]]:
        """See :meth:`Lock.extend`; as redis-py's, raises ``LockError`` when called
        (not awaited) on a lock without a token or without a timeout."""
        self._check_extend("extend")
        return arun(self._extend(additional_time, replace_ttl, "extend"))

    def reacquire(self) -> Awaitable[Literal[True]]:
        """See :meth:`Lock.reacquire` (and :meth:`extend` for when it raises)."""
        self._check_extend("reacquire")
        return arun(self._extend(self.timeout, True, "reacquire"))
