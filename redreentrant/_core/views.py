"""What ``inspect`` reports: each master's view of the locks under one name."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LockView:
    """One lock kind present under a name on one master."""

    kind: str
    """The lock's family: ``"lock"``, ``"rw"``, ``"fair"``, ``"semaphore"`` or
    ``"election"``."""
    mode: str | None
    """``"read"`` or ``"write"`` for a read/write lock, else None."""
    ttl: float | None
    """Seconds left on the lock's key (None if it has no TTL)."""
    holders: dict[str, int] = field(default_factory=dict)
    """Owner id -> hold count. A writer that also reads appears once per side."""
    queue: list[str] = field(default_factory=list)
    """Waiting owners in order: a fair lock's queue, a read/write lock's waiting writers,
    a plain lock's registered waiters (in the order releases wake them)."""
    slots: dict[str, int] = field(default_factory=dict)
    """A semaphore's holders' permit slots (owner id -> slot number, from 0)."""


@dataclass
class MasterView:
    """One master's answer to ``inspect``."""

    master: str
    error: str | None = None
    locks: list[LockView] = field(default_factory=list)
    quarantined: float = 0.0
    """Seconds left before the master's votes count: its memory began lately (first
    use, a restart without its data, a flush, an eviction, a failover); 0.0 none.
    See docs/safety.md."""
    memory: float | None = None
    """Seconds since the master's memory began; None: no record yet (the next try
    makes it, and the quarantine begins) or a Redis Cluster member (keeps none)."""
    failover: bool = False
    """The master's memory began with a failover (a replica promoted)."""
