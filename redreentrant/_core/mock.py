"""An in-memory transport and clock for tests, in the spirit of httpx's
``MockTransport``: no server, no socket, no real time.

A :class:`MockTransport` answers every call of a round with ``handler(master, call)``
(a reply, or an exception instance standing for an error or a time-out), and records
the rounds it was given. With a :class:`FakeClock` injected into the core, a handler
can make a round slow (``clock.advance(...)``), so slow rounds, validity running out
mid-round and the watchdog's verdicts are tested deterministically. It has the shape of
:class:`~redreentrant._core.seams.Transport`, so the sync driver takes it as it is;
:class:`AsyncMockTransport`, the shape of
:class:`~redreentrant._core.seams.AsyncTransport`, is the same for the asyncio driver.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Generator

from .effects import Call, Fanout, Reply
from .fanout import FanoutRound

Handler = Callable[[int, Call], Reply]


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class MockTransport:
    """Answers each call with ``handler(master, call)``; remembers every round."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        #: every round given, as ``calls[i]`` per master
        self.rounds: list[list[list[Call]]] = []
        self.closed = False

    def fanout(self, fanout: Fanout) -> list[list[Reply]]:
        """Every master carries out its calls; their replies are read in master
        order, and once the round is decided (``early``) the rest are left unread, as a
        socket transport leaves them."""
        calls = fanout.calls
        self.rounds.append([list(per_master) for per_master in calls])
        replies = [[self.handler(i, c) for c in per_master] for i, per_master in enumerate(calls)]
        fan = FanoutRound(calls, fanout.early)
        for i in fan.targets:
            if fan.decided:
                fan.unread(i)
            else:
                fan.answered(i, replies[i])
        return fan.results

    def close(self) -> None:
        self.closed = True


@types.coroutine
def _next_turn() -> Generator[None, None, None]:
    """Give the event loop one turn (a bare yield, as ``asyncio.sleep(0)`` does), as
    a round on sockets would: other tasks may run while a round is under way."""
    yield


class AsyncMockTransport:
    """:class:`MockTransport` for the asyncio driver: each round awaited (a turn of
    the event loop), then answered as :class:`MockTransport` answers it."""

    def __init__(self, handler: Handler) -> None:
        self._mock = MockTransport(handler)

    @property
    def rounds(self) -> list[list[list[Call]]]:
        """Every round given, as ``calls[i]`` per master."""
        return self._mock.rounds

    @property
    def closed(self) -> bool:
        return self._mock.closed

    async def fanout(self, fanout: Fanout) -> list[list[Reply]]:
        await _next_turn()
        return self._mock.fanout(fanout)

    async def close(self) -> None:
        self._mock.close()
