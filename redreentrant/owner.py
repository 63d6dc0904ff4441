"""Owner identity: who holds a lock.

An owner id is ``<manager id>:<owner token>``. The token names the calling thread (sync
API) or asyncio task (asyncio API) and is drawn from a counter, never from
``threading.get_ident()`` or ``id(task)``, whose values are reused once a thread or task
ends: a new owner must never inherit a dead one's holds.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
import weakref

_tokens = itertools.count(1)
_local = threading.local()
_task_tokens: weakref.WeakKeyDictionary[asyncio.Task[object], str] = weakref.WeakKeyDictionary()


def new_manager_id() -> str:
    """A fresh, globally unique manager id (a new one is made in a forked child)."""
    return uuid.uuid4().hex


def thread_token() -> str:
    """The calling thread's token, stable for the thread's life and never reused."""
    token: str | None = getattr(_local, "token", None)
    if token is None:
        token = f"t{next(_tokens)}"
        _local.token = token
    return token


def task_token() -> str:
    """The current asyncio task's token, stable for the task's life and never reused."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop
        task = None
    if task is None:
        raise RuntimeError("asyncio locks are owned by tasks: use them from inside a task")
    token = _task_tokens.get(task)
    if token is None:
        token = _task_tokens[task] = f"a{next(_tokens)}"
    return token
