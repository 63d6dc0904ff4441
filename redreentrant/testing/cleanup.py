"""The exit-time safety net: whatever may own a process, a temporary directory or a
network namespace is stopped at interpreter exit, if its owner did not stop it.

Servers, ensembles and network labs (:class:`~redreentrant.testing.NetLab`) track
themselves here while they may own something, and untrack themselves once stopped (or
detached). At exit, each tracked object's stop function runs, in the order they were
tracked (an ensemble before its servers, so it stops them all at once; a lab before its
servers too, so that its delayer and clients stop first), and then the reaper
(:mod:`redreentrant.testing.reaper`) is closed: it finds nothing left to do, and ends.
A forked child forgets what its parent tracked: its exit must neither stop its parent's
servers nor remove their directories.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from collections.abc import Callable

from . import reaper

__all__ = ["track", "untrack"]

_lock = threading.Lock()
_live: dict[object, Callable[[], None]] = {}


def track(owner: object, stop: Callable[[], None]) -> None:
    """Call ``stop`` at exit unless ``owner`` is untracked first. Tracking an owner
    again keeps its place (and its first ``stop``)."""
    with _lock:
        _live.setdefault(owner, stop)


def untrack(owner: object) -> None:
    """Forget ``owner``: it owns nothing any more (or nothing that must stop with us)."""
    with _lock:
        _live.pop(owner, None)


def _at_exit() -> None:
    with _lock:
        stops = list(_live.values())
    for stop in stops:
        with contextlib.suppress(Exception):
            stop()
    reaper.close()


def _after_fork_in_child() -> None:
    # The copies are the parent's servers and directories, not the child's.
    global _lock
    _lock = threading.Lock()
    _live.clear()


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
