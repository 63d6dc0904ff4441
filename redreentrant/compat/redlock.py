"""redlock-py's ``Redlock`` (module ``redlock``, 1.0.8) on redreentrant: replace
``from redlock import Redlock`` with ``from redreentrant.compat.redlock import Redlock``.

``Redlock(connection_list, retry_count=None, retry_delay=None)`` takes what redlock-py
takes: dicts of ``redis.StrictRedis`` keyword arguments, URL strings and client
objects; they are the quorum (a majority of them), and they must be distinct servers
(two databases of one server raise ``ValueError``). ``lock(resource, ttl)`` returns a
``Lock(validity, resource, key)`` or ``False``, and ``unlock(lock)`` returns None, as
redlock-py's do. What differs:

- ``ttl`` (an ``int``, milliseconds; anything else raises ``ValueError``) is a fixed
  lease, never renewed. A grant counts only with validity left, judged on a monotonic
  clock (redlock-py reads the wall clock) with the same drift allowance (2 ms plus
  1 % of the ttl): ``validity`` is the milliseconds left. A ttl shorter than the
  shortest lease redreentrant honours (about 4 ms) returns ``False`` at once.
- Not reentrant, as redlock-py: every ``lock()`` call is an owner of its own, so a
  second ``lock()`` of a held resource returns ``False``. Its wait is bounded as
  redlock-py's ``retry_count`` tries ``retry_delay`` seconds apart bound it: at most
  ``retry_count * retry_delay`` seconds, but woken by the release (no polling).
  ``lock()`` retries after ``retry_delay`` only when too many masters fail.
- A minority of failing masters does not fail ``lock()`` (redlock-py raises
  ``MultipleRedlockException`` and keeps the lock); when no quorum answers, ``lock()``
  returns ``False`` (grants undone), and ``unlock()`` raises
  ``MultipleRedlockException`` with the masters' errors.
- ``unlock()`` frees the lock only from this process (it knows the lock by its
  ``key``); an unknown, expired or already released lock is ignored, as redlock-py
  ignores it.
- Keys are redreentrant's (``redreentrant:v1:{resource}``), not ``resource`` itself:
  redlock-py's ``lock_instance``, ``unlock_instance`` and ``unlock_script``, which act
  on its raw keys, are not provided. ``resource`` is a ``str`` (bytes are decoded as
  UTF-8, numbers written as redis-py writes them), not empty.
- ``clock_drift_factor`` is informative: the masters' managers are shared
  (:mod:`redreentrant.compat.managers`) and keep their own drift factor, 0.01.
"""

from __future__ import annotations

import contextlib
import secrets
import string
import time
from collections.abc import Iterable
from typing import Any, Literal, NamedTuple

import redis

import redreentrant
from redreentrant import LockLostError, LockNotOwnedError, QuorumUnavailableError
from redreentrant.compat.managers import sync_manager
from redreentrant.compat.owners import Owner, registry

__all__ = ["CannotObtainLock", "Lock", "MultipleRedlockException", "Redlock"]


class Lock(NamedTuple):
    """A lock ``lock()`` took: its ``validity`` (milliseconds left when granted), the
    ``resource`` as given, and its ``key`` (22 random characters, bytes)."""

    validity: int
    resource: Any
    key: bytes


class CannotObtainLock(Exception):
    """Raised by ``Redlock()`` when it is given no master."""


class MultipleRedlockException(Exception):
    """The masters' errors, in ``errors``: raised by ``unlock()`` when too many masters
    failed for a quorum."""

    def __init__(self, errors: list[BaseException], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.errors = errors

    def __str__(self) -> str:
        return " :: ".join(str(e) for e in self.errors)

    __repr__ = __str__


def _name(resource: object) -> str:
    """The lock name of a redlock-py resource: the key redis-py would write."""
    if isinstance(resource, str):
        return resource
    if isinstance(resource, (bytes, bytearray, memoryview)):
        return bytes(resource).decode("utf-8")
    if isinstance(resource, (int, float)) and not isinstance(resource, bool):
        return repr(resource)
    raise TypeError(f"resource must be a str, bytes or a number, not {type(resource).__name__}")


def _release(lock: redreentrant.Lock) -> None:
    """Release a hold that may have expired (as redlock-py's unlock ignores that)."""
    with contextlib.suppress(LockLostError, LockNotOwnedError):
        lock.release()


class Redlock:
    """redlock-py's lock manager over ``connection_list``, the quorum's masters (see the
    module's documentation for what differs)."""

    default_retry_count = 3
    #: seconds
    default_retry_delay = 0.2
    clock_drift_factor = 0.01

    def __init__(
        self,
        connection_list: Iterable[Any],
        retry_count: int | None = None,
        retry_delay: float | None = None,
    ) -> None:
        connections = list(connection_list)
        self.servers: list[Any] = []
        masters: list[Any] = []
        for connection_info in connections:
            try:
                if isinstance(connection_info, str):
                    server: Any = redis.StrictRedis.from_url(connection_info)
                    master: Any = connection_info
                elif type(connection_info) is dict:
                    server = master = redis.StrictRedis(**connection_info)
                else:
                    server = master = connection_info
                self.servers.append(server)
                masters.append(master)
            except Exception as e:
                raise Warning(str(e)) from e
        self.quorum = len(connections) // 2 + 1
        if len(self.servers) < self.quorum:
            raise CannotObtainLock("Failed to connect to the majority of redis servers")
        self.retry_count = retry_count or self.default_retry_count
        self.retry_delay = retry_delay or self.default_retry_delay
        self._manager = sync_manager(masters)

    def get_unique_id(self) -> bytes:
        """A new lock's key: 22 random letters and digits."""
        characters = string.ascii_letters + string.digits
        return "".join(secrets.choice(characters) for _ in range(22)).encode()

    def lock(self, resource: Any, ttl: int) -> Lock | Literal[False]:
        """Take ``resource`` for ``ttl`` milliseconds (an ``int``); the ``Lock``, or
        ``False`` if it was not obtained within ``retry_count * retry_delay`` seconds."""
        key = self.get_unique_id()
        if not isinstance(ttl, int):
            raise ValueError(f"ttl {ttl} is not an integer")
        name = _name(resource)
        mgr = self._manager
        if self.retry_count < 1 or ttl / 1000 < mgr.shortest_lease:
            return False
        owner = Owner()
        lock = owner.lock = mgr.lock(name, owner=owner)
        deadline = time.monotonic() + self.retry_count * self.retry_delay
        failures = 0
        while True:
            try:
                got = lock.acquire(timeout=max(0.0, deadline - time.monotonic()), lease=ttl / 1000)
            except QuorumUnavailableError:
                failures += 1
                if failures >= self.retry_count:
                    return False
                time.sleep(self.retry_delay)
                continue
            if not got:
                return False
            validity = int(lock.remaining() * 1000)
            if validity > 0:
                registry(mgr).add((name, key), owner)
                return Lock(validity, resource, key)
            # Less than a millisecond left: redlock-py counts that as a failed try.
            _release(lock)
            if time.monotonic() >= deadline:
                return False

    def unlock(self, lock: Lock) -> None:
        """Release ``lock`` (one that expired, or was released before, is ignored)."""
        key = lock.key if isinstance(lock.key, bytes) else None
        taken = registry(self._manager).pop((_name(lock.resource), key))
        if taken is None:
            return
        try:
            _release(taken.lock)
        except QuorumUnavailableError as error:
            raise MultipleRedlockException(list(error.errors.values())) from error
