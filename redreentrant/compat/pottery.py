"""pottery's ``Redlock``, ``AIORedlock`` and ``synchronize`` (pottery 3.0.1) on
redreentrant: ``from redreentrant.compat.pottery import Redlock`` in place of ``from
pottery import Redlock``. pottery's lock exceptions are defined here, with its names,
fields and hierarchy (``PrimitiveError`` is not a ``PotteryError``, as in pottery).

How pottery's parameters map:

- ``masters=`` (``redis.Redis`` clients; ``redis.asyncio.Redis`` for ``AIORedlock``) are
  the quorum, through the manager the adapters share
  (:func:`~redreentrant.compat.managers.sync_manager`, or
  :func:`~redreentrant.compat.managers.async_manager` per event loop); they must be
  distinct servers (two databases of one server are refused as one server). Without
  ``masters=``, ``Redlock`` uses ``$REDIS_URL`` (default ``redis://localhost:6379/0``),
  as pottery does.
- ``key=`` is the lock's name (redreentrant keeps it under ``redreentrant:v1:{key}``,
  never pottery's ``redlock:<key>``); ``.key`` reads ``redlock:<key>``, as pottery's.
- ``auto_release_time=`` is each acquire's fixed lease (never renewed: pottery has no
  lease that never expires, so no watchdog is involved). A lease shorter than the
  shortest honoured (about 4 ms) is never granted, as pottery never grants one its
  drift allowance eats: ``acquire(blocking=False)`` returns False, a blocking acquire
  with a timeout waits it out and returns False, and one without a timeout (which
  pottery would retry forever) raises ``ValueError``.
- ``extend()`` sets the lease to ``auto_release_time`` from now (pottery's ``PEXPIRE``:
  ``lock.extend(auto_release_time, replace=True)``), at most ``num_extensions`` times
  per acquire, then ``TooManyExtensions``.
- ``raise_on_redis_errors``: when too many masters fail for a quorum
  (``QuorumUnavailableError``), raise ``QuorumIsImpossible``; without it, ``acquire``
  returns False (a blocking one tries again after pottery's random pause, up to 0.2 s,
  until its timeout), ``extend`` raises ``ExtendUnlockedLock`` and ``release``
  ``ReleaseUnlockedLock``, as in pottery.

As pottery: the owner is the ``Redlock`` object, and each acquire is a new hold, so
the lock is not reentrant: a second acquire by the holder fails as under contention
(``blocking=False``: False; blocking: it waits for its own lease to run out), and from
then on the object no longer owns its earlier hold (``release()`` raises
``ReleaseUnlockedLock``, ``locked()`` returns 0); that hold runs out with its lease.
``locked()`` is the validity left, in seconds, of *this* object's hold (0 if none);
a blocking ``acquire(timeout=t)`` with ``t <= 0`` returns False without trying, and
``acquire(blocking=False, timeout=t)`` raises ``ValueError``.

As redreentrant, where pottery is unsafe or costly: a grant counts on a quorum with
validity left (the lease less the drift allowance and the round's time, on the monotonic
clock), and so does an extension (pottery counts a quorum of ``PEXPIRE`` replies,
however long they took); a quorum is impossible once more than ``N - quorum`` masters
failed (pottery waits for more than ``N // 2``: one more for an even ``N``); a
blocking acquire sleeps until a release wakes it or the holder's lease runs out (pottery
polls every 0-200 ms); ``locked()`` reads this object's validity locally, with no round
trip (pottery re-reads the TTLs); and the rounds run on the shared manager's
connections (pottery starts a thread pool per call).
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Literal, TypeVar, cast

import redis

from redreentrant.compat import managers
from redreentrant.compat._steps import Steps, arun, run
from redreentrant.compat.owners import Owner
from redreentrant.errors import (
    LockLostError,
    LockNotOwnedError,
    QuorumUnavailableError,
)

__all__ = [
    "AIORedlock",
    "ExtendUnlockedLock",
    "PotteryError",
    "PrimitiveError",
    "QuorumIsImpossible",
    "QuorumNotAchieved",
    "Redlock",
    "ReleaseUnlockedLock",
    "TooManyExtensions",
    "synchronize",
]

F = TypeVar("F", bound=Callable[..., Any])

# pottery's defaults (also its classes' attributes of these names)
_AUTO_RELEASE_TIME: float = 10
_NUM_EXTENSIONS = 3
_RETRY_DELAY = 0.2


# -- pottery's exceptions (pottery.exceptions) ----------------------------------------------


@dataclass
class PotteryError(Exception):
    """Base exception class for Pottery containers (not raised by the locks)."""

    redis: Any
    key: str | None = None


@dataclass
class PrimitiveError(Exception):
    """Base exception class for distributed primitives."""

    key: str
    masters: Iterable[Any]
    redis_errors: Iterable[BaseException] = ()


class QuorumNotAchieved(PrimitiveError, RuntimeError):
    """Consensus-based algorithm could not achieve quorum."""


class TooManyExtensions(PrimitiveError, RuntimeError):
    """Redlock has been extended too many times."""


class ExtendUnlockedLock(PrimitiveError, RuntimeError):
    """Attempting to extend an unlocked Redlock."""


class ReleaseUnlockedLock(PrimitiveError, RuntimeError):
    """Attempting to release an unlocked Redlock."""


class QuorumIsImpossible(PrimitiveError, RuntimeError):
    """Too many Redis masters threw RedisErrors; quorum can not be achieved."""


# -- what the two flavours share -------------------------------------------------------------

_default: list[redis.Redis] = []
_default_lock = threading.Lock()


def _default_masters() -> frozenset[Any]:
    """pottery's default masters: one client of ``$REDIS_URL``, made on first use."""
    with _default_lock:
        if not _default:
            url = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
            _default.append(redis.Redis.from_url(url, socket_timeout=1))
        return frozenset(_default)


def _ordered(masters: Iterable[Any]) -> list[Any]:
    """The masters in one order whatever the set's iteration order, so that every
    adapter of one set of masters finds the same shared manager."""
    return sorted(masters, key=lambda m: repr(managers.master_key(m)))


def _too_short(lease: object, shortest: float) -> bool:
    """Whether ``lease`` is a positive number below ``shortest``, the shortest lease an
    acquire honours (``mgr.shortest_lease``)."""
    if isinstance(lease, bool) or not isinstance(lease, (int, float)):
        return False
    return 0 < lease < shortest


def _no_wait(blocking: bool, timeout: float) -> bool:
    """pottery's rules for ``blocking`` and ``timeout``: True when a blocking acquire
    returns False without trying (its loop runs while the time waited is below a
    ``timeout`` other than -1); ``ValueError`` for a timeout on a non-blocking call."""
    if not blocking:
        if timeout != -1:
            raise ValueError("can't specify a timeout for a non-blocking call")
        return False
    return timeout != -1 and timeout <= 0


class _Owner(Owner):
    """The owner of one acquire's hold (pottery makes a new id per acquire)."""

    __slots__ = ()


class _Base:
    """Both flavours: pottery's constructor and state, and the bodies of their methods
    (see ._steps); each flavour gives its shared manager (``_manager``), its sleep
    (``_sleep``) and what it does without masters (``_no_masters``)."""

    __slots__ = (
        "_extension_num",
        "_name",
        "_owner",
        "auto_release_time",
        "context_manager_blocking",
        "context_manager_timeout",
        "masters",
        "num_extensions",
        "raise_on_redis_errors",
    )

    _KEY_PREFIX: ClassVar[str] = "redlock"
    _AUTO_RELEASE_TIME: ClassVar[float] = _AUTO_RELEASE_TIME
    _RETRY_DELAY: ClassVar[float] = _RETRY_DELAY
    _NUM_EXTENSIONS: ClassVar[int] = _NUM_EXTENSIONS

    def __init__(
        self,
        *,
        key: str,
        masters: Iterable[Any],
        raise_on_redis_errors: bool = False,
        auto_release_time: float = _AUTO_RELEASE_TIME,
        num_extensions: int = _NUM_EXTENSIONS,
        context_manager_blocking: bool = True,
        context_manager_timeout: float = -1,
    ) -> None:
        self.masters = frozenset(masters) or self._no_masters()
        _no_wait(context_manager_blocking, context_manager_timeout)  # ValueError or none
        self._name = key
        self.raise_on_redis_errors = raise_on_redis_errors
        self.auto_release_time = auto_release_time
        self.num_extensions = num_extensions
        self.context_manager_blocking = context_manager_blocking
        self.context_manager_timeout = context_manager_timeout
        #: the owner of the last acquire, its redreentrant lock in ``lock``
        self._owner: _Owner | None = None
        self._extension_num = 0

    # -- what each flavour gives ----------------------------------------------------------

    @staticmethod
    def _no_masters() -> frozenset[Any]:
        raise NotImplementedError

    @staticmethod
    def _manager(masters: list[Any]) -> Any:
        raise NotImplementedError

    @staticmethod
    def _sleep(seconds: float, /) -> Any:
        raise NotImplementedError

    @property
    def key(self) -> str:
        """``redlock:<key>``, as pottery's (the lock's name is ``<key>``)."""
        return f"{self._KEY_PREFIX}:{self._name}"

    @key.setter
    def key(self, value: str) -> None:
        self._name = value

    def _quorum_errors(
        self, error: QuorumUnavailableError, raise_on_redis_errors: bool | None
    ) -> list[BaseException]:
        """The masters' errors; ``QuorumIsImpossible`` if asked to raise it."""
        errors = list(error.errors.values())
        if raise_on_redis_errors is None:
            raise_on_redis_errors = self.raise_on_redis_errors
        if raise_on_redis_errors:
            raise QuorumIsImpossible(self.key, self.masters, redis_errors=errors) from error
        return errors

    def __repr__(self) -> str:
        return f"<{type(self).__qualname__} key={self.key}>"

    def _enter(self) -> Steps[None]:
        """``with``'s acquire (not ``acquire()``, as pottery's): ``QuorumNotAchieved`` if
        the lock was not obtained."""
        blocking, timeout = self.context_manager_blocking, self.context_manager_timeout
        if not (yield from self._acquire(blocking, timeout, None)):
            raise QuorumNotAchieved(self.key, self.masters)

    # -- the bodies of the methods, the same for Redlock and AIORedlock (see ._steps) ----

    def _acquire(
        self, blocking: bool, timeout: float, raise_on_redis_errors: bool | None
    ) -> Steps[bool]:
        if _no_wait(blocking, timeout):
            return False
        lease = self.auto_release_time
        mgr = self._manager(_ordered(self.masters))
        short = _too_short(lease, mgr.shortest_lease)
        if short and blocking and timeout == -1:
            raise ValueError(
                f"auto_release_time {lease!r} is shorter than the shortest lease honoured:"
                " no acquire can succeed (pottery would try forever)"
            )
        # A new owner for a new acquire; the hold of the one before, if any, is left to
        # run out with its lease (its owner is dropped: the manager forgets it).
        owner = self._owner = _Owner()
        lock = owner.lock = mgr.lock(self._name, owner=owner)
        self._extension_num = 0
        if short:
            if blocking:
                yield lambda: self._sleep(timeout)
            return False
        deadline = math.inf if timeout == -1 else time.monotonic() + timeout
        while True:
            wait = -1 if timeout == -1 else max(deadline - time.monotonic(), 0.0)
            try:
                return bool((yield functools.partial(lock.acquire, bool(blocking), wait, lease)))
            except QuorumUnavailableError as error:
                self._quorum_errors(error, raise_on_redis_errors)
                left = deadline - time.monotonic()
                if not blocking or left <= 0:
                    return False
                pause = min(random.uniform(0, self._RETRY_DELAY), left)  # pottery's retry delay
                yield functools.partial(self._sleep, pause)

    def _locked(self) -> float:
        left = 0.0 if self._owner is None else self._owner.lock.remaining()
        return left if left > 0 else 0

    def _extend(self, raise_on_redis_errors: bool | None) -> Steps[None]:
        if self._extension_num >= self.num_extensions:
            raise TooManyExtensions(self.key, self.masters)
        errors: list[BaseException] = []
        if self._owner is not None:
            lock = self._owner.lock
            try:
                yield lambda: lock.extend(self.auto_release_time, replace=True)
            except QuorumUnavailableError as error:
                errors = self._quorum_errors(error, raise_on_redis_errors)
            except (LockNotOwnedError, LockLostError):
                pass
            else:
                self._extension_num += 1
                return
        raise ExtendUnlockedLock(self.key, self.masters, redis_errors=errors)

    def _release(self, raise_on_redis_errors: bool | None) -> Steps[None]:
        errors: list[BaseException] = []
        if self._owner is not None:
            try:
                yield self._owner.lock.release
            except QuorumUnavailableError as error:
                errors = self._quorum_errors(error, raise_on_redis_errors)
            except (LockNotOwnedError, LockLostError):
                pass
            else:
                return
        raise ReleaseUnlockedLock(self.key, self.masters, redis_errors=errors)


# -- Redlock ------------------------------------------------------------------------------


class Redlock(_Base):
    """pottery's ``Redlock`` on redreentrant's quorum: a distributed lock, held by this
    object, not reentrant, with a fixed lease of ``auto_release_time`` seconds per
    acquire (see the module's docstring for what maps to what, and what differs).

    ``Redlock(key="printer", masters={r1, r2, r3}, auto_release_time=10)``, then
    ``acquire(blocking=True, timeout=-1)`` (True or False), ``locked()`` (seconds left
    on this object's hold, 0 if none), ``extend()``, ``release()``, or ``with lock:``
    (``QuorumNotAchieved`` if not acquired under ``context_manager_blocking`` and
    ``context_manager_timeout``).
    """

    __slots__ = ()

    # _Base's constructor, but masters= is optional: pottery's default masters
    __init__ = functools.partialmethod(_Base.__init__, masters=frozenset())
    _no_masters = staticmethod(_default_masters)
    _manager = staticmethod(managers.sync_manager)
    _sleep = staticmethod(time.sleep)

    def acquire(
        self,
        *,
        blocking: bool = True,
        timeout: float = -1,
        raise_on_redis_errors: bool | None = None,
    ) -> bool:
        """Lock the lock: True once held, False if not obtained (``blocking=False``:
        one try; ``timeout``: seconds to wait, -1 for no limit). Each acquire is a new
        hold, also by an object that holds the lock already (which then waits for its
        own lease to run out). ``QuorumIsImpossible`` when too many masters failed and
        ``raise_on_redis_errors`` (else False, or another try after a pause)."""
        return run(self._acquire(blocking, timeout, raise_on_redis_errors))

    def locked(self, *, raise_on_redis_errors: bool | None = None) -> float:
        """Seconds of validity left on this object's hold (0 if it holds none): local,
        no round trip."""
        return self._locked()

    def extend(self, *, raise_on_redis_errors: bool | None = None) -> None:
        """Set this object's lease to ``auto_release_time`` from now, on a quorum:
        ``TooManyExtensions`` after ``num_extensions`` extensions of one acquire,
        ``ExtendUnlockedLock`` if this object does not hold the lock."""
        run(self._extend(raise_on_redis_errors))

    def release(self, *, raise_on_redis_errors: bool | None = None) -> None:
        """Unlock the lock: ``ReleaseUnlockedLock`` if this object does not hold it
        (never acquired, released already, or its lease ran out)."""
        run(self._release(raise_on_redis_errors))

    def __enter__(self) -> Redlock:
        run(self._enter())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        self.release()
        return False


def synchronize(
    *,
    key: str,
    masters: Iterable[Any] = frozenset(),
    raise_on_redis_errors: bool = False,
    auto_release_time: float = _AUTO_RELEASE_TIME,
    blocking: bool = True,
    timeout: float = -1,
) -> Callable[[F], F]:
    """pottery's decorator: one call of the function at a time, under a new
    :class:`Redlock` per call (``with`` it: ``QuorumNotAchieved`` if not acquired under
    ``blocking`` and ``timeout``). Not reentrant: a call from within a call waits for the
    outer call's lease to run out."""
    chosen = frozenset(masters)

    def decorator(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Redlock(
                key=key,
                masters=chosen,
                raise_on_redis_errors=raise_on_redis_errors,
                auto_release_time=auto_release_time,
                context_manager_blocking=blocking,
                context_manager_timeout=timeout,
            ):
                return func(*args, **kwargs)

        return cast(F, wrapper)

    return decorator


# -- AIORedlock ---------------------------------------------------------------------------


class AIORedlock(_Base):
    """pottery's ``AIORedlock``: :class:`Redlock` for asyncio, on the asyncio manager
    the adapters share on the running event loop; its methods are coroutines, and
    ``async with lock:`` takes and releases it. Any task may release what another
    task of this object acquired (the owner is the object)."""

    __slots__ = ()

    _manager = staticmethod(managers.async_manager)
    _sleep = staticmethod(asyncio.sleep)

    @staticmethod
    def _no_masters() -> frozenset[Any]:
        raise ValueError("AIORedlock needs masters= (redis.asyncio.Redis clients)")

    async def acquire(
        self,
        *,
        blocking: bool = True,
        timeout: float = -1,
        raise_on_redis_errors: bool | None = None,
    ) -> bool:
        """See :meth:`Redlock.acquire`."""
        return await arun(self._acquire(blocking, timeout, raise_on_redis_errors))

    async def locked(self, *, raise_on_redis_errors: bool | None = None) -> float:
        """See :meth:`Redlock.locked`."""
        return self._locked()

    async def extend(self, *, raise_on_redis_errors: bool | None = None) -> None:
        """See :meth:`Redlock.extend`."""
        await arun(self._extend(raise_on_redis_errors))

    async def release(self, *, raise_on_redis_errors: bool | None = None) -> None:
        """See :meth:`Redlock.release`."""
        await arun(self._release(raise_on_redis_errors))

    async def __aenter__(self) -> AIORedlock:
        await arun(self._enter())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.release()
