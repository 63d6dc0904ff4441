"""The asyncio ``synchronized`` decorator: each call runs holding a lock owned by the
task that awaits it (the options, names and checks are the core's:
``_core/decorators.py``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from .._core.decorators import Synchronized
from .._core.manager import ManagerCore
from .lock import Lock

P = ParamSpec("P")
R = TypeVar("R")


def synchronize(
    manager: ManagerCore[Lock], options: Synchronized, fn: Callable[P, Coroutine[Any, Any, R]]
) -> Callable[P, Coroutine[Any, Any, R | None]]:
    """``fn`` (an ``async def`` function) wrapped so that each call holds its lock from
    ``manager``, acquired in the awaiting task (see ``LockManager.synchronized``).
    Raises the decoration-time errors at once."""
    target = options.target(fn, coroutine=True)

    @functools.wraps(fn)
    async def synchronized(*args: P.args, **kwargs: P.kwargs) -> R | None:
        # This coroutine runs in the task that awaits it: that task owns the lock, so
        # a recursive await re-enters it.
        name = target.name(args, kwargs)
        lock = options.lock(manager, name)
        if not await lock.acquire(options.blocking, options.timeout, options.lease):
            target.not_obtained(name)  # raises, unless the call is skipped
            return None
        # Released as an 'async with lock:' block would release it (to its end, even
        # if the task is cancelled).
        try:
            result = await fn(*args, **kwargs)
        except BaseException as error:
            await lock.__aexit__(type(error), error, error.__traceback__)
            raise
        await lock.__aexit__(None, None, None)
        return result

    return synchronized
