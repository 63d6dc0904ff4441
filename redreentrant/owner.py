"""Owner identity: who holds a lock.

An owner id is ``<host>:<pid>:<manager uuid>:<owner token>``: the manager id
(``LockManager.id``) names the host and process it lives in, so an operator can tell
from ``inspect`` alone which process holds a stuck lock, and no extra key is needed on
the masters (the hash values stay hold counts). The token names the calling thread
(sync API) or asyncio task (asyncio API) and is drawn from a counter, never from
``threading.get_ident()`` or ``id(task)``, whose values are reused once a thread or task
ends: a new owner must never inherit a dead one's holds.

This process also remembers, per token, the thread or task behind it (weakly): that
gives ``inspect`` the owner's name where this process knows it, and the watchdog the
news that an owner has ended while it still held a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import socket
import threading
import uuid
import weakref
from dataclasses import dataclass
from typing import Protocol

_tokens = itertools.count(1)
_local = threading.local()
_task_tokens: weakref.WeakKeyDictionary[asyncio.Task[object], str] = weakref.WeakKeyDictionary()
#: token -> the thread or task it names (weakly: a dead owner is not kept alive here),
#: and its name when the token was made (a thread's object may be gone when it ends)
_owners: dict[
    str, tuple[weakref.ref[threading.Thread] | weakref.ref[asyncio.Task[object]], str]
] = {}
_owners_lock = threading.Lock()


class OwnerEndListener(Protocol):
    """Told when an owner (a thread or task with a token) ends (a watchdog)."""

    def owner_ended(self, token: str) -> None: ...


_listeners: weakref.WeakSet[OwnerEndListener] = weakref.WeakSet()

# A host name goes into the id between colons: anything but letters, digits, dots,
# dashes and underscores becomes "_", and it is cut to 64 characters.
_UNSAFE_HOST = re.compile(r"[^A-Za-z0-9._-]")


def _host() -> str:
    host = _UNSAFE_HOST.sub("_", socket.gethostname())[:64]
    return host or "localhost"


def new_manager_id() -> str:
    """A fresh, globally unique manager id ``<host>:<pid>:<uuid>`` (a forked child
    makes a new one, with its own pid)."""
    return f"{_host()}:{os.getpid()}:{uuid.uuid4().hex}"


@dataclass(frozen=True)
class OwnerInfo:
    """What an owner id tells about its owner."""

    host: str
    pid: int
    manager: str
    """The uuid part of the manager id."""
    token: str
    """``t<n>`` for a thread, ``a<n>`` for an asyncio task."""
    name: str | None = None
    """The thread's or task's name, when this process knows it (else None)."""

    @property
    def kind(self) -> str:
        return "task" if self.token.startswith("a") else "thread"

    def describe(self) -> str:
        """One line for people: ``host web-1 pid 4242 thread worker-3``."""
        who = f"{self.kind} {self.name}" if self.name is not None else f"{self.kind} {self.token}"
        return f"host {self.host} pid {self.pid} {who}"


def parse_owner(owner_id: str) -> OwnerInfo | None:
    """What ``owner_id`` says about its owner; None for an id of another format (an
    older release's owner ids carry no host and pid)."""
    parts = owner_id.rsplit(":", 3)
    if len(parts) != 4 or not parts[1].isdigit():
        return None
    host, pid, manager, token = parts
    return OwnerInfo(host, int(pid), manager, token, _name_of(token, int(pid)))


def _name_of(token: str, pid: int) -> str | None:
    if pid != os.getpid():
        return None
    entry = _owners.get(token)
    if entry is None:
        return _ended_names.get(token)
    owner = entry[0]()
    if isinstance(owner, threading.Thread):
        return owner.name
    if isinstance(owner, asyncio.Task):
        return owner.get_name()
    return entry[1]


def owner_alive(token: str) -> bool:
    """Whether the thread or task that ``token`` names (a token made in this process)
    is still running. A token whose owner ended is forgotten: unknown means ended."""
    entry = _owners.get(token)
    if entry is None:
        return False
    owner = entry[0]()
    if owner is None:
        return False
    if isinstance(owner, threading.Thread):
        return owner.is_alive()
    return not owner.done()


class _EndOfThread:
    """Kept in a thread's local storage: the interpreter drops it when the thread ends,
    and its finalizer tells the listeners at once rather than at their next tick."""

    def __init__(self, token: str) -> None:
        weakref.finalize(self, _ended, token)


#: names of recently ended owners, for the warning that frees their holds
_ended_names: dict[str, str] = {}


def _ended(token: str) -> None:
    with _owners_lock:
        name = _name_of(token, os.getpid())
        _owners.pop(token, None)
        if name is not None:
            _ended_names[token] = name
            while len(_ended_names) > 1024:
                del _ended_names[next(iter(_ended_names))]
    for listener in list(_listeners):
        with contextlib.suppress(Exception):  # must never break a thread's end
            listener.owner_ended(token)


def listen_for_owner_ends(listener: OwnerEndListener) -> None:
    """Call ``listener.owner_ended(token)`` when a thread or task with a token ends
    (best effort; kept weakly). The watchdogs use it to free a dead owner's holds."""
    _listeners.add(listener)


def thread_token() -> str:
    """The calling thread's token, stable for the thread's life and never reused."""
    token: str | None = getattr(_local, "token", None)
    if token is None:
        token = f"t{next(_tokens)}"
        _local.token = token
        _local.end = _EndOfThread(token)
        with _owners_lock:
            thread = threading.current_thread()
            _owners[token] = (weakref.ref(thread), thread.name)
    return token


def task_token() -> str:
    """The current asyncio task's token, stable for the task's life and never reused."""
    task = current_task()
    token = _task_tokens.get(task)
    if token is None:
        token = _task_tokens[task] = f"a{next(_tokens)}"
        with _owners_lock:
            _owners[token] = (weakref.ref(task), task.get_name())
        task.add_done_callback(lambda _: _ended(token))
    return token


def current_task() -> asyncio.Task[object]:
    """The running task, or a clear error outside of one."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop
        task = None
    if task is None:
        raise RuntimeError("asyncio locks are owned by tasks: use them from inside a task")
    return task
