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
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Generic, TypeVar

from .effects import Call, Fanout, Pause, Reply, Steps
from .engine import Engine
from .holds import Hold, Holds
from .keys import key_slot
from .kinds import LockKind, Renewal, hold_value
from .listeners import LockListener, tell
from .owner import OWNERS
from .quorum import Quorum, lease_ms
from .replies import renewed
from .rounds import release_steps

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


@dataclass
class Renewals:
    """The outcome of one watchdog round."""

    #: the holds renewed on a quorum in time, and the new end of their validity
    renewed: list[Hold]
    valid_until: float
    #: the holds gone from so many masters that no renewal can succeed
    gone: list[Hold]
    #: the masters whose calls failed, with the first error of each
    failed: dict[int, BaseException] = field(default_factory=dict)


def renew_steps(
    q: Quorum, holds: Sequence[Hold], lease: float, cluster: set[int]
) -> Steps[Renewals]:
    """Renew many holds in one round: per master one call per kind (per hash slot on
    the masters in ``cluster``, which a CROSSSLOT reply adds to that set).

    A hold whose validity still runs when the round starts is also taken again where
    it is gone and the lock is free (a master that forgot it, or that could not be
    reached when it was granted), so that it stands on every master that answers, not
    on a bare quorum, and one later fault on one master cannot open the lock to a
    rival. Only masters that kept the hold count toward its renewal: one taken again
    counts as gone (the hold was not there for a while), so a hold that was gone from
    a majority is lost, as before, whatever was taken again."""
    ms = lease_ms(lease)
    started = q.clock()
    plain = _renew_calls(holds, ms, False, started)  # the same for every master outside a cluster
    per_master = [
        _renew_calls(holds, ms, True, started) if i in cluster else plain for i in range(q.size)
    ]
    replies = q.judged((yield q.durably(Fanout(tuple(calls for calls, _ in per_master)))))
    crossed = [i for i, rs in enumerate(replies) if any(map(_cross_slot, rs))]
    if crossed:
        cluster.update(crossed)
        for i in crossed:
            per_master[i] = _renew_calls(holds, ms, True, started)
        again = yield Fanout(tuple(per_master[i][0] if i in crossed else () for i in range(q.size)))
        for i in crossed:
            replies[i] = again[i]
    # Per master, its reply to each call (one per group of holds), decoded.
    answers = [
        [renewed(reply, len(group)) for reply, group in zip(rs, order, strict=False)]
        for rs, (_, order) in zip(replies, per_master, strict=True)
    ]
    q.watch.observe([a[0] if a else None for a in answers], started, q.clock())
    # Votes per hold, by its place in ``holds``; a master whose clock was seen to jump
    # does not vote.
    place = {id(h): n for n, h in enumerate(holds)}
    kept = [0] * len(holds)
    gone = [0] * len(holds)
    for i, (_, order) in enumerate(per_master):
        if not q.watch.counts(i):
            continue
        for answer, group in zip(answers[i], order, strict=False):
            if answer is None:
                continue  # failed: neither renewed nor gone there
            for h, flag in zip(group, answer.flags, strict=False):
                if flag == 1:
                    kept[place[id(h)]] += 1
                else:  # gone there (2: and taken again)
                    gone[place[id(h)]] += 1
    valid_until = started + lease - q.drift(lease)
    needed = q.needed if valid_until > q.clock() else q.size + 1  # too late: none
    tolerated = q.tolerated
    failed = {
        i: error
        for i, rs in enumerate(replies)
        if (error := next((r for r in rs if isinstance(r, BaseException)), None)) is not None
    }
    return Renewals(
        [h for h, votes in zip(holds, kept, strict=True) if votes >= needed],
        valid_until,
        [h for h, votes in zip(holds, gone, strict=True) if votes > tolerated],
        failed,
    )


def _cross_slot(reply: Reply) -> bool:
    """A cluster node refused keys of several hash slots in one call."""
    # Matched by name and text: the core imports no client library, and a valkey-py
    # client raises its own class of the same name.
    return isinstance(reply, Exception) and (
        type(reply).__name__ == "ClusterCrossSlotError" or "CROSSSLOT" in str(reply)
    )


def _renew_calls(
    holds: Sequence[Hold], ms: int, by_slot: bool, started: float
) -> tuple[tuple[Call, ...], list[list[Hold]]]:
    # Per kind object: a semaphore's slots are kinds of their own (one per slot).
    groups: dict[tuple[LockKind, int], list[Hold]] = defaultdict(list)
    for h in holds:
        slot = key_slot(h.kind.key(h.name)) if by_slot else 0
        groups[(h.kind, slot)].append(h)
    order = list(groups.values())
    calls = tuple(
        kind.renew([_renewal(h, started) for h in group], ms) for (kind, _), group in groups.items()
    )
    return calls, order


def _renewal(hold: Hold, started: float) -> Renewal:
    """What a renewal round sends for ``hold``: taken again where the lock is free only
    while its validity runs (count 0 says renew only)."""
    count = hold.count if hold.valid_until > started else 0
    return hold.name, hold.owner, hold_value(count, hold.tag)


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
        gone = judge(renewals, holds)
        # The round took each hold again where it was gone and the lock free: a hold
        # found lost gives back what it took (best effort; the rest lapses in a lease).
        for h in gone:
            with contextlib.suppress(Exception):
                yield from release_steps(q, h.kind, h.name, h.owner, 0, h.tag, h.lease)
        lost = lost + gone
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
