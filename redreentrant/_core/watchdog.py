"""The watchdog: renews the leases of held locks and reports the ones it loses.

Each manager has one (a pair of daemon threads in the sync API, of tasks in the asyncio
API), started with its first watchdog-managed hold:

- the **renewer** renews every managed hold every ``lease / 3`` on a fixed schedule
  (the period does not drift by the rounds' durations): one script call per master per
  lock kind, batched by :func:`renew_chunk` holds, each chunk a round of its own with
  its own time-out and validity, the chunks spread over the first nine tenths of the
  interval (so that many held locks never stall the acquires in between); it frees at
  once the holds of owners (threads, tasks) that ended while holding a lock, also
  between chunks;
- the **deadline clock** declares a hold lost when its validity is about to end
  without a renewal (:func:`verdict_margin` before it, which grows with how long the
  recent renewal rounds really took), whatever the renewer is doing: a slow or stalled
  round can never delay the verdict past the validity's end;
- every loss is reported outside both (a thread or task per report), so a slow
  ``on_lost`` callback delays neither renewals nor other reports.

A hold is lost when the renewer finds it gone from too many masters to reach a quorum
again, when the deadline clock finds it overdue, or when its owner ended.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Generic, TypeVar

from .effects import Pause, Steps
from .engine import Engine
from .holds import Hold, Holds
from .listeners import LockListener, tell
from .owner import OWNERS
from .quorum import Quorum
from .rounds import Renewals, release_steps, renew_steps

log = logging.getLogger(__name__)
R = TypeVar("R")  # what a round gives: the lost holds, or an awaitable of them


#: how many holds one renewal round renews on one master (one call per kind and
#: chunk): an acquire that meets a chunk on a master waits for it, so chunks are small;
#: each costs a round trip per master, so not too small (on 5 masters, chunks of 16 cost
#: twice the CPU of chunks of 64, and the acquires' p99 rose with it). See
#: :func:`renew_chunk` for several masters.
RENEW_CHUNK = 32


def renew_chunk(masters: int) -> int:
    """How many holds one renewal round renews on ``masters`` masters.

    On several masters, twice :data:`RENEW_CHUNK`: a chunk costs the client a round trip
    per master, while what an acquire waits for on a master (that master running one
    chunk's call) does not grow with the number of masters. Measured with 10,000 held
    locks on 5 masters: a third less of the client's CPU per tick with chunks of 64 than
    of 32, and the acquires' p99 during ticks no higher; on one master, chunks of 64
    raised that p99."""
    return RENEW_CHUNK if masters <= 1 else 2 * RENEW_CHUNK


#: the share of the renewal interval over which a tick's chunks are spread (the rest
#: is room for a slow round to end before the next tick)
SPREAD = 0.9


def verdict_margin(interval: float, round_time: float = 0.0) -> float:
    """How long before a hold's validity ends the deadline clock declares it lost if it
    was not renewed: a tenth of the renewal interval, at least 100 ms (room for the
    report to start on a busy machine before the validity ends), at least twice as long
    as recent renewal rounds took (``round_time``: a renewal that could still save the
    hold would have had to start by then), at most half the interval."""
    return min(interval / 2, max(interval / 10, 0.1, 2 * round_time))


class RoundTimes:
    """How long the recent renewal rounds took: the slowest of the last few counts."""

    RECENT = 16

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=self.RECENT)
        #: read by the deadline clock (another thread): a float, replaced whole
        self.slowest = 0.0

    def note(self, seconds: float) -> None:
        self._recent.append(seconds)
        self.slowest = max(self._recent)


def judge(renewals: Renewals, holds: Holds) -> list[Hold]:
    """Apply one renewal round to the holds; return the holds found lost (gone from so
    many masters that no renewal can reach a quorum). A hold that merely failed to renew
    is tried again at the next tick, until the deadline clock calls it lost."""
    holds.renewed_all(renewals.renewed, renewals.valid_until)
    why = "the lock's key was deleted or taken over on a majority of masters"
    return [h for h in renewals.gone if holds.mark_lost(h, why)]


def tick_steps(
    q: Quorum,
    holds: Holds,
    lease: float,
    cluster: set[int],
    alive: Callable[[str], bool],
    renew: bool = True,
    times: RoundTimes | None = None,
    sweep_due: Callable[[], bool] = lambda: False,
    listener: LockListener | None = None,
) -> Steps[list[Hold]]:
    """One watchdog round: free the holds of owners that ended, then (``renew``) renew
    every other managed hold, in chunks spread over the first :data:`SPREAD` of the
    renewal interval (``lease / 3``), noting each chunk's duration in ``times``, and
    freeing dead owners' holds again between chunks when ``sweep_due()``. Returns the
    holds found lost (dead owners included)."""
    lost = yield from _free_dead(q, holds, alive)
    held = holds.managed(q.clock()) if renew else []
    # In chunks, each its own round with its own time-out and validity: a script call
    # over thousands of keys would hold every master (and the client's CPU) for tens of
    # milliseconds at once, stalling the acquires in between. Spread out, they leave
    # the acquires room between them; each hold keeps its place, so its renewals stay
    # one interval apart.
    size = renew_chunk(q.size)
    chunks = [held[start : start + size] for start in range(0, len(held), size)]
    gap = SPREAD * lease / 3 / len(chunks) if len(chunks) > 1 else 0.0
    began = q.clock()
    for k, chunk in enumerate(chunks):
        wait = began + k * gap - q.clock()
        if wait > 0:
            yield Pause(wait)
        if sweep_due():
            lost = lost + (yield from _free_dead(q, holds, alive))
        started = q.clock()
        for hold in chunk:
            hold.renewing = True
        try:
            renewals = yield from renew_steps(q, chunk, lease, cluster)
        finally:
            for hold in chunk:
                hold.renewing = False
        if times is not None:
            times.note(q.clock() - started)
        if listener is not None:
            for i, error in renewals.failed.items():
                tell(partial(listener.renewal_failed, q.masters[i], error, len(chunk)))
        lost = lost + judge(renewals, holds)
    return lost


def _free_dead(q: Quorum, holds: Holds, alive: Callable[[str], bool]) -> Steps[list[Hold]]:
    """Release the managed holds of owners that ended; return them (marked lost)."""
    dead = holds.take_dead(alive)
    for h in dead:
        # Best effort: what cannot be freed now lapses within one lease.
        with contextlib.suppress(Exception):
            yield from release_steps(q, h.kind, h.name, h.owner, 0, h.tag, h.lease)
    return dead


class WatchdogBase(Generic[R]):
    """What the sync and asyncio watchdogs share: their manager's rounds and holds."""

    def __init__(
        self,
        run: Callable[[Steps[list[Hold]]], R],
        engine: Engine,
        report: Callable[[Hold], object],
    ) -> None:
        self._run = run
        self._engine = engine
        self._report = report
        self.interval = engine.settings.lease / 3
        self.times = RoundTimes()
        #: ``(times.slowest, margin)``: the margin last worked out (see :attr:`margin`)
        self._margin = (0.0, verdict_margin(self.interval, 0.0))
        self._sweep_pending = False
        # When the deadline clock looks next (monotonic clock; inf while it looks): a
        # new hold wakes it only if it is due before then. Every managed hold has the
        # same lease, so a new one seldom is: the usual acquire wakes no thread.
        self.clock_looks_at = math.inf
        # members that are Redis Clusters, or masters found to be cluster nodes (a
        # CROSSSLOT reply): renewals are split by hash slot there
        self.cluster: set[int] = set(engine.clusters)
        self._stopping = False
        OWNERS.listen(self)

    @property
    def margin(self) -> float:
        """The deadline clock's margin now (see :func:`verdict_margin`)."""
        # Asked for on every acquire: worked out again only when ``slowest`` changed.
        slowest = self.times.slowest
        seen = self._margin
        if seen[0] != slowest:
            seen = self._margin = (slowest, verdict_margin(self.interval, slowest))
        return seen[1]

    @property
    def _holds(self) -> Holds:
        return self._engine.holds  # a forked child's engine has a table of its own

    def _round(self, renew: bool = True) -> R:
        engine = self._engine
        self._sweep_pending = False
        steps = tick_steps(
            engine.quorum,
            engine.holds,
            engine.settings.lease,
            self.cluster,
            OWNERS.alive,
            renew,
            self.times,
            self._take_sweep,
            engine.settings.listener,
        )
        return self._run(steps)

    def _take_sweep(self) -> bool:
        """Whether an owner ended since the last look (then free its holds now)."""
        due, self._sweep_pending = self._sweep_pending, False
        return due

    def clock_needed(self, hold: Hold) -> bool:
        """Whether the deadline clock must look again now for the new ``hold``: it
        becomes overdue before the clock's next look."""
        return hold.valid_until - self.margin < self.clock_looks_at

    def _overdue(self) -> tuple[list[Hold], float]:
        """The deadline clock's step: the holds found overdue now (marked lost), and
        in how many seconds to look again (at the latest: a new hold due earlier wakes
        the clock, see :meth:`clock_needed`)."""
        # Looking first, then look: a hold added during the look wakes the clock again.
        self.clock_looks_at = math.inf
        now = self._engine.clock()
        lost = self._holds.overdue(now, self.margin)
        due = self._holds.next_deadline(self.margin)
        # With no hold, look again after a renewal interval anyway: a hold added then
        # (due a lease later) needs no wake-up.
        wait = self.interval if due is None else max(0.0, due - now)
        self.clock_looks_at = now + wait
        return lost, wait

    def _failed(self) -> None:
        """A round raised: quiet when the manager is closing, else logged."""
        if not self._stopping:
            log.exception("redreentrant watchdog: renewal round failed")

    def owner_ended(self, token: str) -> None:
        """An owner (thread or task) ended: free its holds now if it had any here."""
        if self._holds.ended(token) and not self._stopping:
            self._sweep_pending = True  # seen between the chunks of a tick under way
            self._sweep_soon()

    def _sweep_soon(self) -> None:
        raise NotImplementedError
