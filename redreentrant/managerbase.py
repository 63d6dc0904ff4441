"""What the sync and the asyncio lock managers share: settings, masters, holds, and
the making of lock objects. Each flavour adds its driver, transport, wake-ups and
watchdog."""

from __future__ import annotations

import inspect
import logging
import math
import os
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

from redis.connection import AbstractConnection

from . import keys
from .errors import ManagerClosedError
from .holds import Hold, Holds
from .keys import validate_name
from .kinds import FAIR, READ, WRITE, LockKind
from .owner import new_manager_id, parse_owner
from .quorum import Quorum, drift_allowance
from .rwlock import ReadWriteLock
from .transport import master_name

log = logging.getLogger("redreentrant")
L = TypeVar("L")  # the flavour's lock class


def default_master_timeout(lease: float) -> float:
    """How long one master may take to answer: small against the lease."""
    return min(0.25, lease / 10)


def no_handshake(connection_class: Any = AbstractConnection) -> dict[str, Any]:
    """Client options that make connecting send nothing (no HELLO, no CLIENT SETINFO):
    on a frozen master a handshake would block every reconnect for a socket time-out."""
    params = inspect.signature(connection_class.__init__).parameters
    if "driver_info" in params:
        return {"protocol": 2, "driver_info": None}
    return {"protocol": 2, "lib_name": None, "lib_version": None}


def master_identity(client: Any) -> tuple[object, ...]:
    """What makes two clients the same master: the server (host and port, or socket
    path). Two databases of one server are not independent masters: one crash or
    restart would take both votes."""
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return ("unix", kw["path"])
    host = str(kw.get("host", "localhost"))
    if host in ("localhost", "::1"):
        host = "127.0.0.1"
    return (host, int(kw.get("port", 6379)))


_BARE_MASTER = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:[0-9]{1,5})?$")
_SCHEMES = ("redis", "rediss", "unix")


def master_url(text: str) -> str:
    """One master as a URL: a ``redis://``, ``rediss://`` or ``unix://`` URL as it is,
    a bare ``host`` or ``host:port`` as ``redis://host:port/0``. Anything else (a
    malformed URL such as ``redis//host:6379``) is a ValueError naming it."""
    part = text.strip()
    if "://" in part:
        scheme = part.split("://", 1)[0].lower()
        parsed = urlsplit(part)
        if scheme not in _SCHEMES or (scheme != "unix" and not parsed.hostname):
            raise ValueError(f"malformed master URL {text!r}: expected redis://host:port/db")
        return part
    if not _BARE_MASTER.match(part):
        raise ValueError(f"malformed master {text!r}: expected a redis:// URL or host:port")
    return f"redis://{part}/0"


def master_urls(text: str) -> list[str]:
    """Masters written as one string, separated by commas (the command line's form and
    ``$REDREENTRANT_MASTERS``): each a URL or a bare ``host:port`` (see
    :func:`master_url`)."""
    urls = [master_url(part) for part in text.split(",") if part.strip()]
    if not urls:
        raise ValueError(f"no master in {text!r}")
    return urls


def connect(
    masters: object, client_type: type, from_url: Callable[[str], Any]
) -> tuple[list[Any], list[Any]]:
    """Clients for ``masters`` (URLs or ``client_type`` instances), checked for
    duplicates. Returns (all clients, the ones made here from URLs).

    One string may hold several masters separated by commas: never a silent quorum of
    one master when the list came from an environment variable."""
    if isinstance(masters, str):
        masters = master_urls(masters)
    elif isinstance(masters, client_type):
        masters = [masters]
    if not isinstance(masters, Sequence):
        raise TypeError("masters must be redis URLs or clients, or a sequence of them")
    if not masters:
        raise ValueError("at least one master is needed")
    clients: list[Any] = []
    for m in masters:
        if isinstance(m, str):
            if "," in m:
                raise ValueError(
                    f"master {m!r} holds a comma: give one master per item, or all of"
                    " them as one comma-separated string"
                )
            clients.append(from_url(master_url(m)))
        elif isinstance(m, client_type):
            clients.append(m)
        else:
            raise TypeError(f"a master is a redis URL or a {client_type.__name__}, not {m!r}")
    own = [c for c, m in zip(clients, masters, strict=True) if isinstance(m, str)]
    seen: dict[tuple[object, ...], int] = {}
    for i, c in enumerate(clients):
        ident = master_identity(c)
        if ident in seen:
            raise ValueError(
                f"master {master_name(c)} is given twice (positions {seen[ident]} and {i})"
            )
        seen[ident] = i
    return clients, own


#: the longest lease accepted (ten years): longer ones overflow Redis' expiry times
MAX_LEASE = 10 * 365 * 86400.0


def number(argument: str, value: object) -> float:
    """``value`` as a float, or a TypeError/ValueError that names ``argument``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{argument} must be a number, not {type(value).__name__}")
    if math.isnan(value):
        raise ValueError(f"{argument} must not be NaN")
    return float(value)


def check_lease(argument: str, value: object) -> float:
    """A lease in seconds: > 0 and at most :data:`MAX_LEASE`."""
    lease = number(argument, value)
    if not 0 < lease <= MAX_LEASE:
        raise ValueError(
            f"{argument} must be > 0 and at most {MAX_LEASE:.0f} seconds (ten years), not {value!r}"
        )
    return lease


class ManagerBase(Generic[L]):
    """Settings, masters and holds of a lock manager (see ``LockManager``)."""

    _lock_class: Callable[[Any, str], L]
    _read_class: Callable[[Any, str], L]
    _write_class: Callable[[Any, str], L]
    _fair_class: Callable[[Any, str], L]
    _transport: Any
    _hub: Any
    _watchdog: Any

    def __init__(
        self,
        lease: float,
        drift_factor: float,
        master_timeout: float | None,
        retry_jitter: float,
        on_lost: Callable[[Any], object] | None,
    ) -> None:
        lease = check_lease("lease", lease)
        drift_factor = number("drift_factor", drift_factor)
        if not 0 <= drift_factor < 0.5:
            raise ValueError(f"drift_factor must be in [0, 0.5), not {drift_factor!r}")
        timeout = default_master_timeout(lease) if master_timeout is None else master_timeout
        timeout = number("master_timeout", timeout)
        if not 0 < timeout < lease / 3:
            raise ValueError(f"master_timeout must be > 0 and < lease / 3, not {timeout!r}")
        retry_jitter = number("retry_jitter", retry_jitter)
        if not (math.isfinite(retry_jitter) and retry_jitter >= 0):
            raise ValueError(
                f"retry_jitter must be a finite number of seconds >= 0, not {retry_jitter!r}"
            )
        if lease <= drift_allowance(lease, drift_factor) + timeout:
            raise ValueError(
                f"lease {lease!r}s is too short: it must exceed the clock drift allowance"
                f" plus the master timeout ({timeout}s)"
            )
        if on_lost is not None and not callable(on_lost):
            raise TypeError("on_lost must be callable")
        self.lease = float(lease)
        self.master_timeout = float(timeout)
        self.drift_factor = drift_factor
        self.retry_jitter = retry_jitter
        self.on_lost = on_lost
        self.id = new_manager_id()
        self._holds = Holds()
        self._closed = False
        # The rounds under way (each a generator): close() lets them finish their
        # clean-up on the transport before closing it.
        self._runs: set[object] = set()

    def _wire(
        self,
        masters: object,
        client_type: type,
        url_client: Callable[[str, float], Any],
        transport: Callable[[list[Any], float], Any],
        hub: Callable[[list[Any], float, str], Any],
        watchdog: Callable[..., Any],
    ) -> None:
        """Connect the masters and build the flavour's transport, wake-up hub and
        watchdog (the one place both flavours are put together)."""
        timeout = self.master_timeout
        clients, self._own_clients = connect(
            masters, client_type, lambda url: url_client(url, timeout)
        )
        self._clients = clients
        self._quorum = Quorum(
            tuple(master_name(c) for c in clients), self.drift_factor, self.retry_jitter
        )
        self._transport = transport(clients, timeout)
        # Confirmations of a subscription may take a round trip from every master.
        self._hub = hub(clients, 2 * timeout, keys.PREFIX + "hub:" + self.id)
        self._watchdog = watchdog(self._run, self._quorum, self._holds, self.lease, self._lost)
        _after_fork.add(self)

    def _run(self, steps: Any) -> Any:
        raise NotImplementedError

    # -- public API --------------------------------------------------------------------

    @property
    def masters(self) -> tuple[str, ...]:
        """The masters' addresses, in order."""
        return self._quorum.masters

    @property
    def quorum(self) -> int:
        """How many masters must grant a lock: ``N // 2 + 1``."""
        return self._quorum.needed

    def lock(self, name: str) -> L:
        """A reentrant lock named ``name``, owned by whoever acquires it."""
        self._check_open()
        return self._lock_class(self, name)

    def rw_lock(self, name: str) -> ReadWriteLock[L]:
        """A read/write lock named ``name``: ``.read`` (shared) and ``.write`` (exclusive)."""
        self._check_open()
        return ReadWriteLock(
            validate_name(name), self._read_class(self, name), self._write_class(self, name)
        )

    def fair_lock(self, name: str) -> L:
        """A reentrant lock named ``name`` that is granted in order of arrival."""
        self._check_open()
        return self._fair_class(self, name)

    def owner_id(self) -> str:
        """The calling owner's id under this manager."""
        raise NotImplementedError

    # -- internals shared by the lock kinds ---------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: every later call fails with
        :class:`ManagerClosedError`."""
        return self._closed

    def _is_closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ManagerClosedError("the lock manager is closed")

    def _close_timeout(self) -> float:
        """How long close() waits for rounds under way to finish their clean-up."""
        return 2.0 + 4 * self.master_timeout

    def _check_lease(self, lease: float | None) -> float:
        if lease is None:
            return self.lease
        lease = check_lease("lease", lease)
        if lease <= self._quorum.drift(lease) + self.master_timeout:
            raise ValueError(
                f"lease {lease!r}s is too short: it must exceed the clock drift allowance"
                f" plus the master timeout ({self.master_timeout}s)"
            )
        return float(lease)

    def _front(self, kind: LockKind, name: str) -> L:
        """The lock object for a hold (handed to ``on_lost``)."""
        make = {READ.label: self._read_class, WRITE.label: self._write_class}
        make[FAIR.label] = self._fair_class
        return make.get(kind.label, self._lock_class)(self, name)

    def _lost(self, hold: Hold) -> object:
        """Report a lost hold: log it and call ``on_lost`` (returning what it returned)."""
        who = parse_owner(hold.owner)
        log.warning(
            "redreentrant: lost lock %r held by %s (%s); acquired at %s",
            hold.name,
            who.describe() if who is not None else hold.owner,
            hold.lost,
            hold.site,
        )
        if self.on_lost is None:
            return None
        try:
            return self.on_lost(self._front(hold.kind, hold.name))
        except Exception:
            log.exception("redreentrant: on_lost hook raised")
            return None

    def _after_fork_in_child(self) -> None:
        # The child is a new owner: it never renews nor releases the parent's holds.
        self.id = new_manager_id()
        self._holds = Holds()
        self._runs = set()


class _ForkRegistry:
    """Managers alive in this process, reset in a forked child."""

    def __init__(self) -> None:
        self._managers: weakref.WeakSet[ManagerBase[Any]] = weakref.WeakSet()
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._in_child)

    def add(self, manager: ManagerBase[Any]) -> None:
        with self._lock:
            self._managers.add(manager)

    def _in_child(self) -> None:
        self._lock = threading.Lock()
        for manager in list(self._managers):
            manager._after_fork_in_child()


_after_fork = _ForkRegistry()
