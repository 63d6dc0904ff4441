"""Tasks as owners: each asyncio task's token, and the news of its end."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable

from .._core.owner import OWNERS, new_token

_task_tokens: weakref.WeakKeyDictionary[asyncio.Task[object], str] = weakref.WeakKeyDictionary()
#: the task asked about last and its token: a task asks many times in a row. A weak
#: reference, replaced whole: it names no task that has gone.
_last: tuple[Callable[[], object], str] = (lambda: None, "")


def current_task() -> asyncio.Task[object]:
    """The running task, or a clear error outside of one."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop
        task = None
    if task is None:
        raise RuntimeError("asyncio locks are owned by tasks: use them from inside a task")
    return task


def task_token() -> str:
    """The current asyncio task's token, stable for the task's life and never reused."""
    global _last
    task = current_task()
    last_task, last_token = _last
    if last_task() is task:  # the usual case: the same task as last time
        return last_token
    token = _task_tokens.get(task)
    if token is None:
        token = _task_tokens[task] = new_token("a")
        ref = weakref.ref(task)

        def alive() -> bool:
            owner = ref()
            return owner is not None and not owner.done()

        OWNERS.register(token, alive, task.get_name())
        task.add_done_callback(lambda _: OWNERS.ended(token))
    _last = (weakref.ref(task), token)
    return token
