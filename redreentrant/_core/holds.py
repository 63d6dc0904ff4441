"""What a manager knows locally about the holds its owners have."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from .kinds import LockKind


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
    #: where the first acquire was called (``file:line in function``), for warnings
    site: str = "?"

    @property
    def ident(self) -> tuple[str, str, str]:
        return (self.kind.label, self.name, self.owner)

    @property
    def token(self) -> str:
        """The owner's thread or task token (the last part of the owner id)."""
        return self.owner.rpartition(":")[2]


class Holds:
    """A table of the holds of one manager, keyed by (kind, name, owner).

    ``lock`` guards its changes: the flavour passes a ``threading.Lock`` (the watchdog's
    threads, the owners' threads, and asyncio's end-of-task callbacks all touch it)."""

    def __init__(self, lock: AbstractContextManager[object]) -> None:
        self._lock = lock
        self._table: dict[tuple[str, str, str], Hold] = {}

    def get(self, kind: LockKind, name: str, owner: str) -> Hold | None:
        return self._table.get((kind.label, name, owner))

    def add(self, hold: Hold) -> None:
        with self._lock:
            self._table[hold.ident] = hold

    def remove(self, hold: Hold) -> None:
        with self._lock:
            if self._table.get(hold.ident) is hold:
                del self._table[hold.ident]

    def is_current(self, hold: Hold) -> bool:
        return self._table.get(hold.ident) is hold

    def managed(self) -> list[Hold]:
        """The holds the watchdog must renew (not lost, not fixed-lease)."""
        with self._lock:
            return [h for h in self._table.values() if h.managed and h.lost is None]

    def owned_by(self, token: str) -> bool:
        """Whether an owner with this token has a watchdog-managed hold here."""
        with self._lock:
            return any(h.managed and h.token == token for h in self._table.values())

    def take_dead(self, alive: Callable[[str], bool]) -> list[Hold]:
        """Remove the managed holds whose owner has ended, marked lost, and return them
        (the watchdog releases them and reports them)."""
        dead: list[Hold] = []
        with self._lock:
            for h in list(self._table.values()):
                if h.managed and h.lost is None and not alive(h.token):
                    h.lost = "its owner ended while holding it"
                    del self._table[h.ident]
                    dead.append(h)
        return dead

    def renewed(self, hold: Hold, valid_until: float) -> bool:
        """Record a renewal of ``hold``, unless it was released or found lost meanwhile."""
        with self._lock:
            if hold.lost is not None or self._table.get(hold.ident) is not hold:
                return False
            hold.valid_until = valid_until
            return True

    def mark_lost(self, hold: Hold, why: str) -> bool:
        """Mark ``hold`` lost (True), unless it was released or lost already."""
        with self._lock:
            if hold.lost is not None or self._table.get(hold.ident) is not hold:
                return False
            hold.lost = why
            return True

    def overdue(self, now: float, margin: float) -> list[Hold]:
        """Mark lost, and return, the managed holds whose validity ends within
        ``margin`` of ``now`` without a renewal: reported before their validity ends."""
        out: list[Hold] = []
        with self._lock:
            for h in self._table.values():
                if h.managed and h.lost is None and h.valid_until - margin <= now:
                    h.lost = "the lease could not be renewed on a quorum before its validity ended"
                    out.append(h)
        return out

    def next_deadline(self, margin: float) -> float | None:
        """When the next managed hold becomes overdue (see :meth:`overdue`), if any."""
        with self._lock:
            ends = [h.valid_until for h in self._table.values() if h.managed and h.lost is None]
        return min(ends) - margin if ends else None

    def all(self) -> list[Hold]:
        with self._lock:
            return list(self._table.values())

    def clear(self) -> None:
        with self._lock:
            self._table.clear()
