"""The asyncio leader election: :class:`Election`, led by a task."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from types import FrameType, TracebackType
from typing import Any

from .._core import election
from .._core.engine import entry_caller
from .._core.errors import LockTimeoutError
from .._core.kinds import ELECTION, LockKind
from .._core.owner import new_token
from .lock import Lock


class Election(Lock):
    """The asyncio twin of :class:`redreentrant.Election`: leadership is owned by the
    task that campaigned. With ``cancel_on_loss`` (``mgr.election(name,
    cancel_on_loss=True)``), the leading task is cancelled once its leadership is lost.
    Get one from :meth:`LockManager.election`."""

    kind: LockKind = ELECTION
    fixed_fencing = True

    def campaign(self, value: bytes | str = b"", timeout: float = -1) -> Campaign:
        """Wait until the current task leads, then proclaim ``value`` (see
        :meth:`redreentrant.Election.campaign`): ``await election.campaign(...)``
        returns this election, ``async with election.campaign(...):`` leads for the
        block and resigns at its end."""
        value = election.check_value(value)
        caller = entry_caller()
        return Campaign(self, lambda: self._campaign(value, True, timeout, caller), timeout)

    async def _campaign(
        self, value: bytes, blocking: bool, timeout: float, caller: FrameType | None
    ) -> bool:
        return await self._first_hold(self.kind, lambda owner, signal: election.campaign(
            self._engine, ELECTION, self.name, owner, value, blocking, timeout, signal, caller
        ))  # fmt: skip

    async def acquire(
        self,
        blocking: bool = True,
        timeout: float = -1,
        lease: float | None = None,
        max_hold: float | None = None,
    ) -> bool:
        """See :meth:`redreentrant.Election.acquire`."""
        self._refuse_own_task(inspect.currentframe(), "election.acquire()")
        if lease is not None or max_hold is not None:
            raise ValueError("an election takes no lease= or max_hold=: the watchdog renews it")
        if self.is_owned():
            return True
        return await self._campaign(b"", blocking, timeout, entry_caller())

    async def resign(self) -> None:
        """See :meth:`redreentrant.Election.resign`."""
        await self.release()

    @property
    def term(self) -> int:
        """See :attr:`redreentrant.Election.term`."""
        return self.token

    async def proclaim(self, value: bytes | str) -> None:
        """See :meth:`redreentrant.Election.proclaim`."""
        engine = self._engine
        value = election.check_value(value)
        steps = election.proclaim(engine, ELECTION, self.name, self._owner(), value)
        await self._driver.run(steps)

    async def leader(self) -> election.LeaderView | None:
        """See :meth:`redreentrant.Election.leader`."""
        return await self._driver.run(election.leader(self._engine.quorum, ELECTION, self.name))

    async def observe(self) -> AsyncIterator[election.LeaderView | None]:
        """See :meth:`redreentrant.Election.observe`: an async iterator."""
        engine = self._engine
        seen = election.Observation(engine, ELECTION, self.name, f"{engine.id}:{new_token('o')}")
        hub = self._driver.hub
        seen.generation = await hub.watch(seen.channel, seen.observer, log=True)
        try:
            while True:
                yield await self._driver.run(seen.next())
        finally:
            hub.unwatch(seen.channel, seen.observer)

    async def __aenter__(self) -> Election:
        self._refuse_own_task(inspect.currentframe(), "election.__aenter__()")
        await self.acquire()
        return self


class Campaign:
    """What :meth:`Election.campaign` returns: awaited, it campaigns and gives the
    election; as an async context manager, it campaigns, and resigns at the end."""

    def __init__(
        self, election: Election, run: Callable[[], Awaitable[bool]], timeout: float
    ) -> None:
        self.election = election
        self._run_campaign = run
        self._timeout = timeout

    async def _run(self) -> Election:
        if not await self._run_campaign():
            raise LockTimeoutError(self.election.name, self._timeout, "another candidate leads")
        return self.election

    def __await__(self) -> Generator[Any, None, Election]:
        return self._run().__await__()

    async def __aenter__(self) -> Election:
        return await self._run()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.election.__aexit__(exc_type, exc, tb)
