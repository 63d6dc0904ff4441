"""python-redis-lock 4.0.1 (``redis_lock``) on redreentrant: switching is an import change,
``from redreentrant.compat import redis_lock`` for ``import redis_lock``.

``Lock(redis_client, name, expire=None, id=None, auto_renewal=False, strict=True,
signal_expire=1000, blocking=True)`` with ``acquire``, ``release``, ``extend``,
``locked``, ``reset``, ``get_owner_id``, ``id`` and ``with``; ``reset_all``; the
library's exceptions, messages, return values, and its log messages on its loggers
(``redis_lock.acquire``, ``redis_lock.release``). The library's parameters map so:

- ``redis_client``: a quorum of one master, that server's shared manager
  (:func:`redreentrant.compat.managers.sync_manager`), made at the first call that needs
  it, with a client of its own of the same settings (closing ``redis_client`` leaves it
  alone); ``strict`` checks for a ``redis.StrictRedis`` as the library does.
- ``id``: the owner. The Lock objects of one id in a process are one owner: any of them
  releases or extends what another took, and ``acquire`` by an owner that holds the
  lock raises ``AlreadyAcquired`` (not reentrant). Whether it holds it is the server's
  answer, as the library's ``GET``: once the server lost the key (``FLUSHALL``, a
  restart), the lock is free and any Lock object of the id takes it again. An id does
  not reach other processes (there, even the same id is another owner).
- ``expire=None`` (the library's "never expires"): renewed by the watchdog with the
  manager's lease (30 s). Held until released or reset, also once its Lock objects are
  dropped, as in the library; freed within 30 s after the process dies.
- ``expire=N`` (whole seconds: the library truncates): a fixed lease of N s, never
  renewed; ``extend(e)`` sets it to ``e`` s from now (as the library's ``EXPIRE``).
- ``auto_renewal=True``: renewed by the watchdog with the manager's lease (30 s, every
  10 s), not ``expire`` every ``expire * 2/3`` by a thread per lock; freed within 30 s
  after the process dies, at once when the last Lock object of its id is collected;
  ``extend()`` only checks that it is held.
- ``timeout`` (whole seconds; None or 0: no limit) bounds the whole wait (the
  library's starts again at each wake-up it loses). Waiters are woken without polling, one per
  release, by a pub/sub message from the master (no ``BLPOP`` on a signal list:
  ``signal_expire`` is accepted and unused).
- ``reset()``: ``force_unlock`` of the name, which wakes a waiter. ``reset_all(client)``:
  ``force_unlock`` of every redreentrant plain lock (``mgr.lock``) on that server, found
  by a ``SCAN`` of redreentrant's keys: this adapter's and any other program's.
- ``get_owner_id()``: the holder's id if it is a Lock of this process, else the holder's
  redreentrant owner id (``host:pid:uuid:token``); None when the lock is free.

What differs besides: the keys are redreentrant's (``redreentrant:v1:{name}``, not
``lock:name``/``lock-signal:name``), so this adapter and the library do not exclude each
other; a grant counts only with validity left on a monotonic clock, and a failed one is
undone; a master that fails raises :class:`redreentrant.QuorumUnavailableError`; a
release may defer its wake-up by 5 ms (turns), which a process that ends by
``os._exit()`` right after a release never sends: its waiters then sleep until their
registration ends, at most a lease.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from base64 import b64encode
from logging import getLogger
from types import TracebackType
from typing import Any

import redis

from redreentrant import Lock as _CoreLock
from redreentrant import LockLostError, LockManager, LockNotOwnedError, QuorumUnavailableError
from redreentrant.compat.managers import master_key, sync_manager
from redreentrant.compat.owners import Registry

__all__ = [
    "AlreadyAcquired",
    "AlreadyStarted",
    "InvalidTimeout",
    "Lock",
    "NotAcquired",
    "NotExpirable",
    "TimeoutNotUsable",
    "TimeoutTooLarge",
    "reset_all",
]

# The library's loggers, so that a program's logging configuration still applies.
logger_for_acquire = getLogger("redis_lock.acquire")
logger_for_release = getLogger("redis_lock.release")


class AlreadyAcquired(RuntimeError):
    pass


class NotAcquired(RuntimeError):
    pass


class AlreadyStarted(RuntimeError):
    pass


class TimeoutNotUsable(RuntimeError):
    pass


class InvalidTimeout(RuntimeError):
    pass


class TimeoutTooLarge(RuntimeError):
    pass


class NotExpirable(RuntimeError):
    pass


# How a hold was taken: a fixed lease (expire=N), renewed for auto_renewal, renewed for
# "never expires" (expire=None).
_FIXED, _RENEWED, _FOREVER = "fixed", "renewed", "forever"
_Key = tuple[LockManager, str]


def _whole_seconds(expire: Any) -> int:
    """The library's ``expire``: whole seconds (truncated), not negative."""
    seconds = int(expire)
    if seconds < 0:
        raise ValueError("A negative expire is not acceptable.")
    return seconds


class _Owner:
    """The owner of the holds of every Lock object of one id in this process."""

    __slots__ = ("__weakref__", "busy", "cond", "holds", "id")

    def __init__(self, lock_id: str) -> None:
        self.id = lock_id
        self.cond = threading.Condition(threading.Lock())
        #: (manager, name) -> how the hold was taken
        self.holds: dict[_Key, str] = {}
        #: (manager, name) of an acquire, release or extend under way (one at a time)
        self.busy: set[_Key] = set()

    def done(self, key: _Key, mode: str | None = None, gone: bool = True) -> None:
        """The call under way on ``key`` (in ``busy``) ended: the hold was taken
        (``mode``: how), or else is gone if ``gone``; wakes the calls waiting."""
        with self.cond:
            self.busy.discard(key)
            if mode is not None:
                self.holds[key] = mode
                if mode == _FOREVER:
                    with _registry:
                        _pinned.add(self)
            elif gone and self.holds.pop(key, None) == _FOREVER:  # its last such: unpinned
                with _registry:
                    if _FOREVER not in self.holds.values():
                        _pinned.discard(self)
            self.cond.notify_all()


_registry = threading.Lock()
#: every Lock object's owner, by id (weak: the last Lock object of an id ends its holds)
_owners: Registry[_Owner] = Registry()
# Owners that hold a lock taken with expire=None: kept alive, as the library's key stays.
_pinned: set[_Owner] = set()


# A client of each server with a pool of its own, for the manager: a program that closes
# its client (which disconnects the connections of its pool in use) leaves it alone.
_clients: dict[tuple[object, ...], Any] = {}


def _manager_client(client: Any) -> Any:
    """The client of ``client``'s server that the shared manager is given: the same
    class and connection settings, another pool (``client`` itself where its pool cannot
    be copied, e.g. Sentinel's)."""
    key = master_key(client)
    with _registry:
        own = _clients.get(key)
        if own is None:
            pool: Any = getattr(client, "connection_pool", None)
            try:
                copy = type(pool)(connection_class=pool.connection_class, **pool.connection_kwargs)
                own = _clients[key] = type(client)(connection_pool=copy)
            except Exception:
                return client
        return own


def _after_fork_in_child() -> None:
    """A forked child's managers hold nothing, and no other thread runs here."""
    global _registry
    _registry = threading.Lock()
    _pinned.clear()
    _owners.forked()
    for owner in _owners.values():
        owner.cond = threading.Condition(threading.Lock())
        owner.busy.clear()
        owner.holds.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Lock:
    """A lock named ``name`` on the server of ``redis_client``, owned by its ``id``, not
    reentrant: python-redis-lock's ``Lock`` (see the module's docstring for how its
    parameters map onto redreentrant)."""

    blocking: bool

    def __init__(
        self,
        redis_client: Any,
        name: str,
        expire: Any = None,
        id: str | bytes | None = None,
        auto_renewal: bool = False,
        strict: bool = True,
        signal_expire: int = 1000,
        blocking: bool = True,
    ) -> None:
        if strict and not isinstance(redis_client, redis.StrictRedis):
            raise ValueError(
                "redis_client must be instance of StrictRedis. "
                "Use strict=False if you know what you're doing."
            )
        if auto_renewal and expire is None:
            raise ValueError("Expire may not be None when auto_renewal is set")
        self._client = redis_client
        #: the lease in whole seconds (None: renewed by the watchdog)
        self._expire = _whole_seconds(expire) if expire else None
        if auto_renewal and expire is None:  # expire=0: the library fails here too
            raise TypeError("float() argument must be a string or a real number, not 'NoneType'")
        if id is None:
            self._id = b64encode(os.urandom(18)).decode("ascii")
        elif isinstance(id, bytes):
            try:
                self._id = id.decode("ascii")
            except UnicodeDecodeError:
                self._id = b64encode(id).decode("ascii")
        elif isinstance(id, str):
            self._id = id
        else:
            raise TypeError(f"Incorrect type for `id`. Must be bytes/str not {type(id)}.")
        #: the library's name of the lock, in messages and logs (not a key here)
        self._label = "lock:" + name
        self._lock_name = name
        self._auto_renewal = bool(auto_renewal)
        self.blocking = blocking
        self._owner = _owners.setdefault(self._id, lambda: _Owner(self._id))

    @property
    def id(self) -> str:
        return self._id

    def _view(self) -> tuple[LockManager, _CoreLock, _Key]:
        """The manager, this id's lock of the name on it, and the hold's key."""
        mgr = sync_manager([_manager_client(self._client)])
        return mgr, mgr.lock(self._lock_name, owner=self._owner), (mgr, self._lock_name)

    def _not_acquired(self) -> NotAcquired:
        return NotAcquired(f"Lock({self._label}) is not acquired or it already expired.")

    def acquire(self, blocking: bool = True, timeout: Any = None) -> bool:
        """Take the lock: True once held; False if ``blocking=False`` found it held, or
        ``timeout`` (whole seconds; None or 0: no limit) passed. ``AlreadyAcquired`` if
        this lock's id holds it on the server."""
        logger_for_acquire.debug("Acquiring Lock(%r) ...", self._label)
        mgr, lock, key = self._view()
        if self._held(mgr, lock, key):
            raise AlreadyAcquired("Already acquired from this Lock instance.")
        if not blocking and timeout is not None:
            raise TimeoutNotUsable("Timeout cannot be used if blocking=False")
        if timeout:
            timeout = int(timeout)
            if timeout < 0:
                raise InvalidTimeout(f"Timeout ({timeout}) cannot be less than or equal to 0")
            if self._expire and not self._auto_renewal and timeout > self._expire:
                raise TimeoutTooLarge(
                    f"Timeout ({timeout}) cannot be greater than expire ({self._expire})"
                )
        deadline = time.monotonic() + timeout if timeout else None
        owner = self._owner
        with owner.cond:
            # Held (or being taken) by this id through another thread: the library
            # waits for its own lock as for anyone's.
            while key in owner.busy or lock.is_owned():
                left = None if deadline is None else deadline - time.monotonic()
                if not blocking:
                    logger_for_acquire.warning("Failed to acquire Lock(%r).", self._label)
                    return False
                if left is not None and left <= 0:
                    return False
                # Woken by its release, or when its fixed lease ends.
                held_for = lock.remaining() if key not in owner.busy else None
                waits = [t for t in (left, held_for) if t is not None]
                owner.cond.wait(max(min(waits), 0.001) if waits else None)
            owner.busy.add(key)
        if self._expire is not None and not self._auto_renewal:
            lease: float | None = float(self._expire)
            mode = _FIXED
        else:
            lease, mode = None, (_RENEWED if self._auto_renewal else _FOREVER)
        acquired = False
        try:
            _drop(lock, stale=True)
            wait = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            acquired = lock.acquire(blocking=bool(blocking), timeout=wait, lease=lease)
        finally:
            owner.done(key, mode if acquired else None)
        if acquired:
            logger_for_acquire.info("Acquired Lock(%r).", self._label)
        elif not blocking:
            logger_for_acquire.warning("Failed to acquire Lock(%r).", self._label)
        return acquired

    def _held(self, mgr: LockManager, lock: _CoreLock, key: _Key) -> bool:
        """Whether this id holds the lock, as the library's ``GET`` of its key tells:
        held here and on the server (one round). A hold here that the server lost
        (``FLUSHALL``, a restart) is dropped: the lock is free, as the library's key is
        gone."""
        owner = self._owner
        holder = mgr.owner_id(owner)
        if not lock.is_owned():
            return False
        if holder in _holders(mgr, self._lock_name, "acquire"):
            return True
        # Checked again while this id's other calls wait: another thread of the id may
        # have dropped the hold and taken the lock anew meanwhile.
        with owner.cond:
            if key in owner.busy or not lock.is_owned():
                return False  # another call of this id is at it: acquire waits for it
            owner.busy.add(key)
        try:
            if holder in _holders(mgr, self._lock_name, "acquire"):
                return True
            _drop(lock)
            return False
        finally:
            owner.done(key, gone=lock.hold_count == 0)

    def extend(self, expire: Any = None) -> None:
        """Set the fixed lease to ``expire`` seconds from now (default: the ``expire``
        given to the Lock). ``NotAcquired`` if this id does not hold the lock,
        ``NotExpirable`` if it was taken with ``expire=None``; on an ``auto_renewal``
        lock, only the check that it is held (the watchdog renews it)."""
        if expire:
            expire = _whole_seconds(expire)
        elif self._expire is not None:
            expire = self._expire
        else:
            raise TypeError(
                "To extend a lock 'expire' must be provided as an argument to extend() "
                "method or at initialization time."
            )
        _, lock, key = self._view()
        owner = self._owner
        not_acquired = f"Lock {self._label} is not acquired or it already expired."
        with owner.cond:
            if key in owner.busy or not lock.is_owned():
                raise NotAcquired(not_acquired)
            mode = owner.holds.get(key, _FIXED)
            if mode == _FOREVER:
                raise NotExpirable(f"Lock {self._label} has no assigned expiration time")
            if mode == _RENEWED:
                return
            owner.busy.add(key)
        try:
            if expire == 0:  # what the library's EXPIRE 0 does: the lock ends now
                lock.release()
            else:
                lock.extend(float(expire), replace=True)
        except (LockLostError, LockNotOwnedError):
            raise NotAcquired(not_acquired) from None
        finally:
            owner.done(key, gone=lock.hold_count == 0)

    def release(self) -> None:
        """Release the lock this id holds (whichever Lock object of the id took it);
        ``NotAcquired`` if it does not hold it, or its lease ran out."""
        logger_for_release.debug("Releasing Lock(%r).", self._label)
        _, lock, key = self._view()
        owner = self._owner
        with owner.cond:
            if key in owner.busy:  # being taken: not held yet
                raise self._not_acquired()
            owner.busy.add(key)
        try:
            lock.release()
        except (LockLostError, LockNotOwnedError):
            raise self._not_acquired() from None
        finally:
            owner.done(key, gone=lock.hold_count == 0)

    def locked(self) -> bool:
        """Whether anyone holds the lock (one round)."""
        return self._view()[1].locked()

    def reset(self) -> None:
        """Force-unlock the lock, whoever holds it, and wake a waiter."""
        _force_unlock(self._view()[0], {self._lock_name})

    def get_owner_id(self) -> str | None:
        """The id of the lock's holder (see the module's docstring), None if free."""
        mgr = self._view()[0]
        holders = _holders(mgr, self._lock_name, "get_owner_id")
        if not holders:
            return None
        owners = _owners.values()
        return next((o.id for o in owners if mgr.owner_id(o) == holders[0]), holders[0])

    def __enter__(self) -> Lock:
        if not self.acquire(blocking=self.blocking):
            if self.blocking:
                raise AssertionError(
                    f"Lock({self._label}) wasn't acquired, but blocking=True was used!"
                )
            raise self._not_acquired()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        self.release()


def _holders(mgr: LockManager, name: str, operation: str) -> list[str]:
    """The redreentrant owner ids that hold the plain lock ``name`` on the server (one
    round; ``operation`` names the caller in a :class:`QuorumUnavailableError`)."""
    holders: list[str] = []
    for view in mgr.inspect(name):
        if view.error is not None:
            errors = {view.master: ConnectionError(view.error)}
            raise QuorumUnavailableError(operation, errors, mgr.quorum)
        holders += [h for lv in view.locks if lv.kind == "lock" for h in lv.holders]
    return holders


def _force_unlock(mgr: LockManager, names: set[str]) -> None:
    """Force-unlock ``names``; then the owners of this process that held them no longer
    do (their holds are marked under way meanwhile, so that they neither take nor
    release them, and a waiter that takes one after the force-unlock keeps it)."""
    owners = _owners.values()
    held: list[tuple[_Owner, _Key]] = []
    for owner in owners:
        with owner.cond:
            for key in list(owner.holds):
                if key[0] is mgr and key[1] in names and key not in owner.busy:
                    owner.busy.add(key)
                    held.append((owner, key))
    try:
        for name in sorted(names):
            mgr.lock(name).force_unlock()
    except BaseException:
        for owner, key in held:
            owner.done(key, gone=False)
        raise
    for owner, key in held:
        try:
            _drop(mgr.lock(key[1], owner=owner))
        finally:
            owner.done(key)


def _drop(lock: _CoreLock, stale: bool = False) -> None:
    """Forget every hold of ``lock``'s owner, whether or not the masters still have it
    (``stale``: only a hold no longer valid, a fixed lease that ran out or a lost one;
    the library's key is gone then, and a new acquire is a first one, not a re-entry)."""
    while lock.hold_count > 0 and not (stale and lock.is_owned()):
        with contextlib.suppress(LockLostError, LockNotOwnedError):
            lock.release()


def reset_all(redis_client: Any) -> None:
    """Force-unlock every redreentrant plain lock on the server of ``redis_client``
    (found by ``LockManager.names()``, a ``SCAN``), whoever holds it, and wake a waiter
    of each."""
    mgr = sync_manager([_manager_client(redis_client)])
    _force_unlock(mgr, {name for name, kinds in mgr.names().items() if "lock" in kinds})
