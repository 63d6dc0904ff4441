"""What a manager knows locally about the holds its owners have."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from .kinds import LockKind


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
    #: the fencing token of the first grant (None: taken without fencing)
    fencing_token: int | None = None
    #: when the first grant was taken (monotonic clock)
    acquired_at: float = 0.0
    #: the watchdog stops renewing it then (``max_hold``; monotonic clock; None: never)
    renew_until: float | None = None
    #: told once the hold is lost (see :meth:`lose`)
    signal: Signal | None = None
    #: the hold's key in the table: ``(kind label, name, owner)``
    ident: tuple[str, str, str] = field(init=False, repr=False)
    #: the owner's thread or task token (the last part of the owner id)
    token: str = field(init=False, repr=False)

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

    def __init__(self, lock: AbstractContextManager[object]) -> None:
        self._lock = lock
        self._table: dict[tuple[str, str, str], Hold] = {}
        # The deadline clock's queue: one entry per managed hold, ``(valid_until when
        # queued, n, hold)``. An entry is brought up to date only when it comes to the
        # top (validity only moves later), and dropped there once its hold is gone, so
        # neither a renewal nor a look at the next deadline scans every hold.
        self._deadlines: list[tuple[float, int, Hold]] = []
        self._order = itertools.count()
        # The managed holds by owner token: liveness is checked per owner, not per hold.
        self._by_token: dict[str, set[Hold]] = {}

    def get(self, kind: LockKind, name: str, owner: str) -> Hold | None:
        return self._table.get((kind.label, name, owner))

    def add(self, hold: Hold) -> None:
        ident = hold.ident
        with self._lock:
            old = self._table.get(ident)
            if old is not None:
                self._forget(old)
            self._table[ident] = hold
            if hold.managed:
                heap = self._deadlines
                if len(heap) > 2 * len(self._table) + 64:
                    self._compact()
                heapq.heappush(heap, (hold.valid_until, next(self._order), hold))
                owned = self._by_token.get(hold.token)
                if owned is None:
                    self._by_token[hold.token] = {hold}
                else:
                    owned.add(hold)

    def _forget(self, hold: Hold) -> None:
        """Take ``hold`` off the table (under the lock)."""
        del self._table[hold.ident]
        owned = self._by_token.get(hold.token)
        if owned is not None:
            owned.discard(hold)
            if not owned:
                del self._by_token[hold.token]

    def _compact(self) -> None:
        """Drop the queue's entries of holds that are gone (under the lock).

        A released hold's entry stays queued until it comes to the top, which may be a
        lease away: a lock taken and released in a loop would pile up entries (and the
        holds they keep alive) meanwhile. Done when most entries are stale, so its cost
        is a constant share of each add."""
        table = self._table
        kept: dict[int, tuple[float, int, Hold]] = {}
        for entry in self._deadlines:
            h = entry[2]
            if h.lost is None and table.get(h.ident) is h:
                kept.setdefault(id(h), entry)  # one entry per hold (a hold added again)
        self._deadlines[:] = kept.values()
        heapq.heapify(self._deadlines)

    def _first(self) -> Hold | None:
        """The managed hold whose validity ends first (under the lock)."""
        heap = self._deadlines
        while heap:
            queued, _, h = heap[0]
            if h.lost is not None or self._table.get(h.ident) is not h:
                heapq.heappop(heap)
            elif queued < h.valid_until:
                heapq.heapreplace(heap, (h.valid_until, next(self._order), h))
            else:
                return h
        return None

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

    def owned_by(self, token: str) -> bool:
        """Whether an owner with this token has a watchdog-managed hold here."""
        with self._lock:
            return token in self._by_token

    def take_dead(self, alive: Callable[[str], bool]) -> list[Hold]:
        """Remove the managed holds whose owner has ended, marked lost, and return them
        (the watchdog releases them and reports them)."""
        dead: list[Hold] = []
        with self._lock:
            for token in [t for t in self._by_token if not alive(t)]:
                for h in list(self._by_token[token]):
                    if h.lose("its owner ended while holding it"):
                        dead.append(h)
                    self._forget(h)
        return dead

    def renewed(self, hold: Hold, valid_until: float) -> bool:
        """Record a renewal of ``hold``, unless it was released or found lost meanwhile."""
        return self.renewed_all([hold], valid_until) == 1

    def renewed_all(self, holds: Sequence[Hold], valid_until: float) -> int:
        """:meth:`renewed` for many holds, under one lock; how many were recorded."""
        done = 0
        table = self._table
        with self._lock:
            for hold in holds:
                if hold.lost is None and table.get(hold.ident) is hold:
                    hold.valid_until = valid_until
                    done += 1
        return done

    def mark_lost(self, hold: Hold, why: str) -> bool:
        """Mark ``hold`` lost (True), unless it was released or lost already."""
        with self._lock:
            if self._table.get(hold.ident) is not hold:
                return False
            return hold.lose(why)

    def overdue(self, now: float, margin: float) -> list[Hold]:
        """Mark lost, and return, the managed holds whose validity ends within
        ``margin`` of ``now`` without a renewal: reported before their validity ends."""
        out: list[Hold] = []
        with self._lock:
            while (h := self._first()) is not None and h.valid_until - margin <= now:
                if h.renew_until is not None and h.renew_until <= now:
                    why = "it was held for its max_hold: the watchdog stopped renewing it"
                else:
                    why = "the lease could not be renewed on a quorum before its validity ended"
                h.lose(why)
                heapq.heappop(self._deadlines)
                out.append(h)
        return out

    def next_deadline(self, margin: float) -> float | None:
        """When the next managed hold becomes overdue (see :meth:`overdue`), if any."""
        with self._lock:
            h = self._first()
        return None if h is None else h.valid_until - margin

    def all(self) -> list[Hold]:
        with self._lock:
            return list(self._table.values())

    def clear(self) -> None:
        with self._lock:
            self._table.clear()
            self._deadlines.clear()
            self._by_token.clear()
