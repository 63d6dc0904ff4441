"""Owner identity: who holds a lock.

An owner id is ``<manager id>:<owner token>``. The token names the calling thread (sync
API) and is drawn from a counter, never from ``threading.get_ident()``, whose values are
reused once a thread ends: a new thread must never inherit a dead thread's holds.
"""

from __future__ import annotations

import itertools
import threading
import uuid

_tokens = itertools.count(1)
_local = threading.local()


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
