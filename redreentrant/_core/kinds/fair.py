"""The fair lock: granted in order of arrival (see ``lua/fairlock.lua``)."""

from __future__ import annotations

from .. import keys, scripts
from ..effects import Call
from ..quorum import Replies
from ..replies import first_granted, head
from .base import FamilyKind, Try


class FairKind(FamilyKind):
    """The fair lock: granted in order of arrival (see ``lua/fairlock.lua``)."""

    label = "fair"
    family = "fair"
    stems = ("fair",)
    queued = True
    targeted = False
    hands_over = False

    # The keys are named after the family: "fair" here, "election" for ElectionKind.
    def _keys(self, name: str) -> tuple[str, ...]:
        stem = self.family
        return (
            keys.aux_key(name, stem),
            keys.aux_key(name, f"{stem}:queue"),
            keys.aux_key(name, f"{stem}:deadlines"),
            keys.aux_key(name, f"{stem}:tickets"),
        )

    def _prefix(self, name: str) -> str:
        return keys.aux_key(name, f"{self.family}:wake:")

    def key(self, name: str) -> str:
        return keys.aux_key(name, self.family)

    def fence_key(self, name: str) -> str:
        return keys.aux_key(name, f"{self.family}:fence")

    def wake_channel(self, name: str, owner: str) -> str:
        return self._prefix(name) + owner

    def notify_channels(self, name: str) -> tuple[str, ...]:
        return ()  # the next owner is chosen in Redis and woken through its own channel

    def acquire(self, t: Try) -> Call:
        # Never polite, and no proposed place: fairlock.lua keeps its own queue, each
        # place in it tagged with the ticket of the acquire that took it (see settle).
        queued = t.ticket if t.ticket and t.wait_ms > 0 and t.hold.startswith("1:") else ""
        args = ("acquire", *t[1:5], queued)
        return Call(scripts.FAIRLOCK, self._keys(t.name), args, None, (3,))

    def _ends(self, name: str, owner: str, left: str, rid: str, end: str, *more: str | int) -> Call:
        args = ("release", owner, left, self._prefix(name), rid, end)  # no hand-over
        return Call(scripts.FAIRLOCK, self._keys(name), args)

    def abandon(self, name: str, owner: str, release_id: str, tag: int) -> Call | None:
        # Leaves the queue only: a try that was granted is undone, holding nothing.
        return Call(
            scripts.FAIRLOCK, self._keys(name), ("abandon", owner, self._prefix(name), release_id)
        )

    def settle(self, name: str, owner: str, replies: Replies, release_id: str) -> Call | None:
        # Masters whose queues disagree grant different heads, round after round. A
        # waiter caught in such a split yields to the head of the most masters (of the
        # smallest owner id among equals) unless that is itself: the order most masters
        # saw wins everywhere, and the next round reaches a quorum. A head is a place
        # in the queues: its owner and the ticket of the acquire that took it. The
        # yield moves the waiter behind that place only: by the time it runs, the head
        # may have been a holder that released and queued again, now a new arrival.
        heads: dict[tuple[str, str], int] = {}
        for per_master in replies:
            seen = (owner, "") if first_granted(per_master) else head(per_master[0])
            if seen is not None:
                seen = (owner, "") if seen[0] == owner else seen
                heads[seen] = heads.get(seen, 0) + 1
        first, ticket = min(heads, key=lambda h: (-heads[h], h), default=(owner, ""))
        if first == owner:
            return None
        args = ("yield", owner, first, self._prefix(name), release_id, ticket)
        return Call(scripts.FAIRLOCK, self._keys(name), args)

    def force_unlock(self, name: str, release_id: str) -> Call:
        return Call(scripts.FAIRLOCK, self._keys(name), ("force", self._prefix(name), release_id))

    def probe(self, name: str) -> Call:
        return Call(scripts.FAIRLOCK, self._keys(name), ("probe",))


FAIR = FairKind()
