"""The lock manager of a Celery app, one per process."""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from typing import Any

from redreentrant import LockManager

#: a manager, or what makes one (called once per process)
ManagerSource = LockManager | Callable[[], LockManager]

_lock = threading.Lock()
#: the managers made here from an app's configuration: (app id, pid) -> manager
_made: dict[tuple[int, int], LockManager] = {}


def manager_for(app: Any, given: ManagerSource | None = None) -> LockManager:
    """The lock manager for ``app`` in this process.

    ``given``: a :class:`~redreentrant.LockManager`, or a callable that makes one (called
    once per process, so that a prefork worker's children each make their own). Without
    it, a manager on ``app.conf.redreentrant_masters`` (a list of master URLs) with the
    keyword arguments ``app.conf.redreentrant_options`` (a dict, optional), made at the
    first call in each process and closed at its exit. ``ValueError`` when neither is
    set.
    """
    if isinstance(given, LockManager):
        return given
    key = (id(app), os.getpid())
    with _lock:
        manager = _made.get(key)
        if manager is None:
            manager = _made[key] = given() if given is not None else _configured(app)
            atexit.register(manager.close)
        return manager


def _configured(app: Any) -> LockManager:
    masters = app.conf.get("redreentrant_masters")
    if not masters:
        raise ValueError(
            "no lock masters: set app.conf.redreentrant_masters (a list of Redis URLs), or"
            " give the task base a manager (singleton_manager)"
        )
    options = app.conf.get("redreentrant_options") or {}
    return LockManager(list(masters), **options)
