"""The managers the adapters share: one per set of masters (and, for the asyncio
flavour, per event loop), made on first use and kept for the life of the process (the
asyncio ones, for the life of their loop).

A set of masters is known by each master's server and database (its client's
connection settings), not by the client object: adapters made from different client
objects of one server share a manager. The first client given is the one the manager
uses. The managers have the default settings but two: they wait up to
:data:`MASTER_TIMEOUT` for a master's answer (the libraries adapted wait for their
server; the core's default suits a quorum of many masters), and no master is
quarantined (``quarantine=0``): as in the libraries adapted, a lock whose key a
server lost (a restart without its data, ``FLUSHALL``) is free at once. The adapters
pass each lock's lease with its acquire.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
import weakref
from collections.abc import Sequence
from typing import Any, TypeVar

import redreentrant
import redreentrant.asyncio

#: how long the adapters' managers wait for one master's answer in a round, in seconds
MASTER_TIMEOUT = 1.0

_M = TypeVar("_M", redreentrant.LockManager, redreentrant.asyncio.LockManager)

_lock = threading.Lock()
_sync: dict[tuple[object, ...], redreentrant.LockManager] = {}
_async: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[object, ...], redreentrant.asyncio.LockManager]
] = weakref.WeakKeyDictionary()


def master_key(master: Any) -> tuple[object, ...]:
    """What tells one master from another: a URL as it is, a client by its server,
    database and user (its pool's connection settings); a client of a Sentinel-managed
    master (``Sentinel.master_for``, whose pool names no host) by its service and
    sentinels instead of its server."""
    if isinstance(master, str):
        return ("url", master)
    pool = getattr(master, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return ("client", id(master))
    where = kwargs.get("path") or (str(kwargs.get("host", "localhost")), kwargs.get("port", 6379))
    service = getattr(pool, "service_name", None)
    if isinstance(service, str):
        sentinels = getattr(getattr(pool, "sentinel_manager", None), "sentinels", ())
        addresses = (s.connection_pool.connection_kwargs for s in sentinels)
        where = tuple(sorted(f"{a.get('host')}:{a.get('port')}" for a in addresses))
        return ("sentinel", service, where, kwargs.get("db", 0), kwargs.get("username"))
    return ("server", where, kwargs.get("db", 0), kwargs.get("username"))


def _shared(table: dict[tuple[object, ...], _M], masters: Sequence[Any], make: type[_M]) -> _M:
    """``table``'s manager of ``masters``, made (by ``make``) if it has none open."""
    key = tuple(master_key(m) for m in masters)
    mgr = table.get(key)
    if mgr is None or mgr.closed:
        mgr = table[key] = make(list(masters), master_timeout=MASTER_TIMEOUT, quarantine=0)
    return mgr


def sync_manager(masters: Sequence[Any]) -> redreentrant.LockManager:
    """The shared sync manager of ``masters`` (URLs or ``redis.Redis`` clients)."""
    with _lock:
        return _shared(_sync, masters, redreentrant.LockManager)


def async_manager(masters: Sequence[Any]) -> redreentrant.asyncio.LockManager:
    """The shared asyncio manager of ``masters`` (URLs or ``redis.asyncio.Redis``
    clients) on the running event loop."""
    loop = asyncio.get_running_loop()
    return _shared(_async.setdefault(loop, {}), masters, redreentrant.asyncio.LockManager)


@atexit.register
def _close() -> None:
    for mgr in list(_sync.values()):
        mgr.close()
