"""Owner identity: who holds a lock (no I/O; the flavours name the owners).

An owner id is ``<host>:<pid>:<manager uuid>:<owner token>``: the manager id
(``LockManager.id``) names the host and process it lives in, so an operator can tell
from ``inspect`` alone which process holds a stuck lock, and no extra key is needed on
the masters (the hash values stay hold counts). The token names the calling thread
(sync API, ``t<n>``) or asyncio task (asyncio API, ``a<n>``) and is drawn from a
counter, never from ``threading.get_ident()`` or ``id(task)``, whose values are reused
once a thread or task ends: a new owner must never inherit a dead one's holds.

:data:`OWNERS` remembers, per token made in this process, whether its thread or task
still runs and its name: that gives ``inspect`` the owner's name where this process
knows it, and the watchdogs the news that an owner ended while it held a lock. Its
tables change by single dict operations, atomic in CPython, so it needs no lock.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import platform
import re
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

_tokens = itertools.count(1)

# A host name goes into the id between colons: anything but letters, digits, dots,
# dashes and underscores becomes "_", and it is cut to 64 characters.
_UNSAFE_HOST = re.compile(r"[^A-Za-z0-9._-]")


def host_name() -> str:
    """This host's name as it appears in owner ids."""
    return _UNSAFE_HOST.sub("_", platform.node())[:64] or "localhost"


def _pid_after_fork() -> None:
    PID[0] = os.getpid()


#: ``PID[0]``: this process's id, as ``os.getpid()`` but without a system call per
#: look (the fan-out checks it every round, to notice a fork): kept by a fork hook
PID = [os.getpid()]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pid_after_fork)


def new_manager_id() -> str:
    """A fresh, globally unique manager id ``<host>:<pid>:<uuid>`` (a forked child
    makes a new one, with its own pid)."""
    return f"{host_name()}:{os.getpid()}:{uuid.uuid4().hex}"


def manager_of(owner_id: str) -> str:
    """The id of the manager an owner id ``<manager id>:<token>`` belongs to (found the
    same way by ``lua/release.lua``)."""
    return owner_id.rpartition(":")[0]


def new_token(prefix: str) -> str:
    """A token never given out before in this process: ``t<n>`` or ``a<n>``."""
    return f"{prefix}{next(_tokens)}"


@dataclass(frozen=True)
class OwnerInfo:
    """What an owner id tells about its owner."""

    host: str
    pid: int
    manager: str
    """The uuid part of the manager id."""
    token: str
    """``t<n>`` for a thread, ``a<n>`` for an asyncio task, ``o<n>`` for an object."""
    name: str | None = None
    """The thread's or task's name, when this process knows it (else None)."""

    @property
    def kind(self) -> str:
        """``"thread"``, ``"task"``, or ``"object"`` (``owner=``)."""
        return {"a": "task", "o": "object"}.get(self.token[:1], "thread")

    def describe(self) -> str:
        """One line for people: ``host web-1 pid 4242 thread worker-3``."""
        return f"host {self.host} pid {self.pid} {self.kind} {self.name or self.token}"


def parse_owner(owner_id: str) -> OwnerInfo | None:
    """What ``owner_id`` says about its owner; None for an id of another format (an
    older release's owner ids carry no host and pid)."""
    parts = owner_id.rsplit(":", 3)
    if len(parts) != 4 or not parts[1].isdigit():
        return None
    host, pid, manager, token = parts
    name = OWNERS.name(token) if int(pid) == os.getpid() else None
    return OwnerInfo(host, int(pid), manager, token, name)


class OwnerEndListener(Protocol):
    """Told when an owner (a thread or task with a token) ends: a watchdog."""

    def owner_ended(self, token: str) -> None: ...


class Owners:
    """The owners (threads, tasks) this process has made tokens for."""

    def __init__(self) -> None:
        self._live: dict[str, tuple[Callable[[], bool], str]] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()  # names of recent dead owners
        self._listeners: weakref.WeakSet[OwnerEndListener] = weakref.WeakSet()

    def register(self, token: str, alive: Callable[[], bool], name: str) -> None:
        """A new owner: ``alive()`` tells whether it still runs."""
        self._live[token] = (alive, name)

    def alive(self, token: str) -> bool:
        """Whether the owner of ``token`` (a token of this process) still runs. An
        owner that ended is forgotten: unknown means ended."""
        entry = self._live.get(token)
        return entry is not None and entry[0]()

    def name(self, token: str) -> str | None:
        entry = self._live.get(token)
        return entry[1] if entry is not None else self._ended.get(token)

    def ended(self, token: str) -> None:
        """The owner of ``token`` ended: forget it and tell the listeners."""
        entry = self._live.pop(token, None)
        if entry is not None:
            self._ended[token] = entry[1]
            while len(self._ended) > 1024:
                self._ended.popitem(last=False)
        for listener in list(self._listeners):
            with contextlib.suppress(Exception):  # must never break a thread's end
                listener.owner_ended(token)

    def listen(self, listener: OwnerEndListener) -> None:
        """Call ``listener.owner_ended(token)`` when an owner ends (kept weakly)."""
        self._listeners.add(listener)


#: the owners of this process
OWNERS = Owners()

# The objects that own locks (``owner=``), by id: a weak reference and the token.
_objects: dict[int, tuple[weakref.ref[object], str]] = {}


def object_token(obj: object) -> str:
    """The token of an object that owns locks (``mgr.lock(name, owner=obj)``): the same
    while the object lives, never reused. When the object is collected, it ends as an
    owner (its watchdog-managed holds are released and reported, as a dead thread's).
    ``TypeError`` for an object that cannot be weakly referenced (an ``int``, a
    ``str``): its end could not be seen."""
    key = id(obj)
    entry = _objects.get(key)
    if entry is not None and entry[0]() is obj:
        return entry[1]
    token = new_token("o")

    def collected(ref: weakref.ref[object]) -> None:
        if _objects.get(key, (None,))[0] is ref:
            del _objects[key]
        OWNERS.ended(token)

    try:
        ref = weakref.ref(obj, collected)
    except TypeError:
        raise TypeError(
            f"owner= takes an object that can be weakly referenced (its holds are freed"
            f" when it is collected), not a {type(obj).__name__}"
        ) from None
    OWNERS.register(token, lambda: ref() is not None, type(obj).__qualname__)
    _objects[key] = (ref, token)
    return token
