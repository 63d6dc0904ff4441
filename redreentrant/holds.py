"""What a manager knows locally about the holds its owners have."""

from __future__ import annotations

import threading
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

    @property
    def ident(self) -> tuple[str, str, str]:
        return (self.kind.label, self.name, self.owner)


class Holds:
    """A thread-safe table of the holds of one manager, keyed by (kind, name, owner)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
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

    def all(self) -> list[Hold]:
        with self._lock:
            return list(self._table.values())

    def clear(self) -> None:
        with self._lock:
            self._table.clear()
