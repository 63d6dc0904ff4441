"""One beat at a time: :class:`LeaderScheduler` (to be written)."""

from __future__ import annotations

from celery.beat import Scheduler


class LeaderScheduler(Scheduler):  # type: ignore[misc]
    """Sends due tasks only while this beat leads (to be written)."""
