"""Listeners: what a manager tells about its locks, for metrics and tracing (no I/O).

A :class:`LockListener` gets a call for each event of interest; every method is a
no-op here, so a listener overrides only what it needs. A manager without a listener
skips all of it (one ``is None`` check per operation). A listener that raises is
logged and otherwise ignored: it never changes what a lock does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LockInfo:
    """Which lock an event is about."""

    #: the lock's name
    name: str
    #: its kind: ``"lock"``, ``"rw:read"``, ``"rw:write"``, ``"rw:upgradeable"``,
    #: ``"fair"``, ``"semaphore"``, ``"election"`` or ``"multi"`` (whose name is its
    #: names, as a JSON list)
    kind: str
    #: the owner id (``<manager id>:<thread or task token>``)
    owner: str


class LockListener:
    """The events of one manager's locks; override the ones you need.

    The methods are called synchronously, in the thread (or event loop) where the event
    happens: an owner's thread or task, or the watchdog's. Keep them quick and
    thread-safe; hand slow work to a queue. What they raise is logged and ignored.
    Pass one to the manager: ``LockManager(..., listener=MyListener())``.
    """

    def acquire_started(self, lock: LockInfo) -> None:
        """A first acquire began (re-entries are not reported)."""

    def acquired(
        self, lock: LockInfo, wait: float, votes: int, masters: int, token: int | None
    ) -> None:
        """It was granted after ``wait`` seconds, by ``votes`` of ``masters`` masters
        (with its fencing ``token``, if any). The round stops reading once a quorum
        granted, so ``votes`` counts the grants read: at least the quorum."""

    def acquire_failed(self, lock: LockInfo, wait: float, error: BaseException | None) -> None:
        """It ended without the lock after ``wait`` seconds: not free in time
        (``error`` None), or with ``error``."""

    def contended(self, lock: LockInfo, granted: int, refused: int, failed: int) -> None:
        """One of its rounds did not win: ``granted`` masters granted (a split vote when
        > 0), ``refused`` refused, ``failed`` failed; it waits or retries."""

    def released(self, lock: LockInfo, held: float) -> None:
        """The last hold level was released after ``held`` seconds."""

    def renewal_failed(self, master: str, error: BaseException, locks: int) -> None:
        """A watchdog round could not renew ``locks`` holds on ``master``."""

    def lost(self, lock: LockInfo, reason: str) -> None:
        """A hold was lost (the ``on_lost`` events, and losses found by re-entries,
        releases and extensions)."""

    def quorum_unavailable(self, action: str, errors: Mapping[str, BaseException]) -> None:
        """``action`` failed because too many masters failed (``errors`` by master);
        :class:`QuorumUnavailableError` is raised to the caller."""

    def clock_stepped(self, master: str, seconds: float, counted_out: float) -> None:
        """``master``'s clock moved ``seconds`` (negative: back) more than drift allows,
        as its replies' times showed against this process's monotonic clock: it is
        counted out of every quorum for the next ``counted_out`` seconds."""


def tell(call: Callable[[], object]) -> None:
    """Run one listener call; log what it raises."""
    try:
        call()
    except Exception:
        log.exception("redreentrant: a lock listener raised (ignored)")
