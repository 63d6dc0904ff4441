"""Singleton tasks: :class:`Singleton`, a task base class that runs at most one execution
per key at a time, across every worker and host.

Each execution holds a lock of the key (``celery:<task name>:<arguments>``) on the
masters while it runs, owned by that execution: the watchdog of its process renews the
hold, and when the process dies (SIGKILL, the OOM killer, a hard time limit) nothing
renews it, so the key is free within one lease. A duplicate, a call of the same key
while one runs, is skipped (the default), waits for the running one, or raises, as the
task's ``singleton_duplicate`` option says.

With ``singleton_at_send``, the key is taken when the task is sent (``apply_async``,
``delay``): a duplicate is refused before it reaches the broker, and the hold travels
with the message (:meth:`redreentrant.Lock.hand_off`, a ticket in the message's
headers) to the worker that runs it, which takes it over. A message not run while the
hold lasts (``singleton_send_lease``) frees the key; its worker then takes it anew.

What is not promised: a task whose lock was lost while it ran (its process paused past
the lease, a majority of masters unreachable) is not stopped. It can check
(``self.singleton.lost``, ``self.singleton.ensure_held()``), should fence what it writes
with ``self.singleton.token`` (``singleton_fencing``), and its execution then ends with
:class:`~redreentrant.LockLostError`, even when its body returned.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from celery import Task, states
from celery.result import EagerResult
from celery.utils import uuid

from redreentrant import Lock, LockError, LockLostError, LockManager

from .manager import ManagerSource, manager_for

#: the message header that carries a hold taken at send (a hand-off ticket)
TICKET_HEADER = "redreentrant_ticket"
#: the duplicate policies
DUPLICATE_POLICIES = ("skip", "wait", "raise")
#: lock names longer than this hash the arguments (the task's name stays readable)
LONGEST_READABLE = 200


class DuplicateTaskError(LockError):
    """A singleton task's key is held by another execution (``singleton_duplicate =
    "raise"``, or a ``"wait"`` that timed out)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)  # its args: how a result backend rebuilds it
        self.key = key

    def __str__(self) -> str:
        return f"a duplicate of singleton key {self.key!r}: another execution holds it"


def skipped(value: Any) -> bool:
    """Whether a task's result (what ``AsyncResult.get()`` returned) says the call was
    skipped as a duplicate: ``{"skipped": "duplicate", "key": ...}``."""
    return isinstance(value, dict) and value.get("skipped") == "duplicate" and "key" in value


def skip_result(key: str) -> dict[str, str]:
    """The result of a call skipped as a duplicate of ``key`` (see :func:`skipped`)."""
    return {"skipped": "duplicate", "key": key}


class Execution:
    """The owner of one execution's hold (``owner=``): an execution is the owner, not
    the thread, so a pool of green threads cannot re-enter another's hold."""


class Singleton(Task):  # type: ignore[misc]
    """A task base class: at most one execution per key at a time, across every worker.

    ``@app.task(base=Singleton)``; the options below are class attributes, given as
    keyword arguments of ``app.task`` or set on a subclass:

    - ``singleton_key``: what makes the key. ``None`` (default): the task's name and
      all its arguments (bound to its signature, defaults included); a sequence of
      argument names: the task's name and those arguments; a callable: called with the
      task's arguments, it returns the whole lock name.
    - ``singleton_duplicate``: what a duplicate does: ``"skip"`` (default: not run; its
      result is ``{"skipped": "duplicate", "key": ...}``, see :func:`skipped`),
      ``"wait"`` (runs once the running one ended; ``singleton_wait`` bounds the wait,
      then :class:`DuplicateTaskError`) or ``"raise"`` (:class:`DuplicateTaskError`).
    - ``singleton_at_send``: take the key when the task is sent (see the module).
    - ``singleton_send_lease``: seconds a hold taken at send lasts while its message
      waits (default: the manager's lease).
    - ``singleton_fencing``: the hold gets a fencing token (``self.singleton.token``).
    - ``singleton_manager``: a :class:`~redreentrant.LockManager`, or a callable that
      makes one (once per process); default: ``app.conf.redreentrant_masters``.

    While it runs, the task finds its hold in ``self.singleton`` (a
    :class:`~redreentrant.Lock`: ``token``, ``lost``, ``ensure_held()``,
    ``remaining()``).
    """

    #: what makes the key: None (the name and all arguments), argument names, or a
    #: callable that returns the lock name
    singleton_key: Sequence[str] | Callable[..., str] | None = None
    #: what a duplicate does: "skip", "wait" or "raise"
    singleton_duplicate: str = "skip"
    #: seconds a "wait" waits at most (None: no limit)
    singleton_wait: float | None = None
    #: take the key when the task is sent, and hand it to the worker
    singleton_at_send: bool = False
    #: seconds a key taken at send lasts while its message waits (None: the lease)
    singleton_send_lease: float | None = None
    #: the hold gets a fencing token
    singleton_fencing: bool = False
    #: a LockManager, or a callable that makes one per process (None: the app's
    #: configuration)
    singleton_manager: ManagerSource | None = None

    # -- the key ------------------------------------------------------------------------

    def singleton_name(self, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
        """The lock name of a call with ``args`` and ``kwargs``."""
        # As given: a function set as a class attribute would be bound to the task.
        key = inspect.getattr_static(self, "singleton_key")
        if isinstance(key, staticmethod):
            key = key.__func__
        if callable(key):
            return str(key(*args, **kwargs))
        bound = inspect.signature(self.run).bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        if key is not None:
            if isinstance(key, str):
                raise TypeError("singleton_key takes a sequence of argument names, not a str")
            values = {k: values[k] for k in key}
        text = json.dumps(values, sort_keys=True, default=repr, separators=(",", ":"))
        name = f"celery:{self.name}:{text}"
        if len(name) > LONGEST_READABLE:
            name = f"celery:{self.name}:{hashlib.sha256(text.encode()).hexdigest()[:32]}"
        return name

    # -- the hold -----------------------------------------------------------------------

    @property
    def singleton(self) -> Lock:
        """The running execution's hold; ``RuntimeError`` outside one."""
        lock = getattr(self.request, "redreentrant_lock", None)
        if lock is None:
            raise RuntimeError(f"task {self.name!r} holds no singleton key here")
        return lock  # type: ignore[no-any-return]

    def _manager(self) -> LockManager:
        return manager_for(self.app, self.singleton_manager)

    def _lock(self, name: str, owner: Execution) -> Lock:
        return self._manager().lock(name, owner=owner, fencing=self.singleton_fencing)

    def _take(self, lock: Lock, name: str, lease: float | None = None) -> bool:
        """Take ``lock`` as the duplicate policy says: True if taken, False to skip."""
        policy = self.singleton_duplicate
        if policy not in DUPLICATE_POLICIES:
            raise ValueError(
                f"singleton_duplicate of {self.name!r} is {policy!r}: one of"
                f" {', '.join(DUPLICATE_POLICIES)}"
            )
        if policy == "wait":
            timeout = -1 if self.singleton_wait is None else self.singleton_wait
            taken = lock.acquire(timeout=timeout, lease=lease)
        else:
            mgr = self._manager()
            started = time.monotonic()
            taken = lock.acquire(blocking=False, lease=lease)
            while not taken and (votes_at := mgr.quorum_votes_at()) > started:
                # Refused while too few masters' votes counted (a quarantine, after a
                # restart without data): not a duplicate. Try again once they count.
                time.sleep(max(0.0, votes_at - time.monotonic()))
                started = time.monotonic()
                taken = lock.acquire(blocking=False, lease=lease)
        if taken or policy == "skip":
            return taken
        raise DuplicateTaskError(name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = self.singleton_name(args, kwargs)
        owner = Execution()
        lock = self._lock(name, owner)
        if not self._took_over(lock) and not self._take(lock, name):
            return skip_result(name)
        request = self.request
        request.redreentrant_lock = lock
        try:
            result = super().__call__(*args, **kwargs)
        except BaseException:
            with contextlib.suppress(LockError):
                lock.release()
            raise
        finally:
            request.redreentrant_lock = None
        lock.release()  # LockLostError if it was lost meanwhile
        return result

    def _took_over(self, lock: Lock) -> bool:
        """Take over the hold the message carries, if any and still there."""
        request = self.request
        headers = getattr(request, "headers", None) or {}
        ticket = getattr(request, TICKET_HEADER, None) or headers.get(TICKET_HEADER)
        if not ticket:
            return False
        try:
            lock.take_over(ticket)
        except LockLostError:  # its lease ended, or a redelivery: taken anew
            return False
        return True

    # -- sending ------------------------------------------------------------------------

    def apply_async(
        self, args: Sequence[Any] | None = None, kwargs: dict[str, Any] | None = None,
        task_id: str | None = None, *more: Any, **options: Any,
    ) -> Any:  # fmt: skip
        """Send the task; with ``singleton_at_send``, take its key first (see the
        module): a duplicate skipped returns a result that is ready at once (its value
        says so, see :func:`skipped`)."""
        headers = dict(options.pop("headers", None) or {})
        if not self.singleton_at_send or TICKET_HEADER in headers:
            if headers:
                options["headers"] = headers
            return super().apply_async(args, kwargs, task_id, *more, **options)
        name = self.singleton_name(args or (), kwargs or {})
        owner = Execution()
        lock = self._lock(name, owner)
        lease = self.singleton_send_lease or self._manager().lease
        if not self._take(lock, name, lease):
            return EagerResult(task_id or uuid(), skip_result(name), states.SUCCESS)
        ticket = lock.hand_off()
        headers[TICKET_HEADER] = ticket
        try:
            return super().apply_async(args, kwargs, task_id, *more, headers=headers, **options)
        except BaseException:
            # Not sent: the key is freed again.
            with contextlib.suppress(LockError):
                lock.take_over(ticket)
                lock.release()
            raise
