"""Threads as owners: each thread's token, and the news of its end."""

from __future__ import annotations

import threading
import weakref

from .._core.owner import OWNERS, new_token

_local = threading.local()


class _EndOfThread:
    """Kept in a thread's local storage: the interpreter drops it when the thread ends,
    and its finalizer tells the watchdogs at once rather than at their next tick."""

    def __init__(self, token: str) -> None:
        weakref.finalize(self, OWNERS.ended, token)


def thread_token() -> str:
    """The calling thread's token, stable for the thread's life and never reused."""
    token: str | None = getattr(_local, "token", None)
    if token is None:
        token = new_token("t")
        thread = threading.current_thread()
        ref = weakref.ref(thread)

        def alive() -> bool:
            owner = ref()
            return owner is not None and owner.is_alive()

        OWNERS.register(token, alive, thread.name)
        _local.token = token
        _local.end = _EndOfThread(token)
    return token
