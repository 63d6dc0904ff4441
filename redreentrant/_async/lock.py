"""The asyncio locks: the same semantics as the sync ones, owned by tasks."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine
from types import FrameType, TracebackType
from typing import Any

from .._core.effects import Steps
from .._core.engine import Engine, entry_caller
from .._core.errors import LockLostError, LockOwnerError
from .._core.kinds import FAIR, READ, UPGRADEABLE, WRITE, LockKind
from .._core.locking import LockCore
from .driver import AsyncDriver
from .owner import current_task
from .signals import LostSignal


def refuse_a_task_of_its_own(frame: FrameType | None, what: str) -> None:
    """Raise :class:`LockOwnerError` when the coroutine running in ``frame`` is the
    whole of the current task (``create_task(lock.acquire())``, ``gather``, or
    ``asyncio.wait_for`` before Python 3.12): that task would own the hold and end at
    once, leaving a lock nobody can use or release."""
    coro = current_task().get_coro()
    if getattr(coro, "cr_frame", None) is frame:
        raise LockOwnerError(
            f"{what} ran as a task of its own (asyncio.create_task, gather, or"
            " asyncio.wait_for before Python 3.12), which would own the lock and end at"
            " once. Await it in the task that uses the lock: 'await lock.acquire(timeout=t)'"
            " instead of 'asyncio.wait_for(lock.acquire(), t)', or 'async with lock:'"
            " inside the coroutine that needs it"
        )


class Lock(LockCore):
    """The asyncio twin of :class:`redreentrant.Lock`, owned by the current task.

    Re-entry within a task counts; another task (even of the same thread and loop) is a
    different owner. See :meth:`redreentrant.Lock.acquire` for the full semantics.
    Cancelling an acquire undoes whatever it had taken on every master (and leaves a
    fair lock's queue) before the cancellation propagates; a release runs to its end
    even if the task awaiting it is cancelled.
    """

    def __init__(
        self,
        engine: Engine,
        driver: AsyncDriver,
        name: str,
        fencing: bool | None = None,
        cancel_on_loss: bool = False,
        owner: str | None = None,
        kind: LockKind | None = None,
    ) -> None:
        super().__init__(engine, name, fencing, owner, kind)
        self._driver = driver
        if not isinstance(cancel_on_loss, bool):
            raise TypeError(f"cancel_on_loss must be True or False, not {cancel_on_loss!r}")
        #: cancel the owning task when its hold is lost (see the asyncio docs)
        self.cancel_on_loss = cancel_on_loss

    def _refuse_own_task(self, frame: FrameType | None, what: str) -> None:
        # An owner= object's holds are its own, whichever task takes them.
        if self._owner_token is None:
            refuse_a_task_of_its_own(frame, what)

    async def acquire(
        self,
        blocking: bool = True,
        timeout: float = -1,
        lease: float | None = None,
        max_hold: float | None = None,
    ) -> bool:
        """Acquire the lock; True once held, False if not obtained in time.

        The current task becomes the owner. Raises :class:`LockOwnerError`, holding
        nothing, when this coroutine is the whole of a task made just to run it (see
        the asyncio docs: use ``acquire(timeout=...)`` rather than
        ``asyncio.wait_for``). See :meth:`redreentrant.Lock.acquire` for the rest.

        With ``cancel_on_loss`` (``mgr.lock(name, cancel_on_loss=True)``), a first hold
        cancels the owning task once it is lost (also when a fixed lease runs out)."""
        self._refuse_own_task(inspect.currentframe(), "lock.acquire()")
        caller = entry_caller()
        return await self._first_hold(self.kind, lambda owner, signal: self._engine.acquire(
            self.kind, self.name, owner, blocking, timeout, lease, self.fencing, max_hold,
            signal, caller,
        ))  # fmt: skip

    def _first_hold(
        self, kind: LockKind, steps: Callable[[str, LostSignal | None], Steps[bool]]
    ) -> Coroutine[Any, Any, bool]:
        """Run ``steps(owner, signal)`` that may take the owner's hold of ``kind``; with
        ``cancel_on_loss``, a first hold gets a signal that cancels this task once the
        hold is lost. (Without one, the driver's run, awaited by the caller: no
        coroutine of its own on every acquire.)"""
        engine, owner = self._engine, self._owner()
        if not self.cancel_on_loss or engine.holds.get(kind, self.name, owner) is not None:
            return self._driver.run(steps(owner, None))
        signal = LostSignal(engine)
        signal.task = current_task()
        return self._signalled(steps(owner, signal), signal, kind, owner)

    async def _signalled(
        self, steps: Steps[bool], signal: LostSignal, kind: LockKind, owner: str
    ) -> bool:
        got = await self._driver.run(steps)
        if got:
            signal.attach(self._engine.held(kind, self.name, owner))
        return got

    async def extend(self, seconds: float, replace: bool = False) -> None:
        """See :meth:`redreentrant.Lock.extend`."""
        engine = self._engine
        steps = engine.extend(self.kind, self.name, self._owner(), seconds, replace)
        await self._driver.run(steps)

    async def hand_off(self) -> str:
        """See :meth:`redreentrant.Lock.hand_off`."""
        return await self._driver.run(self._engine.hand_off(self.kind, self.name, self._owner()))

    async def take_over(self, ticket: str, lease: float | None = None) -> None:
        """See :meth:`redreentrant.Lock.take_over`; the current task becomes the owner
        (and, with ``cancel_on_loss``, is cancelled once the hold is lost)."""
        self._refuse_own_task(inspect.currentframe(), "lock.take_over()")
        caller = entry_caller()
        await self._first_hold(self.kind, lambda owner, signal: self._engine.take_over(
            self.kind, self.name, owner, ticket, lease, signal, caller,
        ))  # fmt: skip

    @property
    def lost(self) -> LostSignal:
        """The current task's hold's :class:`~redreentrant.asyncio.LostSignal` (see
        :attr:`redreentrant.Lock.lost`); :class:`LockNotOwnedError` if it holds nothing."""
        engine = self._engine
        hold = engine.held(self.kind, self.name, self._owner())
        return engine.signal_of(hold, lambda h: LostSignal(engine, h))

    async def release(self) -> None:
        """Release one hold level; the last release frees the lock and wakes waiters."""
        engine = self._engine
        await self._driver.run_shielded(engine.release(self.kind, self.name, self._owner(), False))

    async def __aenter__(self) -> Lock:
        self._refuse_own_task(inspect.currentframe(), "lock.__aenter__()")
        await self.acquire()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # An inner block already raised LockLostError for this lock: unwind quietly.
        engine = self._engine
        owner = self._owner()
        hold = self._hold()
        signal = hold.signal if hold is not None else None
        by_loss = (
            isinstance(exc, asyncio.CancelledError)
            and isinstance(signal, LostSignal)
            and signal.cancelled
            and hold is not None
            and hold.count == 1
        )
        quiet = isinstance(exc, LockLostError) or by_loss
        await self._driver.run_shielded(engine.release(self.kind, self.name, owner, quiet))
        if by_loss:
            # This block was cancelled because its hold was lost: say so, as
            # asyncio.timeout() turns its own cancellation into TimeoutError.
            uncancel = getattr(current_task(), "uncancel", None)
            if uncancel is not None:  # Python 3.11+
                uncancel()
            assert hold is not None
            raise LockLostError(f"lock {self.name!r} was lost: {hold.lost}") from exc

    async def locked(self) -> bool:
        """Whether anyone holds the lock (a multi-lock: any of its names) on a quorum of
        masters (read-only rounds)."""
        return await self._driver.run(self._engine.locked(self.kind, self.name))

    async def force_unlock(self) -> bool:
        """Delete the lock on every master, whoever holds it, and wake its waiters."""
        return await self._driver.run(self._engine.force_unlock(self.kind, self.name))

    async def raise_fence(self, at_least: int) -> int:
        """See :meth:`redreentrant.Lock.raise_fence`."""
        steps = self._engine.raise_fence(self.kind, self.name, at_least)
        return await self._driver.run(steps)

    async def fence_floor(self) -> int:
        """See :meth:`redreentrant.Lock.fence_floor`."""
        return await self._driver.run(self._engine.fence_floor(self.kind, self.name))


class ReadLock(Lock):
    """The asyncio twin of :class:`redreentrant.ReadLock`."""

    kind: LockKind = READ


class WriteLock(Lock):
    """The asyncio twin of :class:`redreentrant.WriteLock`."""

    kind: LockKind = WRITE


class UpgradeableReadLock(Lock):
    """The asyncio twin of :class:`redreentrant.UpgradeableReadLock`."""

    kind: LockKind = UPGRADEABLE

    async def upgrade(self, timeout: float = -1) -> bool:
        """See :meth:`redreentrant.UpgradeableReadLock.upgrade`. Cancelling it leaves
        the owner an upgradeable reader, as a timeout does."""
        self._refuse_own_task(inspect.currentframe(), "lock.upgrade()")
        caller = entry_caller()
        # The write hold's signal, as rw.write.acquire() makes.
        return await self._first_hold(WRITE, lambda owner, signal: self._engine.upgrade(
            self.name, owner, timeout, self.fencing, caller, signal
        ))  # fmt: skip

    async def downgrade(self) -> None:
        """See :meth:`redreentrant.UpgradeableReadLock.downgrade`."""
        engine = self._engine
        await self._driver.run_shielded(engine.downgrade(self.name, self._owner()))


class FairLock(Lock):
    """The asyncio twin of :class:`redreentrant.FairLock`."""

    kind: LockKind = FAIR
