"""The semaphore: permits kept as slots, each held like a plain lock (see
``lua/semaphore.lua``)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from .. import keys, scripts
from ..effects import Call, Early, Fanout
from ..quorum import NO_WAIT, Quorum, Replies, Tally, tally_grants
from ..replies import position, slots
from ..views import LockView, MasterView
from .base import Attempts, FamilyKind, LockKind, Renewal, Try, tag_of


class SemaphoreKind(FamilyKind):
    """A semaphore of ``permits`` permits, kept as that many slots (see
    ``lua/semaphore.lua``): each slot is held like a plain lock, and a permit is one
    slot held on a quorum. Sound over a quorum because each slot is a lock: two holders
    of one slot would need two quorums that granted it, which intersect.

    ``slot=None`` stands for the whole semaphore: each try of a first acquire sends the
    slots in an order drawn at random, every master grants the first that is free
    there, and a grant is a slot a quorum granted (the others' grants of other slots
    are taken back); the hold is then of the kind of that slot, which re-enters,
    renews, extends and releases that slot only. ``permits=0``: a semaphore of unknown
    size, whose slots each master's index names (``inspect``, ``force_unlock``)."""

    label = "semaphore"
    family = "semaphore"
    stems = ("sem",)
    fenced = False  # a permit is shared by up to ``permits`` holders
    in_arrival_order = True  # a free slot is kept for the waiter woken
    hands_over = False  # no turns: a release wakes a waiter, it does not hand over
    hands_off = False

    def __init__(self, permits: int, slot: int | None = None) -> None:
        self.permits = permits
        self.slot = slot

    def __repr__(self) -> str:
        return f"<SemaphoreKind permits={self.permits} slot={self.slot}>"

    def _slot_key(self, name: str, slot: int) -> str:
        return keys.aux_key(name, f"sem:{slot}")

    def _tail(self, name: str) -> tuple[str, str]:
        """The waiters' zset and the index (owner -> slot)."""
        return keys.aux_key(name, "sem:waiters"), keys.aux_key(name, "sem:holders")

    def _all(self, name: str) -> tuple[str, ...]:
        """Every slot, then the waiters and the index."""
        slots = tuple(self._slot_key(name, n) for n in range(self.permits))
        return (*slots, *self._tail(name))

    def _own(self, name: str) -> tuple[str, str, str]:
        """This slot, then the waiters and the index."""
        assert self.slot is not None, "a permit's own calls need its slot"
        return (self._slot_key(name, self.slot), *self._tail(name))

    def key(self, name: str) -> str:
        if self.slot is None:
            return keys.aux_key(name, "sem:holders")
        return self._slot_key(name, self.slot)

    def wake_channel(self, name: str, owner: str) -> str:
        return keys.aux_key(name, "sem:wake")

    def notify_channels(self, name: str) -> tuple[str, ...]:
        return (keys.aux_key(name, "sem:wake"),)

    def seen_as(self) -> LockKind:
        return semaphore_kind(self.permits)  # the semaphore's, not a slot's

    def early(self, q: Quorum) -> Early | None:
        # Masters may grant different slots: a try reads them all.
        return None if self.slot is None else q.until_granted

    def attempt(self, q: Quorum, t: Try) -> Call:
        if self.slot is not None:
            return self.acquire(t)
        order = list(range(1, self.permits + 1))  # positions in the keys, 1-based
        for i in range(len(order) - 1, 0, -1):  # Fisher-Yates, on the injected source
            j = min(i, int(q.uniform(0.0, i + 1)))
            order[i], order[j] = order[j], order[i]
        args: tuple[str | int, ...] = ("acquire", *t[1:5], t.place_ms, *order)
        return Call(scripts.SEMAPHORE, self._all(t.name), args)

    def acquire(self, t: Try) -> Call:
        # This slot: a re-entry (see attempt for a first acquire).
        args = ("acquire", *t[1:5], t.place_ms, 1)
        return Call(scripts.SEMAPHORE, self._own(t.name), args)

    def judge(
        self, q: Quorum, name: str, replies: Replies, attempts: Attempts
    ) -> tuple[Tally, LockKind]:
        tally = tally_grants(q, self.key, name, replies, attempts)
        if self.slot is not None or not tally.granted:
            return tally, self
        # Granted: the slot most masters granted (replies {1, count, position}).
        votes: dict[int, list[int]] = {}
        for i in tally.granted:
            votes.setdefault(position(replies[i][0]), []).append(i)
        slot, granted = max(votes.items(), key=lambda item: len(item[1]))
        tally.refused += [i for i in tally.granted if i not in granted]
        tally.granted = granted
        return tally, semaphore_kind(self.permits, slot)

    def kept(
        self, q: Quorum, name: str, owner: str, tally: Tally, held: LockKind, tag: int
    ) -> Fanout | None:
        if len(tally.granted) == q.size:
            return None
        # Not waited for: each master runs it after the try, on the same connection.
        assert isinstance(held, SemaphoreKind) and held.slot is not None
        drop = self._drop(name, owner, held.slot, tag, granted=True)
        calls = tuple(() if i in tally.granted else (drop,) for i in range(q.size))
        return Fanout(calls, NO_WAIT, cleanup=True)

    def _drop(
        self, name: str, owner: str, keep: int | None, tag: int, granted: bool = False
    ) -> Call:
        args = ("drop", owner, 0 if keep is None else keep + 1, tag, int(granted))
        return Call(scripts.SEMAPHORE, self._all(name), args)

    def undo(self, name: str, owner: str, left: str, release_id: str) -> Call:
        if self.slot is None:
            return self._drop(name, owner, None, tag_of(left))  # a first acquire's try
        return self._ends(name, owner, left, release_id, "0")

    def _ends(self, name: str, owner: str, left: str, rid: str, end: str, *more: str | int) -> Call:
        channel = keys.aux_key(name, "sem:wake")
        args = ("release", owner, left, channel, rid, keys.HOME_PREFIX, end)
        return Call(scripts.SEMAPHORE, self._own(name), args)

    def abandon(self, name: str, owner: str, release_id: str, tag: int) -> Call | None:
        channel = keys.aux_key(name, "sem:wake")
        args = ("abandon", owner, channel, release_id, keys.HOME_PREFIX, tag)
        return Call(scripts.SEMAPHORE, self._all(name), args)

    def extend(self, name: str, owner: str, ms: int, add: bool, tag: int) -> Call:
        args = ("extend", owner, ms, "add" if add else "set", tag)
        return Call(scripts.SEMAPHORE, self._own(name), args)

    def renew(self, entries: Sequence[Renewal], lease_ms: int) -> Call:
        assert self.slot is not None, "a permit's own calls need its slot"
        pairs_ = tuple(
            k
            for name, _, _ in entries
            for k in (self._slot_key(name, self.slot), self._tail(name)[1])
        )
        args = (x for _, owner, hold in entries for x in (owner, hold))
        return Call(scripts.SEMAPHORE, pairs_, ("renew", lease_ms, *args))

    def force_unlock(self, name: str, release_id: str) -> Call:
        channel = keys.aux_key(name, "sem:wake")
        return Call(
            scripts.SEMAPHORE, self._all(name), ("force", channel, release_id, keys.HOME_PREFIX)
        )

    def probe(self, name: str) -> Call:
        return Call(scripts.SEMAPHORE, self._all(name), ("probe",))

    def view(self, reply: object) -> LockView | None:
        seen = slots(reply)
        holders = {s.owner: s.holds for s in seen.held}
        queue = [w for w in seen.waiting if w not in holders]
        if not holders and not queue:
            return None
        ttl = max((s.ttl for s in seen.held if s.ttl is not None), default=None)
        return LockView(
            self.family, None, ttl, holders, queue, {s.owner: s.slot for s in seen.held}
        )

    def is_locked(self, view: LockView | None) -> bool:
        """Whether no permit is free on that master."""
        if view is None:
            return False
        return len([s for s in view.slots.values() if s < self.permits]) >= self.permits

    def available(self, q: Quorum, views: Sequence[MasterView]) -> int:
        """How many permits are free on a quorum's view: the slots that are free on at
        least a quorum of the masters (what an acquire could win now)."""
        answered = self._answered(q, views)
        held = [{s for lv in v.locks for s in lv.slots.values()} for v in answered]
        return sum(1 for s in range(self.permits) if sum(s not in h for h in held) >= q.needed)

    def holders(self, q: Quorum, views: Sequence[MasterView]) -> list[str]:
        """The owners that hold a permit on a quorum of the masters, in slot order."""
        answered = self._answered(q, views)
        seen: dict[str, tuple[int, int]] = {}  # owner -> (slot, on how many masters)
        for v in answered:
            for lv in v.locks:
                for owner, slot in lv.slots.items():
                    seen[owner] = (slot, seen.get(owner, (slot, 0))[1] + 1)
        on_quorum = [(slot, owner) for owner, (slot, n) in seen.items() if n >= q.needed]
        return [owner for _, owner in sorted(on_quorum)]

    @staticmethod
    def _answered(q: Quorum, views: Sequence[MasterView]) -> list[MasterView]:
        failed = {i: RuntimeError(v.error) for i, v in enumerate(views) if v.error is not None}
        if len(failed) > q.tolerated:
            raise q.unavailable("read the semaphore", failed)
        return [v for v in views if v.error is None]


@functools.lru_cache(maxsize=4096)
def semaphore_kind(permits: int, slot: int | None = None) -> SemaphoreKind:
    """The kind of a semaphore of ``permits`` permits (one object per size and slot:
    holds of one slot are renewed together)."""
    return SemaphoreKind(permits, slot)


#: a semaphore of unknown size: what ``inspect`` and ``force_unlock`` of a name read
SEMAPHORES = semaphore_kind(0)
