"""The sync ``synchronized`` decorator: each call runs holding a lock owned by the
calling thread (the options, names and checks are the core's: ``_core/decorators.py``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from .._core.decorators import Synchronized
from .._core.manager import ManagerCore
from .lock import Lock

P = ParamSpec("P")
R = TypeVar("R")


def synchronize(
    manager: ManagerCore[Lock], options: Synchronized, fn: Callable[P, R]
) -> Callable[P, R | None]:
    """``fn`` wrapped so that each call holds its lock from ``manager`` (see
    ``LockManager.synchronized``). Raises the decoration-time errors at once."""
    target = options.target(fn, coroutine=False)

    @functools.wraps(fn)
    def synchronized(*args: P.args, **kwargs: P.kwargs) -> R | None:
        name = target.name(args, kwargs)
        lock = options.lock(manager, name)
        if not lock.acquire(options.blocking, options.timeout, options.lease):
            target.not_obtained(name)  # raises, unless the call is skipped
            return None
        # Released as a 'with lock:' block would release it.
        try:
            result = fn(*args, **kwargs)
        except BaseException as error:
            lock.__exit__(type(error), error, error.__traceback__)
            raise
        lock.__exit__(None, None, None)
        return result

    return synchronized
