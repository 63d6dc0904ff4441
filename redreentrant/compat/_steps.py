"""One body for an adapter's sync and asyncio method: the method is written once as a
generator of *steps* that yields each call to the lock (a function of no arguments)
and is sent back its result, or has its exception thrown in, at the ``yield``;
:func:`run` makes the calls directly, :func:`arun` awaits them.

Hand-written because it is this small: the library's own flavours share their logic the
same way, through the I/O-free core, and the adapters are only above the public API.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

T = TypeVar("T")

#: a method's body: yields calls, returns the method's result
Steps = Generator[Callable[[], Any], Any, T]


def run(steps: Steps[T]) -> T:
    """Run ``steps`` with a sync lock: each call's result is its value."""
    try:
        call = next(steps)
        while True:
            try:
                result = call()
            except Exception as error:
                call = steps.throw(error)
            else:
                call = steps.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def arun(steps: Steps[T]) -> T:
    """Run ``steps`` with an asyncio lock: each call's result is awaited."""
    try:
        call = next(steps)
        while True:
            try:
                result = await call()
            except Exception as error:
                call = steps.throw(error)
            else:
                call = steps.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
