"""The multi-lock: the plain locks of several names, held together (see
``lua/multilock.lua``)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Sequence

from .. import keys, scripts
from ..effects import Call, Groups
from ..errors import LockUpgradeError
from ..quorum import Quorum, Replies, Tally
from ..replies import attempt, extended, partial, release, renewed
from .base import EXCLUSIVE, Attempts, FamilyKind, LockKind, OwnHolds, Renewal, Try


class MultiKind(LockKind):
    """The plain locks of several ``names``, held together as one hold (see
    ``lua/multilock.lua``): all of them or none, in one call on a plain master; on a
    Redis Cluster member whose nodes own the names' slots apart, one call per slot (see
    :class:`~.effects.Groups`). Each name is the plain lock of that name, so a
    multi-lock and the locks of its names exclude each other. The hold's name is
    :attr:`label_of_names`; the kind's calls ignore the name they are given."""

    label = "multi"
    family = "lock"
    hands_over = False  # no turns: a release wakes each name's next waiter
    hands_off = False
    looks_around = True

    def __init__(self, names: tuple[str, ...]) -> None:
        #: the names, by cluster hash slot, then by name: the one order they are taken in
        self.names = names
        #: the name of its holds: the names, as one string
        self.label_of_names = json.dumps(list(names), ensure_ascii=False)

    def __repr__(self) -> str:
        return f"<MultiKind {list(self.names)!r}>"

    def _all(self) -> tuple[str, ...]:
        # Each name's plain lock keys, as acquire.lua and release.lua have them.
        return tuple(k for n in self.names for k in keys.plain_keys(n))

    def first_hold(self, holds: OwnHolds, name: str, owner: str) -> LockKind:
        # A master keeps one hold count per name and owner: a name may not be held both
        # alone and in a multi-lock (or in two).
        for n in self.names:
            if (n, owner) in holds.in_multi or holds.get(EXCLUSIVE, n, owner) is not None:
                raise LockUpgradeError(
                    f"lock {n!r} is held by this owner already: a multi-lock of it cannot"
                    " be taken besides (release that lock first)"
                )
        return self

    def families(self, name: str) -> tuple[tuple[FamilyKind, str], ...]:
        return tuple((EXCLUSIVE, n) for n in self.names)

    def key(self, name: str) -> str:
        return keys.lock_key(self.names[0])

    def wake_channel(self, name: str, owner: str) -> str:
        # Local only: a wake-up for any of the names reaches the owner (see
        # subscriptions: an owner waits for one thing at a time).
        return keys.wake_channel(self.names[0])

    def notify_channels(self, name: str) -> tuple[str, ...]:
        return tuple(keys.wake_channel(n) for n in self.names)

    def _call(
        self, args: tuple[str | int, ...], merge: Merge, varies: tuple[int, ...] = ()
    ) -> Call:
        groups = Groups(3, len(args), 0, merge)
        return Call(scripts.MULTILOCK, self._all(), args, groups, varies)

    def acquire(self, t: Try) -> Call:
        return self._call(("acquire", *t[1:5]), _all_granted, (3,))

    def judge(
        self, q: Quorum, name: str, replies: Replies, attempts: Attempts
    ) -> tuple[Tally, LockKind]:
        tally, held = super().judge(q, name, replies, attempts)
        # A cluster member that granted part of the names (see route): not a grant,
        # and, like a master not read, undone if the try fails. After a grant, what it
        # holds is kept, as a master not read keeps its grant: the release frees it.
        some = [i for i in tally.refused if partial(replies[i][0])]
        if some:
            tally.refused = [i for i in tally.refused if i not in some]
            tally.unread += some
        return tally, held

    def _ends(self, name: str, owner: str, left: str, rid: str, end: str, *more: str | int) -> Call:
        # '1' a final release: it ends the registrations too, and wakes waiters.
        return self._call(("release", owner, left, rid, keys.HOME_PREFIX, end), _least_status)

    def abandon(self, name: str, owner: str, release_id: str, tag: int) -> Call | None:
        # Ends the registrations only: a try that was granted is undone, holding nothing.
        return self._call(("abandon", owner, release_id, keys.HOME_PREFIX), _least_status)

    def extend(self, name: str, owner: str, ms: int, add: bool, tag: int) -> Call:
        return self._call(("extend", owner, ms, "add" if add else "set", tag), _least_ttl)

    def renew(self, entries: Sequence[Renewal], lease_ms: int) -> Call:
        # Every hold's every name: its owner, the hold's number and the hold (one flag
        # per hold).
        names = self.names
        args = tuple(
            x for n, (_, owner, hold) in enumerate(entries) for _ in names for x in (owner, n, hold)
        )
        all_keys = self._all() * len(entries)
        per = len(names)
        merge = functools.partial(_renewed, [n for n in range(len(entries)) for _ in range(per)])
        return Call(scripts.MULTILOCK, all_keys, ("renew", lease_ms, *args), Groups(3, 2, 3, merge))

    def fence_calls(self, name: str, owner: str, ttl_ms: int) -> list[tuple[str, Call]]:
        return [(n, EXCLUSIVE.fence_next(n, owner, ttl_ms)) for n in self.names]

    def fence_raise_calls(self, name: str, tokens: Sequence[int], ttl_ms: int) -> list[Call]:
        return [
            EXCLUSIVE.fence_raise(n, t, ttl_ms) for n, t in zip(self.names, tokens, strict=True)
        ]


#: how a call's parts (each with its groups' indices) merge into its reply
Merge = Callable[[list[tuple[list[int], object]]], object]


def _all_granted(parts: list[tuple[list[int], object]]) -> object:
    """An acquire's parts: granted if every part granted, else refused, marked partial
    (``[0, ms, [1], stamp]``) when some part granted (see :meth:`MultiKind.judge`)."""
    tries = [attempt(r) for _, r in parts]
    if all(t is not None and t.granted for t in tries):
        return parts[0][1]
    waits = [t.value for t in tries if t is not None and not t.granted]
    stamps = [[t.time] for t in tries if t is not None and t.time is not None]
    some = any(t is not None and t.granted for t in tries)
    return [0, max(waits, default=-2), [1] if some else [], *stamps[:1]]


def _least_status(parts: list[tuple[list[int], object]]) -> object:
    """A release's parts: the least status (a part that held nothing makes the whole
    lost), and the first waiter woken."""
    releases = [r for _, reply in parts if (r := release(reply)) is not None]
    woken = next((r.woken for r in releases if r.woken), "")
    return [min(r.status for r in releases), woken, []]


def _least_ttl(parts: list[tuple[list[int], object]]) -> object:
    """An extension's parts: the least time left (0 where a part held nothing)."""
    return min(extended(r) or 0 for _, r in parts)


def _renewed(hold_of: list[int], parts: list[tuple[list[int], object]]) -> object:
    """A renewal's parts: a hold is renewed where every part that has its names
    renewed them (``hold_of``: the hold of each name in the call), taken again where
    one part took it again and none failed it; the first part's time last."""
    flags: dict[int, int] = {}
    times: list[int] = []
    for groups, reply in parts:
        seen = list(dict.fromkeys(hold_of[g] for g in groups))
        answer = renewed(reply, len(seen))
        if answer is None:
            continue
        times += [answer.time] if answer.time is not None else []
        for hold, new in zip(seen, answer.flags, strict=False):
            old = flags.get(hold, 1)
            flags[hold] = 0 if 0 in (old, new) else max(old, new)
    return [*(flags.get(h, 0) for h in range(max(hold_of, default=-1) + 1)), *times[:1]]


@functools.lru_cache(maxsize=4096)
def multi_kind(names: tuple[str, ...]) -> MultiKind:
    """The kind of the multi-lock of ``names`` (distinct, by hash slot, then by name)."""
    return MultiKind(names)


def multi_names(names: Iterable[object]) -> tuple[str, ...]:
    """The names of a multi-lock, checked, without repeats, in the order they are
    taken: by cluster hash slot, then by name."""
    checked = {keys.validate_name(n) for n in names}
    if not checked:
        raise ValueError("a multi-lock needs at least one name")
    return tuple(sorted(checked, key=lambda n: (keys.key_slot(keys.lock_key(n)), n)))
