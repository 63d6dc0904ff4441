"""The fan-out protocol, the same for both transports (no I/O).

One round sends each master its calls (EVALSHA, pipelined) on a kept connection, then
reads every master's replies under one deadline. :class:`FanoutRound` is the round's
bookkeeping: what to send to whom, what each master answered, and the redo of calls a
master answered NOSCRIPT to (it restarted or was flushed: SCRIPT LOAD and the calls
again, pipelined on the same connection). The sync and asyncio transports do only the
I/O around it: take or open connections (all masters at once), send, read.

A connection whose replies did not all come in time (or whose stream broke) must be
closed, never reused: :func:`read_failed` says what the rest of its replies are.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from .effects import Call, Reply


def evalsha_args(call: Call) -> tuple[object, ...]:
    """The EVALSHA command for a call."""
    return ("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)


def connection_getter(pool: Any) -> Callable[[], Any]:
    """``pool.get_connection`` across redis-py versions (5.0 needs a command name,
    later versions warn when given one)."""
    params = inspect.signature(pool.get_connection).parameters
    first = next(iter(params.values()), None)
    if first is not None and first.default is inspect.Parameter.empty:
        return lambda: pool.get_connection("EVALSHA")
    return pool.get_connection  # type: ignore[no-any-return]


def is_noscript(reply: Reply) -> bool:
    """A master that does not know the script (restarted or flushed). Matched by class
    name: the core imports no client library, and valkey-py has a class of that name."""
    return isinstance(reply, Exception) and type(reply).__name__ == "NoScriptError"


def read_failed(out: list[Reply], count: int, error: BaseException) -> list[Reply]:
    """The replies of a connection whose stream broke (or timed out) after ``out``: the
    error stands for every reply still owed. The caller closes the connection."""
    return out + [error] * (count - len(out))


class FanoutRound:
    """One round: ``calls[i]`` for master ``i``, and what each master answered."""

    def __init__(self, calls: Sequence[Sequence[Call]]) -> None:
        self.calls = calls
        self.results: list[list[Reply]] = [[] for _ in calls]
        #: the masters this round sends to
        self.targets = [i for i, per_master in enumerate(calls) if per_master]

    def commands(self, i: int) -> list[tuple[object, ...]]:
        return [evalsha_args(c) for c in self.calls[i]]

    def count(self, i: int) -> int:
        return len(self.calls[i])

    def failed(self, i: int, error: BaseException) -> None:
        """Master ``i`` could not be sent to (or its connection broke): every call
        failed with ``error``."""
        self.results[i] = [error] * len(self.calls[i])

    def answered(self, i: int, replies: list[Reply]) -> None:
        self.results[i] = replies

    def reload(self, i: int) -> list[tuple[object, ...]] | None:
        """The pipelined commands that load the scripts master ``i`` did not know and
        run those calls again, or None when it knew them all."""
        if not any(map(is_noscript, self.results[i])):
            return None  # the usual case, checked cheaply
        redo = self._redo(i)
        sources = {c.script.sha: c.script.source for c in redo}
        commands: list[tuple[object, ...]] = [("SCRIPT", "LOAD", s) for s in sources.values()]
        return commands + [evalsha_args(c) for c in redo]

    def reloaded(self, i: int, replies: list[Reply]) -> None:
        """The replies to :meth:`reload`'s commands: the calls' new answers."""
        redo = self._redo(i)
        loads = len({c.script.sha for c in redo})
        fresh = iter(replies[loads:])
        self.results[i] = [next(fresh) if is_noscript(r) else r for r in self.results[i]]

    def _redo(self, i: int) -> list[Call]:
        return [c for c, r in zip(self.calls[i], self.results[i], strict=False) if is_noscript(r)]
