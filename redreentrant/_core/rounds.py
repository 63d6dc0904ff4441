"""The rounds, written once as generators of effects (see :mod:`.effects`): acquire,
release, force-unlock and probe (renewal: :mod:`.watchdog`).

The sync and asyncio front ends drive these same generators; every lock kind runs
through them, differing only in the calls its :class:`~.kinds.LockKind` builds.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import NamedTuple

from . import keys, scripts
from .effects import (
    Call,
    Early,
    Fanout,
    Handed,
    Handover,
    Notify,
    Pause,
    Relay,
    Reply,
    Steps,
    Wait,
    Watch,
    made,
)
from .errors import LockKeyTypeError, LockLostError, ManagerClosedError
from .fencing import FENCE_TTL_MS, kept_counter, token_of
from .kinds import FamilyKind, LockKind, Try, hold_value
from .quorum import (
    Quorum,
    Tally,
    decoded,
    first,
    handed_over,
    is_wrong_type,
    lease_ms,
    tally_holds,
    woken_by,
)
from .replies import attempt, extended, integer_of, memory, release
from .views import MasterView

#: whether a decoded release deferred its wake-up (``map`` over releases: no frame)
_deferred = attrgetter("deferred")
#: names each acquire (an owner id and one of these name it uniquely: see kinds.attempt)
_tickets = itertools.count(1)
#: tags each try of an acquire, each hand-over and each give-up (see kinds.hold_value),
#: and numbers each release (see release_id): they grow across the process, so
#: whatever is sent later carries a greater tag
_tags = itertools.count(1)


def next_tag() -> int:
    """A tag greater than every tag handed out before in this process."""
    return next(_tags)


#: how many times a split vote's back-off bound doubles (then it stays):
#: ``retry_jitter * 2``, 0.1 s with the default jitter
SPLIT_BACKOFF_DOUBLINGS = 1


class Grant(NamedTuple):
    """What an acquire won: the end of its validity (monotonic clock) and, with
    fencing, its token. (A named tuple: made at every first hold, it costs less than
    a frozen dataclass.)"""

    valid_until: float
    #: a tuple: a multi-lock's tokens, one per name
    token: int | tuple[int, ...] | None = None
    #: how many masters granted it
    votes: int = 0
    #: the kind the hold is of, where it is not the acquired kind's own (a semaphore's
    #: slot: see :meth:`.kinds.LockKind.judge`)
    kind: LockKind | None = None
    #: the tag of the try (or the hand-over) that made the hold (see kinds.hold_value)
    tag: int = 0


class Freed(NamedTuple):
    """What a release did besides releasing."""

    #: a master deferred the wake-up: the caller sends it later, see :func:`wake_steps`
    deferred: bool
    #: a master woke a waiter (or handed it the lock)
    woke: bool


def release_id(owner: str) -> str:
    """A payload naming one release uniquely: ``owner`` names a manager (an owner id
    does), and the count is the process's. A manager counts each wake-up once per
    release id: two processes' ids must never meet."""
    return f"{owner}:{next(_tags)}"


def acquire_steps(
    a: Acquire,
    closed: Callable[[], bool] = lambda: False,
    contended: Callable[[Tally], None] | None = None,
) -> Steps[Grant | None]:
    """Take (``a.count == 1``) or re-enter (``a.count > 1``, the hold of ``a.tag``) a
    lock, as ``a`` asks (see :class:`Acquire`).

    Each try of a first hold has a tag of its own (:func:`next_tag`), which its calls
    and its undo carry: nothing sent for one try changes a hold a later try made.

    Returns the :class:`Grant` when granted, ``None`` when the lock was not free in
    time. Re-entry never waits: it succeeds, or raises :class:`LockLostError` because
    the owner's hold is gone. A waiter whose manager was closed (``closed()``) gives up
    with :class:`ManagerClosedError` before its next try. ``contended`` (if given) is
    told of every round that did not win. With ``polite_ms``, a blocking first hold's
    first try is polite: after its turn, the owner lets the waiter woken go first (the
    masters refuse it while another owner is registered, telling it to wait at most
    that long; see :mod:`.turns`); its later tries are not.

    With ``fencing`` (a first hold of a kind that supports it), each try also steps the
    lock's fencing counters (see :mod:`.fencing`), and a grant is returned only once
    its token was written back to a quorum within the validity; otherwise the grant is
    undone and the acquire tries again like a contended one. Raises
    :class:`FencingError` (nothing held) when the counters were lost on too many masters.

    The loop: one try (:meth:`Acquire.try_steps`), then, when it did not win, give up
    or wait (:meth:`Acquire.wait_steps`) and try again; :class:`Acquire` keeps what
    the tries share.
    """
    q, blocking, deadline = a.q, a.blocking, a.deadline
    try:
        while True:
            if closed():
                raise ManagerClosedError("the lock manager was closed while waiting")
            outcome = yield from a.try_steps(contended)
            if type(outcome) is Grant:
                return outcome
            assert isinstance(outcome, Tally)
            remaining = float("inf") if deadline is None else deadline - q.clock()
            if not blocking or remaining <= 0:
                yield from a.give_up_steps()
                return None
            grant = yield from a.wait_steps(outcome, remaining)
            if grant is not None:
                return grant
    except GeneratorExit:
        raise
    except BaseException:
        yield from a.give_up_steps()
        raise


class Acquire:
    """One acquire and what its tries share (see :func:`acquire_steps`): its request
    (``count`` levels of ``owner``'s hold of ``name``, for ``lease`` seconds; waiting
    if ``blocking``, until ``deadline`` on ``q.clock``; with ``fencing``, politely for
    ``polite_ms``, a re-entry of the hold of ``tag``), the calls every try sends
    besides its own, and what earlier tries and waits left: the owner's place as a
    waiter, the wake-ups seen, the split votes met."""

    __slots__ = (
        "blocking", "channel", "count", "deadline", "early", "fence_calls", "fenced",
        "fences", "first_try", "generation", "handing", "kind", "lease", "ms", "name",
        "owner", "place", "polite", "propose", "q", "registered", "splits", "tag",
        "ticket", "wait_s", "woken",
    )  # fmt: skip

    def __init__(
        self,
        q: Quorum,
        kind: LockKind,
        name: str,
        owner: str,
        count: int,
        lease: float,
        blocking: bool,
        deadline: float | None,
        fencing: bool = False,
        polite_ms: int = 0,
        tag: int = 0,
    ) -> None:
        self.q, self.kind, self.name, self.owner, self.count = q, kind, name, owner, count
        self.lease, self.blocking, self.deadline, self.tag = lease, blocking, deadline, tag
        self.ms = lease_ms(lease)
        fenced = self.fenced = fencing and count == 1 and kind.fenced
        # A fenced round may end once a quorum granted with counters that were kept.
        self.early = Early(q.voting, kept_counter) if fenced else kind.early(q)
        # The counters a fenced grant steps (one per name: a multi-lock has several).
        fences = self.fences = kind.fence_calls(name, owner, FENCE_TTL_MS) if fenced else []
        self.fence_calls = [call for _, call in fences] if fenced else fences
        self.channel = kind.wake_channel(name, owner)
        self.generation: int | None = None
        # Whether the last wait ended with a wake-up (which only one waiter gets): a
        # waiter that gives up after one must pass it on, or the other waiters would
        # sleep on.
        self.woken = False
        # Whether a try may have left the owner's place as a waiter on a master: a
        # waiter that gives up then takes it back.
        self.registered = False
        # When the first try that may have registered the owner went out: a master can
        # hand the lock over to a registered waiter only after that.
        self.first_try: float | None = None
        # Whether a release may hand this acquire the lock (see release_steps): a
        # fenced one needs a token, which only a round of its own steps.
        self.handing = kind.hands_over and count == 1 and not fenced
        self.splits = 0
        self.polite = polite_ms if count == 1 and blocking else 0
        # The end of the owner's place as a waiter, proposed to every master (ms since
        # the epoch, by q.wall): the same in each try, so that the masters order their
        # waiters alike whatever order the tries reach them in (see lua/acquire.lua).
        # One master orders them alike by itself: it is not sent there (its
        # registration ends a wait after the first try reached it, about when the
        # place does).
        self.place = 0
        self.propose = q.size > 1
        # Names this acquire in each of its tries: where it queues (the fair lock), its
        # place is tagged with it, so that a later acquire of the owner is told apart.
        self.ticket = next(_tickets)
        # How long the last try's place as a waiter lasts unless a next try renews it.
        self.wait_s = 0.0

    def try_steps(self, contended: Callable[[Tally], None] | None) -> Steps[Grant | Tally]:
        """One try: its round, judged. Returns the grant, or the tally of a try that
        did not win, undone (raises when the masters' replies end the acquire: a key
        of another type, too few answers, a re-entry whose hold is gone)."""
        q, kind, name, owner, count, lease = (
            self.q, self.kind, self.name, self.owner, self.count, self.lease
        )  # fmt: skip
        started = q.clock()
        wait_s = 0.0
        if self.blocking and count == 1:
            wait_s = lease
            if self.deadline is not None and not kind.in_arrival_order:
                wait_s = min(lease, self.deadline - started)
        self.wait_s = wait_s
        ms = self.ms
        wait_ms = ms if wait_s == lease else lease_ms(wait_s) if wait_s > 0 else 0
        if wait_ms > 0:
            self.registered = True
            if self.first_try is None:
                self.first_try = started
            if kind.targeted:
                wall_ms = int(q.wall() * 1000)
                if self.place <= wall_ms:  # the first try, or the place ended: a new one
                    self.place = wall_ms + wait_ms
        try_tag = self.tag if count > 1 else next(_tags)
        call = kind.attempt(q, made(Try, (
            name, owner, ms, f"{count}:{try_tag}", wait_ms, self.polite,  # hold_value
            self.place if self.propose else 0, self.ticket,
        )))  # fmt: skip
        self.polite = 0
        try:
            replies = q.judged(
                (yield q.durably(q.everywhere(call, *self.fence_calls, early=self.early)))
            )
        except BaseException:
            # Interrupted mid-round: some masters may have granted.
            yield _undo(q, kind, name, owner, count, try_tag)
            raise
        now = q.clock()
        attempts = list(map(attempt, map(first, replies)))
        q.watch.observe(attempts, started, now)
        tally, held = kind.judge(q, name, replies, attempts)
        valid_until = started + lease - q.drift(lease)
        if len(tally.granted) >= q.needed and valid_until > now and tally.wrong_type is None:
            if not self.fenced:
                taken_back = kind.kept(q, name, owner, tally, held, try_tag)
                if taken_back is not None:
                    yield taken_back
                return made(Grant, (valid_until, None, len(tally.granted), held, try_tag))
            fences = self.fences
            try:
                proofs = [
                    token_of(q, label, tally.granted, replies, 1 + j)
                    for j, (label, _) in enumerate(fences)
                ]
                tokens = [t for t in proofs if t is not None]
                proven = len(tokens) == len(fences) and (
                    yield from _write_back(q, kind, name, tokens)
                )
            except BaseException:  # FencingError, or interrupted: held nowhere after
                yield _undo(q, kind, name, owner, count, try_tag)
                raise
            if proven and valid_until > q.clock():
                # A multi-lock's: one per name, even of one name.
                token = tuple(tokens) if kind.names else tokens[0]
                return Grant(valid_until, token, len(tally.granted), held, try_tag)
            # Not proven in time: undone below, and tried again.
        if contended is not None:
            contended(tally)
        # The next try waits for the votes of then: masters may have been counted out.
        self.early = Early(q.voting, kept_counter) if self.fenced else kind.early(q)
        if tally.granted or tally.failed or tally.unread:
            # Undo everywhere, also where the reply was lost or not read: such a master
            # may have granted.
            yield _undo(q, kind, name, owner, count, try_tag)
            settle = None
            if tally.granted:
                settle = kind.settle(name, owner, replies, release_id(owner))
            if settle is not None:
                yield q.everywhere(settle, cleanup=True)
        if tally.wrong_type is not None:
            raise tally.wrong_type
        if len(tally.failed) > q.tolerated:
            raise q.unavailable(f"acquire {name!r}", tally.failed)
        if count > 1:
            if len(tally.refused) > q.tolerated:  # gone from so many: not on a quorum
                raise LockLostError(f"lock {name!r} was lost: re-entry found no hold on a quorum")
            raise q.unavailable(f"re-enter {name!r}", tally.failed)  # held? not known
        return tally

    def wait_steps(self, tally: Tally, remaining: float) -> Steps[Grant | None]:
        """The wait after a try that did not win (``tally``), ``remaining`` seconds
        at most: until a release wakes the owner, its place needs renewing, or a split
        vote's back-off ends. Returns a grant a release handed over, else None: try
        again."""
        q, kind, owner, channel = self.q, self.kind, self.owner, self.channel
        if self.generation is None:
            self.generation = yield Watch(channel, owner, kind.broadcast, kind.targeted)
            if not kind.targeted:
                # Subscribed just now: a release may have come before. Try again.
                return None
            # Targeted: this try registered the owner, and a release wakes it by name on
            # the manager's home channel. A wake-up that came before the watch, or that
            # may have been missed because that channel was not yet heard everywhere,
            # is already counted: the wait below ends at once.
        if tally.granted and not kind.queued:
            # A split vote: back off for a random time that no release cuts short (the
            # split's own undos announce releases: a wait for one would end at once,
            # and every contender would retry in step and split again). Its bound
            # doubles once for a second split: a longer growth leaves the contenders
            # that split most asleep while others take turns (starved).
            self.splits += 1
            bound = q.retry_jitter * 2 ** min(self.splits - 1, SPLIT_BACKOFF_DOUBLINGS)
            yield Pause(min(remaining, q.uniform(0.0, bound)))
            return None
        if tally.granted or tally.holder_ttl is None:
            # A split vote of a queued kind (it settles by queue order), or a holder
            # with no TTL seen: retry after a random delay.
            pause = q.uniform(0.0, q.retry_jitter)
        else:
            # Expiry publishes nothing: wake by the holder's TTL at the latest.
            pause = tally.holder_ttl + 0.001
        if kind.queued:
            pause = min(pause, self.wait_s / 3)  # refresh our place before it lapses
        elif kind.targeted:
            # Renew the registration as it ends: at the end of its place (proposed at
            # an earlier try, so sooner than this try's wait), else of the wait.
            ends = self.place / 1000 - q.wall() if self.place else self.wait_s
            pause = min(pause, max(ends, 0.0))
        before = self.generation
        self.generation = yield Wait(channel, owner, before, min(remaining, pause))
        self.woken = self.generation != before
        if self.woken and self.handing:
            handover = yield Handed(channel, owner)
            if handover is not None:
                # Not usable as it is (another lease, too little validity left, or too
                # few masters): None, and the next try takes it, as the owner's own.
                return _handed_grant(q, handover, self.first_try, self.ms)
        return None

    def give_up_steps(self) -> Steps[None]:
        """Take back the owner's place as a waiter, if a try may have left one (and,
        where the lock is free, pass on a wake-up it had); or pass the wake-up on."""
        q, owner = self.q, self.owner
        call = None
        if self.registered:
            call = self.kind.abandon(self.name, owner, release_id(owner), next(_tags))
        passed_on = False
        if call is not None:
            replies = yield q.everywhere(call, cleanup=True)
            # Where the lock is free, the masters woke the next registered waiter already.
            passed_on = bool(woken_by(decoded(release, replies)))
        if self.woken and not passed_on:
            yield Relay(self.channel, owner)


def _undo(q: Quorum, kind: LockKind, name: str, owner: str, count: int, tag: int) -> Fanout:
    """The round that takes back a try (of ``tag``) that did not win (see
    :func:`acquire_steps`).

    Its replies are read before the owner's next round: a master that forgot the
    scripts (NOSCRIPT) is then sent the undo again rather than left holding the grant,
    and the owner's next try, which may go out on another connection, cannot reach a
    master before this undo did. (A master that does not answer in time fails fast from
    then on: see .fanout.)"""
    undo_call = kind.undo(name, owner, hold_value(count - 1, tag), release_id(owner))
    return q.everywhere(undo_call, cleanup=True)


def _handed_grant(q: Quorum, handover: Handover, first_try: float | None, ms: int) -> Grant | None:
    """The grant a waiter was handed by a release of its own manager (see
    :func:`release_steps`), if it can keep it as it is: made for this acquire (the
    release went out after its first try: a hand-over told late may have been meant
    for an earlier acquire of the same owner, whose hold was given back since), with
    its own lease, by a quorum, and with at least two thirds of the lease left. Its
    validity counts from the release's start (before the grants), less the drift."""
    since = handover.since
    if first_try is None or since < first_try:
        return None
    if handover.lease_ms != ms or len(handover.masters) < q.needed:
        return None
    lease = ms / 1000.0
    valid_until = since + lease - q.drift(lease)
    if valid_until - q.clock() < lease * 2 / 3:
        return None
    return Grant(valid_until, None, len(handover.masters), tag=handover.tag)


def _write_back(q: Quorum, kind: LockKind, name: str, tokens: Sequence[int]) -> Steps[bool]:
    """Raise the counters to ``tokens`` everywhere; True once a quorum acknowledged
    every one."""

    def acked(replies: Sequence[Reply]) -> bool:
        counters = [integer_of(r) for r in replies]
        return all(c is not None and c >= t for c, t in zip(counters, tokens, strict=True))

    raise_calls = kind.fence_raise_calls(name, tokens, FENCE_TTL_MS)
    replies = yield q.everywhere(*raise_calls, early=Early(q.voting, acked))
    return sum(1 for per_master in replies if acked(per_master)) >= q.needed


def release_steps(
    q: Quorum,
    kind: LockKind,
    name: str,
    owner: str,
    count_left: int,
    tag: int,
    lease: float = 0.0,
    defer: bool = False,
    reserve_ms: int = 0,
    ends: int = 0,
) -> Steps[Freed]:
    """Release one level of the owner's hold of ``tag``; at ``count_left == 0`` free it
    everywhere, and the owner's hold of :attr:`~.kinds.LockKind.ends_too` of tag
    ``ends`` (if not 0) with it.

    A final release on a single master (with the hold's ``lease``, of a kind that
    :attr:`~.kinds.LockKind.hands_over`) hands the lock over when the registered waiter
    it would wake belongs to this same manager: the master grants it to that waiter
    with the same lease in the same script call, and the waiter, told here, holds it
    with no round of its own (see :func:`acquire_steps`). The releasing owner coming
    straight back is then refused like any newcomer, so the threads (or tasks) of one
    manager take turns in the order they registered, at the cost of one round trip per
    turn. A waiter of another manager is woken, and the lock reserved for it
    ``reserve_ms``. On several masters a release only wakes: independent masters could
    hand the lock, or reserve it, for different waiters, splitting the vote. With
    ``defer`` (a final release, any number of masters) nobody is woken or handed the
    lock at all (see :mod:`.turns`): while a manager's turn is young, its owner coming
    straight back is the cheapest next holder.

    Returns what it did besides (:class:`Freed`): whether a master deferred the
    wake-up (the caller sends it later, see :func:`wake_steps`), and whether a master
    woke a waiter. Raises :class:`LockLostError` when the owner's hold was gone from so
    many masters that it was not on a quorum any more, and
    :class:`QuorumUnavailableError` when too many masters failed to tell; a release
    that a quorum neither confirmed nor refused (masters that did not answer may hold
    the lock) returns, the rest expiring with its lease.
    """
    # A hold handed over is made by this release: its number is the hold's tag.
    handed_tag = next(_tags)
    rid = f"{owner}:{handed_tag}"  # release_id
    final = count_left == 0 and lease > 0 and kind.hands_over
    handover_ms = lease_ms(lease) if final and q.size == 1 else 0
    handover = f"{handover_ms}:{handed_tag}" if handover_ms else "0"
    left = f"{count_left}:{tag}"  # hold_value
    started = q.clock()
    if final and (defer or reserve_ms):
        call = kind.release_in_turn(name, owner, left, rid, handover, defer, reserve_ms)
    else:
        call = kind.release(name, owner, left, rid, handover, ends if count_left == 0 else 0)
    replies = yield q.everywhere(call, early=q.until_held, cleanup=True)
    releases = list(map(release, map(first, replies)))
    tally = tally_holds(q, kind.key, name, replies, releases)
    channels = kind.notify_channels(name) if count_left == 0 else ()
    deferred = False
    woken: tuple[str, ...] = ()
    if channels:
        woken = woken_by(releases)
        # A master hands the lock over only to a waiter it woke.
        handed: tuple[tuple[str, Handover], ...] = (
            tuple(handed_over(releases, started, handed_tag).items())
            if woken and handover_ms
            else ()
        )
        # On one master (the only one a hand-over is made on), a lost reply may hide
        # a hand-over to any of our waiters: all of them are told, and find out by
        # trying.
        everyone = bool(handover_ms) and releases[0] is None
        # Only a master that said so: one whose reply was lost (slow, or frozen) is
        # not worth a round of wake-ups on every master; on one master the caller
        # sends it anyway (the release fails).
        deferred = defer and any(map(_deferred, filter(None, releases)))
        if woken or everyone or not deferred:  # a deferred wake-up wakes nobody yet
            yield Notify(channels, rid, woken, handed, everyone)
    if len(tally.granted) >= q.needed:
        return made(Freed, (deferred, bool(woken)))
    if tally.wrong_type is not None:
        raise tally.wrong_type
    if len(tally.refused) > q.tolerated:
        # Gone from so many masters that it was not on a quorum any more.
        raise LockLostError(f"lock {name!r} was lost before its release: no hold on a quorum")
    if len(tally.failed) > q.tolerated:
        raise q.unavailable(f"release {name!r}", tally.failed)
    # Not confirmed on a quorum, but not shown gone from one either (masters that did
    # not answer may hold it): released where it could be; what is left expires.
    return Freed(deferred, bool(woken))


def wake_steps(q: Quorum, kind: LockKind, name: str, reserve_ms: int, manager: str) -> Steps[None]:
    """Send a release's deferred wake-up (see :mod:`.turns`) for ``manager`` (its id):
    where ``name`` is free, the masters wake its next waiter, reserving the lock for it
    ``reserve_ms``."""
    rid = release_id(f"{manager}:wake")
    yield q.everywhere(kind.wake(name, rid, reserve_ms), cleanup=True)


def extend_steps(
    q: Quorum,
    kind: LockKind,
    name: str,
    owner: str,
    ms: int,
    add: bool,
    tag: int,
    to: tuple[str, str] | None = None,
) -> Steps[float]:
    """Extend ``owner``'s hold of ``tag`` everywhere it still holds it (by ``ms``, or to
    ``ms`` from now); returns the new end of the validity, judged as an acquire's: from
    before the first send, by the time the hold stays on a quorum, less the drift
    allowance. With ``to`` (an owner id and its hold, ``'<count>:<tag>'``), the hold
    also moves to that owner (a take-over: ``add`` is False).

    Raises :class:`LockLostError` when the hold is gone from so many masters that it is
    not on a quorum any more, or the round ended too late, and
    :class:`QuorumUnavailableError` when too few masters extended it to tell.
    """
    started = q.clock()

    def kept(replies: Sequence[Reply]) -> bool:
        return (extended(replies[0]) or 0) > 0

    call = (
        kind.extend(name, owner, ms, add, tag)
        if to is None
        else kind.take_over(name, owner, tag, *to, ms)
    )
    replies = yield q.everywhere(call, early=Early(q.voting, kept))
    lefts = decoded(extended, replies)
    left = sorted(
        (n for i, n in enumerate(lefts) if n is not None and n > 0 and q.watch.counts(i)),
        reverse=True,
    )
    if len(left) >= q.needed:
        # The time the hold stays on a quorum of masters (the needed-th longest).
        ttl = left[q.needed - 1] / 1000.0
        valid_until = started + ttl - q.drift(ttl)
        if valid_until > q.clock():
            return valid_until
        raise LockLostError(f"lock {name!r} was lost: its validity ended during the extension")
    failed = {i: r[0] for i, r in enumerate(replies) if isinstance(r[0], BaseException)}
    for i, error in failed.items():
        if is_wrong_type(error):
            raise LockKeyTypeError(kind.key(name), q.masters[i], str(error))
    if lefts.count(0) > q.tolerated:  # gone from so many masters
        raise LockLostError(f"lock {name!r} was lost: the extension found no hold on a quorum")
    raise q.unavailable(f"extend {name!r}", failed)  # extended on too few to tell


def force_unlock_steps(
    q: Quorum, kinds: Sequence[FamilyKind], name: str, manager: str
) -> Steps[bool]:
    """Delete ``name``'s locks of the given kinds on every master, whoever holds them,
    and wake their waiters (for ``manager``, its id). True if any master had one."""
    rid = release_id(f"{manager}:force")
    replies = yield q.everywhere(*(k.force_unlock(name, rid) for k in kinds), cleanup=True)
    deleted = False
    failed: dict[int, BaseException] = {}
    for i, per_master in enumerate(replies):
        for kind, reply in zip(kinds, per_master, strict=True):
            if is_wrong_type(reply):
                raise LockKeyTypeError(kind.key(name), q.masters[i], str(reply))
            if isinstance(reply, BaseException):
                failed[i] = reply
            elif (r := release(reply)) is not None and r.status == 1:
                deleted = True
    if len(failed) > q.tolerated:
        raise q.unavailable(f"force-unlock {name!r}", failed)
    channels = tuple(c for k in kinds for c in k.notify_channels(name))
    if channels:
        woken = tuple(
            w
            for i, k in enumerate(kinds)
            if k.targeted
            for w in woken_by(decoded(release, replies, i))
        )
        yield Notify(channels, rid, woken)
    return deleted


#: a read of a master's memory record (see :mod:`.clockwatch`)
MEMORY_CALL = Call(scripts.MEMORY, (keys.MEMORY_KEY,), ())


def probe_steps(
    q: Quorum, kinds: Sequence[FamilyKind], name: str, memories: bool = False
) -> Steps[list[MasterView]]:
    """Read ``name``'s locks of the given kinds on every master, changing nothing
    (beyond purging holds and waiters whose time has ended); with ``memories``, each
    master's memory record too (whether its votes count yet)."""
    calls = [k.probe(name) for k in kinds]
    replies = yield q.everywhere(*calls, MEMORY_CALL) if memories else q.everywhere(*calls)
    out: list[MasterView] = []
    watch = q.watch
    for i, (master, per_master) in enumerate(zip(q.masters, replies, strict=True)):
        view = MasterView(master)
        kept = memory(per_master[-1]) if memories else None
        if kept is not None and kept.age is not None:
            age = max(0, kept.age)  # no record: the next try's memory begins
            view.memory, view.failover = kept.age / 1000.0 if kept.age >= 0 else None, kept.failover
            if not (kept.failover and watch.trusts_failover[i]):
                view.quarantined = max(0.0, watch.memory_ms - age) / 1000.0
        for kind, reply in zip(kinds, per_master[: len(kinds)], strict=True):
            try:
                if isinstance(reply, BaseException):
                    raise reply
                lock = kind.view(reply)
            except Exception as error:
                view.error = f"{type(error).__name__}: {error}"
                view.locks = []
                break
            if lock is not None:
                view.locks.append(lock)
        out.append(view)
    return out


def held_by_quorum(q: Quorum, kind: FamilyKind, views: Sequence[MasterView]) -> bool:
    """Whether a quorum of masters holds the lock (for ``locked()``)."""
    failed = {i: RuntimeError(v.error) for i, v in enumerate(views) if v.error is not None}
    if len(failed) > q.tolerated:
        raise q.unavailable("probe", failed)
    held = sum(1 for v in views if any(kind.is_locked(lock) for lock in v.locks))
    return held >= q.needed
