"""What the ``synchronized`` decorators of both flavours share (no I/O): their options,
checked when ``mgr.synchronized(...)`` is called; the checks of the decorated function
and its name template, made when it is decorated; and, at each call, the lock to take
and what to do when it is not obtained.

The flavours' decorators only acquire, call and release, in a thread or in a task.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast, get_args

from .errors import LockTimeoutError
from .manager import ManagerCore
from .naming import Namer, NameTemplate, describe
from .settings import check_acquire_args, check_lease, number

log = logging.getLogger(__name__)
L = TypeVar("L")

#: the lock kinds a decorator may take: the plain lock, the fair lock, and the two
#: sides of the read/write lock
SyncKind = Literal["lock", "fair", "read", "write"]
KINDS: tuple[str, ...] = get_args(SyncKind)


@dataclass(frozen=True)
class Synchronized:
    """The checked options of one ``mgr.synchronized(...)``: see
    ``LockManager.synchronized``."""

    template: NameTemplate
    kind: SyncKind
    blocking: bool
    timeout: float
    lease: float | None

    @classmethod
    def check(
        cls, name: object, *, kind: object, blocking: object, timeout: object, lease: object
    ) -> Synchronized:
        """The options, or a ``TypeError``/``ValueError`` naming the first bad one."""
        if callable(name):
            raise TypeError(
                "synchronized() takes the lock's name first: write"
                " @mgr.synchronized('name'), not @mgr.synchronized"
            )
        template = NameTemplate(name)
        if not isinstance(kind, str):
            raise TypeError(f"kind must be a str, not {type(kind).__name__}")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, not {kind!r}")
        if not isinstance(blocking, bool):
            raise TypeError(f"blocking must be True or False, not {blocking!r}")
        timeout_s = number("timeout", timeout)
        check_acquire_args(blocking, timeout_s)
        lease_s = None if lease is None else check_lease("lease", lease)
        return cls(template, cast(SyncKind, kind), blocking, timeout_s, lease_s)

    def target(self, fn: object, *, coroutine: bool) -> Target:
        """Check ``fn`` for this flavour (``coroutine``: the asyncio one) and bind the
        name template to its signature: the ``TypeError``/``ValueError`` of decoration
        time."""
        checked = _checked(fn, coroutine)
        return Target(self, describe(checked), self.template.bind(checked))

    def lock(self, manager: ManagerCore[L], name: str) -> L:
        """The lock of this decorator's kind named ``name``, from ``manager``."""
        if self.kind == "lock":
            return manager.lock(name)
        if self.kind == "fair":
            return manager.fair_lock(name)
        pair = manager.rw_lock(name)
        return pair.read if self.kind == "read" else pair.write


@dataclass(frozen=True)
class Target:
    """One decorated function: its options, its name in messages, and its namer."""

    options: Synchronized
    what: str
    namer: Namer

    def name(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        """The lock name of the call ``fn(*args, **kwargs)``."""
        return self.namer(args, kwargs)

    def not_obtained(self, name: str) -> None:
        """A call that did not get its lock: with ``blocking=True`` (and so a timeout)
        raise :class:`LockTimeoutError`; with ``blocking=False`` the call is skipped and
        returns None."""
        options = self.options
        if options.blocking:
            raise LockTimeoutError(name, options.timeout, f"{self.what} did not run")
        log.debug("redreentrant: lock %r is held elsewhere: %s skipped", name, self.what)


def _checked(fn: object, coroutine: bool) -> Callable[..., Any]:
    flavour = "redreentrant.asyncio.LockManager" if coroutine else "redreentrant.LockManager"
    if isinstance(fn, (classmethod, staticmethod)):
        decorator = type(fn).__name__
        raise TypeError(
            f"{flavour}.synchronized() got a {decorator} object: put @{decorator} above"
            " @mgr.synchronized(...), so that the function itself is decorated"
        )
    if not callable(fn):
        raise TypeError(f"{flavour}.synchronized() decorates functions, not {type(fn).__name__}")
    what = describe(fn)
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise TypeError(
            f"{flavour}.synchronized() cannot decorate the generator function {what}: its"
            " body runs after the call returns, so the lock would not be held while it"
            " runs. Take the lock inside it ('with mgr.lock(name):')"
        )
    if coroutine and not inspect.iscoroutinefunction(fn):
        raise TypeError(
            f"{flavour}.synchronized() decorates 'async def' functions, and {what} is not"
            " one: use redreentrant.LockManager.synchronized for a plain function"
        )
    if not coroutine and inspect.iscoroutinefunction(fn):
        raise TypeError(
            f"{flavour}.synchronized() cannot decorate the coroutine function {what}: use"
            " redreentrant.asyncio.LockManager.synchronized, whose calls take the lock in"
            " the task that awaits them"
        )
    return fn
