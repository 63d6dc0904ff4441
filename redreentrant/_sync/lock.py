"""The sync locks, owned by the calling thread: :class:`Lock` and its kinds."""

from __future__ import annotations

from types import TracebackType

from .._core.engine import Engine, entry_caller
from .._core.errors import LockLostError
from .._core.kinds import FAIR, READ, UPGRADEABLE, WRITE, LockKind
from .._core.locking import LockCore
from .driver import SyncDriver
from .signals import LostSignal


class Lock(LockCore):
    """A distributed, reentrant lock owned by the thread that acquires it.

    Semantics follow :class:`threading.RLock`: the owning thread may acquire it again
    (each acquire needs its own release), and only the owner may release it. Lock
    objects are cheap views: two ``mgr.lock("x")`` objects in one thread share the
    thread's hold, and different threads (or managers) are different owners.

    Get one from :meth:`LockManager.lock`.
    """

    def __init__(
        self,
        engine: Engine,
        driver: SyncDriver,
        name: str,
        fencing: bool | None = None,
        owner: str | None = None,
        kind: LockKind | None = None,
    ) -> None:
        super().__init__(engine, name, fencing, owner, kind)
        self._driver = driver

    def acquire(
        self,
        blocking: bool = True,
        timeout: float = -1,
        lease: float | None = None,
        max_hold: float | None = None,
    ) -> bool:
        """Acquire the lock; return True once held, False if not obtained in time.

        ``blocking=False`` tries one round and returns at once. ``timeout`` (seconds,
        ``-1`` for no limit) bounds the wait of a blocking call. Waiting is woken by the
        holder's release (pub/sub) or by its lease running out.

        ``lease=None`` (the default) takes the manager's lease and lets the watchdog renew
        it while the lock is held; ``lease=seconds`` is a fixed lease, never renewed: if
        the work outlives it, the release raises :class:`LockLostError`.

        ``max_hold`` (seconds; default: the manager's) caps a watchdog-managed hold: the
        watchdog stops renewing it then, and reports it lost (``on_lost``, ``lock.lost``)
        before its validity ends, so a runaway holder cannot keep the lock forever. A
        fixed ``lease`` has no use for it (passing both raises ``ValueError``).

        Re-entry by the owner always succeeds at once (one round that records the new
        hold count and refreshes the lease), or raises :class:`LockLostError` if the
        owner's lease was lost. A re-entry keeps the hold's kind of lease: ``lease=`` on
        a watchdog-managed hold raises ``ValueError`` (changing nothing); on a fixed hold
        it sets the fixed lease anew. Raises :class:`QuorumUnavailableError` when too
        many masters fail to answer, :class:`LockKeyTypeError` if the key holds non-lock
        data, and :class:`ManagerClosedError` if the manager is (or gets) closed, the
        wait included; then nothing is held.

        A thread that ends while it holds a watchdog-managed lock has it released by the
        watchdog, with a warning and an ``on_lost`` report.
        """
        engine = self._engine
        owner = self._owner()
        steps = engine.acquire(
            self.kind, self.name, owner, blocking, timeout, lease, self.fencing, max_hold,
            caller=entry_caller(),
        )  # fmt: skip
        return self._driver.run(steps)

    def extend(self, seconds: float, replace: bool = False) -> None:
        """Extend the calling owner's fixed lease: by ``seconds``, or (``replace``) to
        ``seconds`` from now. One round, judged like an acquire: the new validity counts
        from before the round, on a quorum, less the drift allowance (see
        :attr:`valid_until`).

        Only where the owner still holds the lock: an expired key is never made again,
        and another owner's hold is never touched. Raises :class:`LockLostError` when
        the hold is gone from a quorum or its validity ran out first (the hold is then
        lost), :class:`QuorumUnavailableError` when too many masters failed,
        :class:`LockNotOwnedError` if the caller holds nothing, and ``ValueError``
        (changing nothing) on a watchdog-managed hold, which the watchdog renews.
        """
        engine = self._engine
        steps = engine.extend(self.kind, self.name, self._owner(), seconds, replace)
        self._driver.run(steps)

    def hand_off(self) -> str:
        """Hand the calling owner's hold off, to be taken over by another owner, in
        this process or any other: returns a ticket (a short text) for
        :meth:`take_over`.

        The hold leaves this owner at once, whatever its count (no release is sent,
        and the watchdog stops renewing it): the masters keep it until its lease
        ends, so a ticket never taken over frees the lock within one lease. The ticket
        carries the hold's owner id, count and fencing token. Raises
        :class:`LockNotOwnedError` if the caller holds nothing,
        :class:`LockLostError` if it was lost or its validity ran out (it stays the
        caller's to release), and ``ValueError`` on a read/write lock.
        """
        return self._driver.run(self._engine.hand_off(self.kind, self.name, self._owner()))

    def take_over(self, ticket: str, lease: float | None = None) -> None:
        """Take over the hold that ``ticket`` (from :meth:`hand_off`) carries: the
        calling owner holds it from here, with its count and fencing token, as if it
        had acquired it. One round, judged as :meth:`extend` is: the new validity counts
        from before the round, on a quorum of masters.

        ``lease=None`` gives it this manager's lease, renewed by the watchdog;
        ``lease=seconds``, a fixed lease. A ticket is taken over once: raises
        :class:`LockLostError` (nothing held) when the hold is gone (its lease ended,
        or it was taken over or released), ``ValueError`` for a ticket of another lock
        or kind, or when the caller holds this lock already, and
        :class:`QuorumUnavailableError` when too many masters failed.
        """
        engine = self._engine
        steps = engine.take_over(
            self.kind, self.name, self._owner(), ticket, lease, caller=entry_caller()
        )
        self._driver.run(steps)

    @property
    def lost(self) -> LostSignal:
        """The calling owner's hold's :class:`~redreentrant.LostSignal`: set once the
        hold is lost or its validity ran out. Raises :class:`LockNotOwnedError` if the
        caller holds nothing."""
        engine = self._engine
        hold = engine.held(self.kind, self.name, self._owner())
        return engine.signal_of(hold, lambda h: LostSignal(engine, h))

    def release(self) -> None:
        """Release one hold level; the last release frees the lock and wakes waiters.

        Raises :class:`LockNotOwnedError` (changing nothing) if the calling thread does
        not hold the lock, and :class:`LockLostError` if its lease was lost meanwhile.
        """
        engine = self._engine
        self._driver.run(engine.release(self.kind, self.name, self._owner(), False))

    def __enter__(self) -> Lock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # An inner block already raised LockLostError for this lock: unwind quietly
        # rather than raise it again at every level.
        engine = self._engine
        quiet = isinstance(exc, LockLostError)
        self._driver.run(engine.release(self.kind, self.name, self._owner(), quiet))

    def locked(self) -> bool:
        """Whether anyone holds the lock (a multi-lock: any of its names) on a quorum of
        masters (read-only rounds)."""
        return self._driver.run(self._engine.locked(self.kind, self.name))

    def force_unlock(self) -> bool:
        """Delete the lock on every master, whoever holds it, and wake its waiters.

        For operators recovering from a stuck holder: the holder is not told until its
        next renewal, re-entry or release raises :class:`LockLostError`. Returns True if
        any master had the lock.
        """
        return self._driver.run(self._engine.force_unlock(self.kind, self.name))

    def raise_fence(self, at_least: int) -> int:
        """Raise this lock's fencing counters to at least ``at_least`` on every master;
        returns how many masters acknowledged (a quorum at least, else
        :class:`QuorumUnavailableError`).

        For operators, after an acquire raised :class:`FencingError` (counters lost on
        too many masters): pass the largest token the protected resource accepted, and
        the next tokens are larger than it. Never lowers a counter. ``at_least`` is an
        ``int`` from 0 to ``2**63 - 1``, the counters' range; anything else raises
        :class:`ValueError` before anything is sent.
        """
        return self._driver.run(self._engine.raise_fence(self.kind, self.name, at_least))

    def fence_floor(self) -> int:
        """What to raise this lock's fencing counters to when no token the protected
        resource accepted is known: ``lock.raise_fence(lock.fence_floor())`` makes the
        next tokens larger than every token handed out. It is the largest counter a
        master kept and, where a master has none, its clock in microseconds (as the
        tokens of a name no master knows start), read on every master (one round,
        changing nothing; a quorum must reply, else :class:`QuorumUnavailableError`).
        """
        return self._driver.run(self._engine.fence_floor(self.kind, self.name))


class ReadLock(Lock):
    """The read side of a read/write lock: shared with other readers.

    A reader is refused while a writer holds the lock or waits for it (so a stream of
    readers cannot starve a writer). Each reader's hold has its own lease: a reader that
    dies frees its share by itself when its lease ends. The owner holding the write lock
    may take the read lock too, and keeps it after releasing the write lock (downgrade).
    """

    kind: LockKind = READ


class WriteLock(Lock):
    """The write side of a read/write lock: excludes readers and other writers.

    An owner that holds only the read lock cannot take the write lock (it would wait for
    itself forever): the attempt raises :class:`LockUpgradeError` at once, whatever the
    timeout. Release the read lock first.
    """

    kind: LockKind = WRITE


class UpgradeableReadLock(Lock):
    """The upgradeable side of a read/write lock: shared with readers, but held by one
    owner at a time and excluding writers; its holder may turn it into the write lock
    (:meth:`upgrade`) and back (:meth:`downgrade`). Only one owner can be upgrading, so
    two upgrades never wait for each other.

    Like the read side, it is refused while a writer holds the lock or waits for it.
    Its holder may also take the read lock (at once, even while a writer waits) and
    the write lock (``rw.write.acquire()`` is an upgrade, its release a downgrade). A
    holder of the read or the write lock cannot take it: :class:`LockUpgradeError` at
    once. Its last release also releases the write lock of an upgrade still in force.
    """

    kind: LockKind = UPGRADEABLE

    def upgrade(self, timeout: float = -1) -> bool:
        """Take the write lock, keeping this hold: True once the owner holds it, False
        if ``timeout`` (seconds, ``-1`` for no limit) passed first.

        Meanwhile new readers are refused, as for a waiting writer, and the owner waits
        for the other readers to leave (woken by their releases, or by their leases
        running out). The masters grant the write lock in the same script call that
        finds them gone, so no writer can come in between. When the time passes,
        nothing has changed: the owner still holds this lock, and readers may enter
        again. While upgraded the owner holds ``rw.write`` (``hold_count``, ``token``
        with fencing, ``lost``); a second upgrade re-enters it. Raises
        :class:`LockNotOwnedError` if the caller does not hold this lock, and
        :class:`LockLostError` if its hold was lost.
        """
        engine = self._engine
        steps = engine.upgrade(self.name, self._owner(), timeout, self.fencing, entry_caller())
        return self._driver.run(steps)

    def downgrade(self) -> None:
        """Release one level of the write lock an upgrade took (the last one lets
        readers in again, and wakes them); this lock stays held. Raises
        :class:`LockNotOwnedError` if the caller is not upgraded, and
        :class:`LockLostError` if the write hold was lost."""
        engine = self._engine
        self._driver.run(engine.downgrade(self.name, self._owner()))


class FairLock(Lock):
    """A reentrant lock granted first come, first served.

    Blocked acquirers queue in Redis (on every master) with a deadline in server time
    that each refreshes while it waits; a release wakes only the head of the queue. A
    waiter that gives up leaves the queue; one that dies is dropped once its deadline
    (at most one lease) passes, so the queue never sticks. ``acquire(blocking=False)``
    does not queue, and is refused while others are queued. With several masters, the
    order is the one a quorum of masters saw: see the docs for what that promises.
    Get one from :meth:`LockManager.fair_lock`.
    """

    kind: LockKind = FAIR
