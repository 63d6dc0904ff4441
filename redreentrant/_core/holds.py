"""What a manager knows locally about the holds its owners have."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

from .kinds import LockKind

#: how many queue entries and holds one look of the deadline clock reads at most (see
#: :meth:`Holds.overdue`): the holds' lock is held meanwhile, which every acquire and
#: release needs; the clock looks again at once for the rest
LOOK_BUDGET = 512


class Guard(Protocol):
    """A lock (a ``threading.Lock``): held as a context manager, or tried."""

    def __enter__(self) -> object: ...
    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None: ...
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...
    def release(self) -> None: ...


class Signal(Protocol):
    """What tells a hold's work that the hold was lost (the flavour's event)."""

    def notify_lost(self) -> None:
        """The hold was lost (called once, from any thread)."""


@dataclass(eq=False)
class Hold:
    """One owner's hold on one lock, as this process knows it.

    ``count`` is the owner's reentrancy depth. ``valid_until`` is the end of the
    validity (on ``time.monotonic()``) from the last grant or renewal on a quorum.
    """

    kind: LockKind
    name: str
    owner: str
    count: int
    lease: float
    #: renewed by the watchdog (``lease=None`` at the first acquire)
    managed: bool
    valid_until: float
    lost: str | None = None
    #: where the first acquire was called (its ``str()``: ``file:line in function``),
    #: for warnings
    site: object = "?"
    #: the fencing token of the first grant (None: taken without fencing; a tuple: a
    #: multi-lock's, one per name)
    fencing_token: int | tuple[int, ...] | None = None
    #: when the first grant was taken (monotonic clock)
    acquired_at: float = 0.0
    #: the watchdog stops renewing it then (``max_hold``; monotonic clock; None: never)
    renew_until: float | None = None
    #: told once the hold is lost (see :meth:`lose`)
    signal: Signal | None = None
    #: the tag of the try (or hand-over) that made it: every call about the hold
    #: carries it (see :func:`~.kinds.hold_value`)
    tag: int = 0
    #: the hold's key in the table: ``(kind label, name, owner)``
    ident: tuple[str, str, str] = field(init=False, repr=False)
    #: the owner's thread or task token (the last part of the owner id)
    token: str = field(init=False, repr=False)
    #: its newest entry in the deadline clock's queue (see :class:`Holds`)
    entry: list[Any] | None = field(default=None, init=False, repr=False)
    #: a renewal round of it is under way (see :func:`~.watchdog.tick_steps`)
    renewing: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        # Looked up on every add and remove of the hold: worked out once.
        self.ident = (self.kind.label, self.name, self.owner)
        self.token = self.owner.rpartition(":")[2]

    def lose(self, why: str) -> bool:
        """Mark the hold lost (True), unless it was already; tell its signal."""
        if self.lost is not None:
            return False
        self.lost = why
        if self.signal is not None:
            self.signal.notify_lost()
        return True


class Holds:
    """A table of the holds of one manager, keyed by (kind, name, owner).

    ``lock`` guards its changes: the flavour passes a ``threading.Lock`` (the watchdog's
    threads, the owners' threads, and asyncio's end-of-task callbacks all touch it)."""

    def __init__(self, lock: Guard) -> None:
        self._lock = lock
        self._table: dict[tuple[str, str, str], Hold] = {}
        # The deadline clock's queue: ``[validity, n, holds, live]``, one entry per hold
        # taken and one per renewal round (its holds, all renewed to one validity).
        # ``live`` counts the holds whose newest entry it is (``Hold.entry``): an entry
        # whose holds all moved on (renewed since, or released) is passed over without
        # reading them when it comes to the top, so a renewal of thousands of holds
        # adds one entry and costs a look one pop. A hold whose validity moved without a
        # new entry (a re-entry) is queued again when its entry comes to the top.
        self._deadlines: list[list[Any]] = []
        self._order = itertools.count()
        # The holds by owner token: liveness is checked per owner, not per hold.
        self._by_token: dict[str, set[Hold]] = {}
        #: (name, owner) -> how many of the owner's multi-lock holds take that name
        self.in_multi: dict[tuple[str, str], int] = {}

    def get(self, kind: LockKind, name: str, owner: str) -> Hold | None:
        return self._table.get((kind.label, name, owner))

    def add(self, hold: Hold) -> None:
        ident = hold.ident
        with self._lock:
            old = self._table.get(ident)
            if old is not None:
                self._forget(old)
            self._table[ident] = hold
            if hold.kind.names:
                self._count_names(hold, 1)
            if hold.managed:
                heap = self._deadlines
                if len(heap) > 2 * len(self._table) + 64:
                    self._compact()
                self._queue((hold,), hold.valid_until)
            owned = self._by_token.get(hold.token)
            if owned is None:
                self._by_token[hold.token] = {hold}
            else:
                owned.add(hold)

    def _forget(self, hold: Hold) -> None:
        """Take ``hold`` off the table (under the lock)."""
        del self._table[hold.ident]
        if hold.kind.names:
            self._count_names(hold, -1)
        entry = hold.entry
        if entry is not None:
            entry[3] -= 1
            hold.entry = None
        owned = self._by_token.get(hold.token)
        if owned is not None:
            owned.discard(hold)
            if not owned:
                del self._by_token[hold.token]

    def _count_names(self, hold: Hold, step: int) -> None:
        """Count ``hold``'s names in :attr:`in_multi` (``step`` 1) or no more (-1)."""
        counts = self.in_multi
        for name in hold.kind.names:
            key = (name, hold.owner)
            n = counts.get(key, 0) + step
            if n > 0:
                counts[key] = n
            else:
                counts.pop(key, None)

    def _queue(self, holds: tuple[Hold, ...], valid_until: float) -> None:
        """Queue ``holds`` for the deadline clock at ``valid_until`` (under the lock)."""
        entry: list[Any] = [valid_until, next(self._order), holds, len(holds)]
        for h in holds:
            old = h.entry
            if old is not None:
                old[3] -= 1
            h.entry = entry
        heapq.heappush(self._deadlines, entry)

    def _compact(self) -> None:
        """Queue the current managed holds afresh, one entry each (under the lock).

        A released hold's entries stay queued until they come to the top, which may be
        a lease away: a lock taken and released in a loop would pile up entries
        meanwhile. Done when the queue holds more than twice as many entries as the
        table holds, so its cost is a constant share of each add."""
        self._deadlines.clear()
        for h in self._table.values():
            h.entry = None
            if h.managed and h.lost is None:
                self._queue((h,), h.valid_until)

    def _due(self, entry: list[Any]) -> list[Hold]:
        """The holds an entry at the top of the queue still stands for (under the lock):
        current, and this is their newest entry. One whose validity moved on without a
        new entry is queued again."""
        if not entry[3]:
            return []
        queued: float = entry[0]
        holds: tuple[Hold, ...] = entry[2]
        table = self._table
        out: list[Hold] = []
        for h in holds:
            if h.entry is not entry or h.lost is not None or table.get(h.ident) is not h:
                continue
            if h.valid_until > queued:
                self._queue((h,), h.valid_until)
            else:
                out.append(h)
        return out

    def remove(self, hold: Hold) -> None:
        with self._lock:
            if self._table.get(hold.ident) is hold:
                self._forget(hold)

    def is_current(self, hold: Hold) -> bool:
        return self._table.get(hold.ident) is hold

    def managed(self, now: float | None = None) -> list[Hold]:
        """The holds the watchdog must renew (not lost, not fixed-lease, and, at
        ``now``, not held past their ``max_hold``)."""
        with self._lock:
            return [
                h
                for h in self._table.values()
                if h.managed
                and h.lost is None
                and (now is None or h.renew_until is None or h.renew_until > now)
            ]

    def ended(self, token: str) -> bool:
        """The owner of ``token`` ended: its fixed-lease holds are forgotten (nobody can
        release them: they lapse on the masters); whether it has holds here
        (:meth:`take_dead` then releases and reports the watchdog-managed ones).

        Never waits for the table's lock: the garbage collector ends an ``owner=`` object
        wherever it runs, also in a thread that holds it. The lock taken elsewhere, the
        fixed-lease holds stay until :meth:`take_dead`."""
        if not self._lock.acquire(blocking=False):
            return token in self._by_token
        try:
            owned = self._by_token.get(token, ())
            for h in [h for h in owned if not h.managed]:
                self._forget(h)
            return token in self._by_token
        finally:
            self._lock.release()

    def take_dead(self, alive: Callable[[str], bool]) -> list[Hold]:
        """Remove the holds whose owner has ended; the managed ones are marked lost and
        returned (the watchdog releases them and reports them)."""
        dead: list[Hold] = []
        with self._lock:
            for token in [t for t in self._by_token if not alive(t)]:
                for h in list(self._by_token[token]):
                    if h.managed and h.lose("its owner ended while holding it"):
                        dead.append(h)
                    self._forget(h)
        return dead

    def renewed(self, hold: Hold, valid_until: float) -> bool:
        """Record a renewal of ``hold``, unless it was released or found lost meanwhile."""
        return self.renewed_all([hold], valid_until) == 1

    def renewed_all(self, holds: Sequence[Hold], valid_until: float) -> int:
        """:meth:`renewed` for many holds, under one lock; how many were recorded."""
        renewed: list[Hold] = []
        table = self._table
        with self._lock:
            for hold in holds:
                if hold.lost is None and table.get(hold.ident) is hold:
                    hold.valid_until = valid_until
                    renewed.append(hold)
            if renewed:
                self._queue(tuple(renewed), valid_until)
        return len(renewed)

    def mark_lost(self, hold: Hold, why: str) -> bool:
        """Mark ``hold`` lost (True), unless it was released or lost already."""
        with self._lock:
            if self._table.get(hold.ident) is not hold:
                return False
            return hold.lose(why)

    def overdue(self, now: float, margin: float) -> list[Hold]:
        """Mark lost, and return, the managed holds whose validity ends within
        ``margin`` of ``now`` without a renewal: reported before their validity ends.

        At most :data:`LOOK_BUDGET` entries and holds are read: when more were due,
        the rest is left to the next look, which :meth:`next_deadline` then puts at
        once."""
        out: list[Hold] = []
        heap = self._deadlines
        budget = LOOK_BUDGET
        with self._lock:
            while heap and heap[0][0] - margin <= now and budget > 0:
                entry = heapq.heappop(heap)
                budget -= 1 + (len(entry[2]) if entry[3] else 0)
                for h in self._due(entry):
                    if h.renew_until is not None and h.renew_until <= now:
                        why = "it was held for its max_hold: the watchdog stopped renewing it"
                    else:
                        why = "the lease could not be renewed on a quorum before its validity ended"
                    h.lose(why)
                    out.append(h)
        return out

    def next_deadline(self, margin: float) -> float | None:
        """When the next managed hold becomes overdue (see :meth:`overdue`), if any; or
        earlier, when passing over the entries at the top of the queue that stand for
        no hold any more (each renewal round leaves one behind) would read more than
        :data:`LOOK_BUDGET` entries and holds: the clock then looks again sooner for
        the rest."""
        heap = self._deadlines
        budget = LOOK_BUDGET
        with self._lock:
            while heap and budget > 0:
                entry = heap[0]
                if self._due(entry):
                    break
                heapq.heappop(heap)  # stands for no hold any more (or queued again)
                budget -= 1 + (len(entry[2]) if entry[3] else 0)
            return heap[0][0] - margin if heap else None

    def all(self) -> list[Hold]:
        with self._lock:
            return list(self._table.values())

    def clear(self) -> None:
        with self._lock:
            self._table.clear()
            self._deadlines.clear()
            self._by_token.clear()
            self.in_multi.clear()
