"""The quorum: its size, validity and drift, and the judgement of replies (no I/O)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from typing import TypeVar

from .clockwatch import ClockWatch
from .durability import Durability, judged
from .effects import UNREAD, Call, Early, Fanout, Handover, Reply, made
from .errors import LockKeyTypeError, QuorumUnavailableError
from .replies import Attempt, Release, first_granted, first_held

#: A clock (seconds): ``time.monotonic`` (or ``time.time``, for a wall clock) unless a
#: test injects another.
Clock = Callable[[], float]
#: ``uniform(a, b)``: a random float in ``[a, b]`` (``random.uniform`` unless injected).
Uniform = Callable[[float, float], float]
T = TypeVar("T")
#: a round's replies: per master, one per call
Replies = Sequence[Sequence[Reply]]
#: a kind's key of a name (see :meth:`~.kinds.LockKind.key`), named in errors
Key = Callable[[str], str]


@dataclass(frozen=True)
class Quorum:
    """The ensemble's parameters that every algorithm needs.

    ``masters`` are display names (for error messages), in the order the driver uses.
    """

    masters: tuple[str, ...]
    drift_factor: float
    retry_jitter: float
    #: the clock validity is measured on, and the source of retry jitter: injected so
    #: that tests can drive slow rounds and jitter deterministically
    clock: Clock = time.monotonic
    uniform: Uniform = random.uniform
    #: the wall clock (seconds since the epoch) a waiter's proposed place on the
    #: masters is told in (see :func:`.rounds.acquire_steps`): comparable between
    #: clients, unlike ``clock``
    wall: Clock = time.time
    #: per master, the command that waits until its writes are durable (None: none;
    #: empty: no master has one): see :mod:`.durability`
    durable: tuple[Call | None, ...] = ()
    #: per master, what ``durable`` waits for
    durabilities: tuple[Durability | None, ...] = ()

    # Asked for on every round: worked out once (cached_property writes the instance's
    # __dict__, which a frozen dataclass allows; later looks are plain attribute reads).
    @cached_property
    def size(self) -> int:
        return len(self.masters)

    @cached_property
    def needed(self) -> int:
        """Grants needed for a quorum: a strict majority."""
        return len(self.masters) // 2 + 1

    @cached_property
    def tolerated(self) -> int:
        """How many masters may fail while a quorum stays reachable."""
        return len(self.masters) - self.needed

    @cached_property
    def watch(self) -> ClockWatch:
        """The masters' clocks, and which ones are counted out (see :mod:`.clockwatch`)."""
        return ClockWatch(len(self.masters), self.drift_factor, self.clock, on_change=self._recount)

    def votes_at(self) -> float:
        """When (on :attr:`clock`) a quorum of the masters' votes count, as this process
        knows from its rounds: a time past when they count now (see :mod:`.clockwatch`)."""
        return self.watch.counting_from(self.needed)

    def drift(self, lease: float) -> float:
        """Clock drift allowance for a lease: a fraction of it plus 2 ms."""
        return drift_allowance(lease, self.drift_factor)

    def everywhere(self, *calls: Call, early: Early | None = None, cleanup: bool = False) -> Fanout:
        """The same calls on every master (see :class:`~.effects.Fanout`)."""
        return made(Fanout, ((calls,) * self.size, early, cleanup))

    def durably(self, fanout: Fanout) -> Fanout:
        """``fanout`` with each master's calls followed by its durability's command
        where it has one (see :mod:`.durability`; :meth:`judged` reads the replies)."""
        if not self.durable:
            return fanout
        per = tuple(
            c if d is None else (*c, d) for c, d in zip(fanout.calls, self.durable, strict=True)
        )
        return fanout._replace(calls=per)

    def judged(self, replies: list[list[Reply]]) -> list[list[Reply]]:
        """The replies of a :meth:`durably` round, as if its calls alone were sent: a
        master whose writes were not made durable in time failed them."""
        if not self.durable:
            return replies
        return judged(self.durabilities, self.masters, replies)

    @cached_property
    def voting(self) -> int:
        """How many votes a round that may end early waits for: a quorum's, and one more
        per master counted out (see :mod:`.clockwatch`), whose votes count for nothing.
        Worked out again when masters are counted out or back in (:meth:`_recount`)."""
        return self.needed + self.watch.out_count()

    @cached_property
    def until_granted(self) -> Early:
        """A round that ends once a quorum granted."""
        return Early(self.voting, first_granted)

    @cached_property
    def until_held(self) -> Early:
        """A round that ends once a quorum confirmed a hold."""
        return Early(self.voting, first_held)

    def _recount(self) -> None:
        """Masters were counted out or back in: the votes to wait for change."""
        for name in ("voting", "until_granted", "until_held"):
            self.__dict__.pop(name, None)

    def unavailable(
        self, action: str, failed: Mapping[int, BaseException]
    ) -> QuorumUnavailableError:
        return QuorumUnavailableError(
            action, {self.masters[i]: e for i, e in failed.items()}, self.needed
        )


def drift_allowance(lease: float, drift_factor: float) -> float:
    """Clock drift allowance for a lease: ``lease * drift_factor`` plus 2 ms."""
    return lease * drift_factor + 0.002


def lease_ms(lease: float) -> int:
    """A lease in whole milliseconds (at least 1)."""
    return max(1, math.ceil(lease * 1000))


#: a round whose replies nobody reads (an undo): it waits for none of them
NO_WAIT = Early(0, lambda replies: False)


def is_wrong_type(reply: Reply) -> bool:
    return isinstance(reply, Exception) and "WRONGTYPE" in str(reply)


class Tally:
    """One round's replies sorted out: who granted, who refused, who failed.

    (A plain class with slots: one is made per round, and a dataclass with factory
    defaults costs more to make.)"""

    __slots__ = ("failed", "granted", "holder_ttl", "refused", "unread", "wrong_type")

    def __init__(self) -> None:
        self.granted: list[int] = []
        self.refused: list[int] = []
        self.failed: dict[int, BaseException] = {}
        #: masters whose reply the round did not wait for (it was decided without them)
        self.unread: list[int] = []
        #: smallest positive remaining lease (seconds) reported by a refusal, if any
        self.holder_ttl: float | None = None
        self.wrong_type: LockKeyTypeError | None = None


def tally_grants(
    q: Quorum, key: Key, name: str, replies: Replies, attempts: Sequence[Attempt | None]
) -> Tally:
    """Judge a try's replies (``attempts``: the first call's, decoded). A master whose
    clock was seen to jump (see :mod:`.clockwatch`) refuses."""
    t = Tally()
    watch = q.watch
    out = watch.anyone_out
    for i, a in enumerate(attempts):
        if a is None:
            reply = replies[i][0]
            if reply is UNREAD:
                t.unread.append(i)
            else:
                note_failure(q, t, i, key(name), reply)
        elif out and not watch.counts(i):
            t.refused.append(i)
        elif a.granted:
            t.granted.append(i)
        else:
            t.refused.append(i)
            ttl = a.value / 1000.0
            if ttl > 0 and (t.holder_ttl is None or ttl < t.holder_ttl):
                t.holder_ttl = ttl
    return t


def tally_holds(
    q: Quorum, key: Key, name: str, replies: Replies, releases: Sequence[Release | None]
) -> Tally:
    """Judge a release's replies (``releases``: the first call's, decoded): a status of
    -1 (held nothing) is a refusal, 0 and 1 grants."""
    t = Tally()
    for i, r in enumerate(releases):
        if r is not None:
            (t.granted if r.status >= 0 else t.refused).append(i)
        elif replies[i][0] is UNREAD:
            t.unread.append(i)
        else:
            note_failure(q, t, i, key(name), replies[i][0])
    return t


def woken_by(releases: Sequence[Release | None]) -> tuple[str, ...]:
    """The waiters the masters woke (each once, in the masters' order)."""
    out: dict[str, None] = {}
    for r in releases:
        if r is not None and r.woken:
            out[r.woken] = None
    return tuple(out)


def handed_over(releases: Sequence[Release | None], since: float, tag: int) -> dict[str, Handover]:
    """The waiters the masters handed the lock over to: per waiter, its lease and the
    masters that granted it; ``since``: when the release went out; ``tag``: the
    hold's tag."""
    out: dict[str, tuple[int, set[int]]] = {}
    for i, r in enumerate(releases):
        if r is not None and r.woken and r.handover_ms:
            ms, masters = out.setdefault(r.woken, (r.handover_ms, set()))
            if r.handover_ms == ms:
                masters.add(i)
    return {o: Handover(ms, frozenset(masters), since, tag) for o, (ms, masters) in out.items()}


#: a master's first reply (to its first call): ``map(first, replies)``
first = itemgetter(0)


def decoded(
    decode: Callable[[Reply], T], replies: Sequence[Sequence[Reply]], call: int = 0
) -> list[T]:
    """Each master's reply to its call number ``call``, decoded (see :mod:`.replies`).
    (A round on every try inlines it for call 0: ``list(map(decode, map(first,
    replies)))``, one Python call less.)"""
    return list(map(decode, map(itemgetter(call), replies)))


def note_failure(q: Quorum, t: Tally, i: int, key: str, reply: Reply) -> None:
    if is_wrong_type(reply):
        t.wrong_type = LockKeyTypeError(key, q.masters[i], str(reply))
    error = reply if isinstance(reply, BaseException) else RuntimeError(f"odd reply {reply!r}")
    t.failed[i] = error
