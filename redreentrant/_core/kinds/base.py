"""What every lock kind is: the hold operations of a plain lock, which the other kinds
override where they differ, and what a kind that can be inspected adds (see
:mod:`redreentrant._core.kinds`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from .. import keys, scripts
from ..effects import Call, Early, Fanout, made
from ..errors import LockUpgradeError
from ..quorum import Quorum, Replies, Tally, tally_grants
from ..replies import Attempt, probe, text, ttl_of
from ..views import LockView

#: one hold to renew: ``(name, owner, hold)``, the hold as :func:`hold_value` makes it
#: (count 0: renew it only, never take it again)
Renewal = tuple[str, str, str]
#: a try's first replies, decoded
Attempts = Sequence[Attempt | None]


def hold_value(count: int, tag: int) -> str:
    """A hold as the masters keep it and the scripts are sent it: ``"<count>:<tag>"``,
    its hold count and the tag of the try that made it. Tags grow with every try (see
    :func:`~.rounds.next_tag`), and a script changes an owner's hold only with a call
    of its own tag (or, to free it, of a later one): nothing sent for one try, however
    late it reaches a master, changes a hold that a later try made."""
    return f"{count}:{tag}"


def count_of(hold: object) -> int:
    """The hold count of a hold a probe read (``"<count>:<tag>"``, or a bare count)."""
    return int(text(hold).partition(":")[0])


def tag_of(hold: str) -> int:
    """The tag of a hold (see :func:`hold_value`)."""
    return int(hold.rpartition(":")[2])


class Try(NamedTuple):
    """One try of an acquire, as its kind makes the call (see :meth:`LockKind.acquire`)."""

    name: str
    owner: str
    lease_ms: int
    #: ``"<count>:<tag>"`` (see :func:`hold_value`): count 1 takes, more re-enters
    hold: str
    #: how long a refused take registers the owner as a waiter (0: not at all)
    wait_ms: int
    #: a polite take's longest wait for another owner's registration (see :mod:`..turns`)
    polite_ms: int = 0
    #: the end of the owner's place as a waiter that it proposes, ms since the epoch
    place_ms: int = 0
    #: names the acquire, the same in each of its tries
    ticket: int = 0


class OwnHolds(Protocol):
    """An owner's holds as a kind's rules look at them (the manager's table of holds)."""

    @property
    def in_multi(self) -> Mapping[tuple[str, str], int]:
        """How many multi-locks hold each ``(name, owner)``."""

    def get(self, kind: LockKind, name: str, owner: str) -> object | None:
        """``owner``'s hold of ``kind`` on ``name``, if any."""


class LockKind(ABC):
    """An exclusive, reentrant lock: a hash ``owner -> hold`` under one key, the hold
    ``"<count>:<tag>"`` (see :func:`hold_value`).

    Its waiters register on the masters (a zset under the name's hash tag), and a
    release wakes one of them by name on its manager's home channel (see
    ``lua/release.lua``): nothing is subscribed per lock.
    """

    #: tells holds of different kinds apart (manager registry, renewal batches)
    label = "lock"
    #: the lock family shown by ``inspect``
    family = "lock"
    #: what follows the name's tag in the keys of its family (up to a ``:``)
    stems: tuple[str, ...] = ("", "waiters", "reserved")
    #: what a hold of this kind is called in messages
    noun = "lock"
    #: wake every waiter on a release (readers), rather than one at a time
    broadcast = False
    #: waiters hold a place in Redis that they must refresh while they wait
    queued = False
    #: refused waiters register on the masters, which wake one of them by name on its
    #: manager's home channel; the wake channel is then not subscribed
    targeted = True
    #: waiters are served in the order they registered: a registration lasts a lease
    #: whatever the acquire's timeout (a waiter that gives up ends it), so that its end
    #: orders the waiters by arrival
    in_arrival_order = False

    #: grants of this kind may carry a fencing token (``lua/fence.lua``)
    fenced = True

    #: a final release may hand the lock over to the waiter it wakes (see
    #: :func:`~redreentrant._core.rounds.release_steps`)
    hands_over = True

    #: a hold of this kind may be handed off to another owner, in any process (see
    #: :meth:`take_over`)
    hands_off = True

    #: the plain locks a hold of this kind takes (a multi-lock's names)
    names: tuple[str, ...] = ()

    #: a first hold of this kind looks at the owner's other holds (see :meth:`first_hold`)
    looks_around = False
    #: the owner's hold of this kind that the last release of a hold of this kind ends
    #: too (the upgradeable read's upgrade)
    ends_too: LockKind | None = None

    def seen_as(self) -> LockKind:
        """The kind of the lock object a hold of this kind is seen through (what a
        lost hold's report gives): this one."""
        return self

    @abstractmethod
    def families(self, name: str) -> tuple[tuple[FamilyKind, str], ...]:
        """The locks a hold of this kind on ``name`` is read and forced open through
        (``locked()``, ``force_unlock()``): a family's lock of that name, or each of a
        multi-lock's names' plain locks."""

    def first_hold(self, holds: OwnHolds, name: str, owner: str) -> LockKind:
        """The kind ``owner`` takes a first hold of ``name`` as, given its other holds
        (looked at when :attr:`looks_around`, or when the owner holds a multi-lock);
        raises :class:`LockUpgradeError` where it may not take it (it would wait for
        itself, or share a hold count)."""
        return self

    def key(self, name: str) -> str:
        """The key that holds the lock (named in errors)."""
        return keys.lock_key(name)

    def _keys(self, name: str) -> tuple[str, ...]:
        return keys.plain_keys(name)

    def wake_channel(self, name: str, owner: str) -> str:
        """Where ``owner`` waits for a release of ``name``."""
        return keys.wake_channel(name)

    def notify_channels(self, name: str) -> tuple[str, ...]:
        """Channels whose local waiters a full release here should wake at once."""
        return (keys.wake_channel(name),)

    # -- how an acquire's tries are made and judged (see rounds.acquire_steps) ---------

    def early(self, q: Quorum) -> Early | None:
        """When a try's round may stop reading: once a quorum granted."""
        return q.until_granted

    def attempt(self, q: Quorum, t: Try) -> Call:
        """The call of one try (see :meth:`acquire`); ``q`` draws at random for a kind
        that needs to. ``t.ticket`` names the acquire, the same in each of its tries: a
        kind that queues its waiters in order (the fair lock) tags the owner's place
        with it."""
        return self.acquire(t)

    def judge(
        self, q: Quorum, name: str, replies: Replies, attempts: Attempts
    ) -> tuple[Tally, LockKind]:
        """A try's replies judged (``attempts``: their first call's, decoded), and the
        kind a grant is held as: this one."""
        return tally_grants(q, self.key, name, replies, attempts), self

    def kept(
        self, q: Quorum, name: str, owner: str, tally: Tally, held: LockKind, tag: int
    ) -> Fanout | None:
        """After a grant (``held``, by the try of ``tag``): the round that takes back what
        the masters outside ``tally.granted`` may have granted besides; None: nothing to
        take back."""
        return None

    def acquire(self, t: Try) -> Call:
        """Take (count 1) or re-enter (count > 1) with ``t.hold``, ``"<count>:<tag>"``
        (see :func:`hold_value`); replies ``{1, n, time}`` or ``{0, ms, time}`` (the
        server's time in ms last, as every try's reply has it).

        A refused take registers the owner as a waiter for ``wait_ms`` (0: not at all),
        until ``place_ms`` if given (the end the owner proposes, in ms since the epoch,
        the same on every master: see ``lua/acquire.lua``). A ``polite_ms`` take (see
        :mod:`.turns`) is refused, although the lock is free, while another owner is
        registered, and told what is left of that registration, at most ``polite_ms``."""
        name, owner, lease_ms, hold, wait_ms, polite_ms, place_ms, _ = t
        args: tuple[str | int, ...] = (owner, lease_ms, hold, wait_ms)
        if place_ms:
            return Call(
                scripts.ACQUIRE, self._keys(name), (*args, polite_ms, place_ms), None, (2, 5)
            )
        if polite_ms:
            args = (*args, polite_ms)
        return made(Call, (scripts.ACQUIRE, self._keys(name), args, None, (2,)))

    def release(
        self, name: str, owner: str, left: str, release_id: str, handover: str = "0", ends: int = 0
    ) -> Call:
        """Set the owner's hold to ``left``, ``"<count>:<tag>"`` (count 0 frees a hold
        of that tag or an earlier one); replies ``{1, ''}``, ``{0, woken, ms, 0}`` or
        ``{-1, ''}``, where ``woken`` is the waiter the masters woke and ``ms`` the lease
        it was handed the lock with (0: only woken).

        ``release_id`` is the payload of the wake-up sent when the lock is freed;
        ``handover``, ``"<ms>:<tag>"`` (``"0"``: none), hands the lock over to the
        waiter woken, with that lease and tag. ``ends``: the tag of the owner's hold of
        :attr:`ends_too` that a final release ends too (0: none; see
        :class:`~.rw.UpgradeableKind`)."""
        return self._ends(name, owner, left, release_id, "1", handover)

    def release_in_turn(
        self, name: str, owner: str, left: str, release_id: str, handover: str, defer: bool,
        reserve_ms: int,
    ) -> Call:  # fmt: skip
        """A final release by a manager taking turns (see :mod:`.turns`; only for a
        kind that :attr:`hands_over`): as :meth:`release`, and ``defer`` wakes (or hands
        the lock to) nobody, replying ``{0, '', 0, 1}`` when there was a waiter to wake,
        while ``reserve_ms`` > 0 reserves the lock that long for the waiter woken."""
        deferred = "1" if defer else "0"
        return self._ends(name, owner, left, release_id, "1", handover, deferred, reserve_ms)

    def wake(self, name: str, release_id: str, reserve_ms: int) -> Call:
        """A deferred wake-up: where the lock is free, wake the next waiter, reserving
        the lock for it ``reserve_ms``; replies ``{0, woken}``."""
        args = ("wake", keys.wake_channel(name), release_id, keys.HOME_PREFIX, reserve_ms)
        return Call(scripts.RELEASE, self._keys(name), args)

    def undo(self, name: str, owner: str, left: str, release_id: str) -> Call:
        """Take back a try that failed to reach a quorum (``left``: the try's hold less
        one level, see :meth:`release`), keeping any place the owner holds as a waiter
        (it is still waiting)."""
        return self._ends(name, owner, left, release_id, "0", "0")

    def _ends(self, name: str, owner: str, left: str, rid: str, end: str, *more: str | int) -> Call:
        """The call of a :meth:`release` (``end`` "1": the owner's wait ends too) and
        of an :meth:`undo` (``end`` "0"); ``more``: what else the kind's script takes
        (here the hand-over, and a release in turn's deferral and reservation)."""
        channel = keys.wake_channel(name)
        args = ("release", owner, left, channel, rid, keys.HOME_PREFIX, end, *more)
        return made(Call, (scripts.RELEASE, self._keys(name), args, None, ()))

    def abandon(self, name: str, owner: str, release_id: str, tag: int) -> Call | None:
        """Remove a waiter's place when its acquire gives up (and, where the lock is
        free, hand a wake-up it may have had on to the next waiter), and any hold of
        ``tag`` or an earlier one that a try left or a release handed it; None if the
        kind keeps no place for waiters."""
        args = ("abandon", owner, keys.wake_channel(name), release_id, keys.HOME_PREFIX, tag)
        return Call(scripts.RELEASE, self._keys(name), args)

    def settle(self, name: str, owner: str, replies: Replies, release_id: str) -> Call | None:
        """After a split vote (granted by some masters, not a quorum): a call that makes
        the next round likelier to agree (nothing to do here: jitter suffices)."""
        return None

    def fence_key(self, name: str) -> str:
        """The key of the lock's fencing counter."""
        return keys.aux_key(name, "fence")

    def holder_field(self, owner: str) -> str:
        """The field of :meth:`key`'s hash that is present while ``owner`` holds it."""
        return owner

    def fence_next(self, name: str, owner: str, ttl_ms: int) -> Call:
        """Step the fencing counter where ``owner`` holds the lock (``fence.lua``
        ``next``); replies ``{held, value, fresh}``."""
        args = ("next", self.holder_field(owner), ttl_ms)
        return Call(scripts.FENCE, (self.key(name), self.fence_key(name)), args)

    def fence_raise(self, name: str, token: int, ttl_ms: int) -> Call:
        """Raise the fencing counter to at least ``token`` (``fence.lua`` ``raise``)."""
        args = ("raise", token, ttl_ms)
        return Call(scripts.FENCE, (self.key(name), self.fence_key(name)), args)

    def fence_read(self, name: str) -> Call:
        """Read the fencing counter, changing nothing: ``fence.lua`` ``next`` for the
        empty holder field, which no hash has; replies ``{0, value, fresh}``, the value
        being the master's clock in microseconds where the counter is absent."""
        return Call(scripts.FENCE, (self.key(name), self.fence_key(name)), ("next", "", 0))

    def fence_calls(self, name: str, owner: str, ttl_ms: int) -> list[tuple[str, Call]]:
        """The counters a fenced grant steps: (the name a token is for, its call)."""
        return [(name, self.fence_next(name, owner, ttl_ms))]

    def fence_raise_calls(self, name: str, tokens: Sequence[int], ttl_ms: int) -> list[Call]:
        """The write-back of :meth:`fence_calls`' tokens."""
        return [self.fence_raise(name, tokens[0], ttl_ms)]

    def extend(self, name: str, owner: str, ms: int, add: bool, tag: int) -> Call:
        """Extend ``owner``'s hold of ``tag`` where it still holds it: by ``ms``
        (``add``) or to ``ms`` from now; replies the hold's milliseconds left, 0 where
        it holds nothing."""
        args = (owner, ms, "add" if add else "set", tag)
        return Call(scripts.EXTEND, (self.key(name),), args)

    def take_over(self, name: str, owner: str, tag: int, to: str, hold: str, ms: int) -> Call:
        """Move ``owner``'s hold of ``tag`` to the owner ``to`` (as ``hold``,
        ``'<count>:<tag>'``) where it still holds it, its lease set to ``ms`` from now;
        replies as :meth:`extend`."""
        return Call(scripts.EXTEND, (self.key(name),), (owner, ms, "set", tag, to, hold))

    def renew(self, entries: Sequence[Renewal], lease_ms: int) -> Call:
        """Renew many ``(name, owner, hold)`` holds of this kind in one call, taking
        each again where the lock is free (unless its hold's count is 0); replies a
        flag per hold (1 renewed, 2 taken again, 0 not held), then the server's time."""
        return Call(
            scripts.RENEW,
            tuple(self.key(name) for name, _, _ in entries),
            (lease_ms, *(x for _, owner, hold in entries for x in (owner, hold))),
        )


class FamilyKind(LockKind, ABC):
    """A kind that names a family of locks: a name's locks of that family can be read
    (``inspect``, ``locked()``, ``names()``) and forced open."""

    @abstractmethod
    def probe(self, name: str) -> Call:
        """Read the lock on a master, changing nothing (see :meth:`view`)."""

    def view(self, reply: object) -> LockView | None:
        """Read a probe reply; None when nobody holds or waits for the lock on that
        master. (A hash of holds, and waiters, as :func:`~..replies.probe` reads.)"""
        seen = probe(reply)
        holders = {owner: count_of(hold) for owner, hold in seen.fields.items()}
        # A holder keeps its registration until its final release (the fair lock's its
        # place at the head): not a waiter.
        queue = [owner for owner in seen.waiting if owner not in holders]
        if not holders and not queue:
            return None
        return LockView(self.family, None, ttl_of(seen.pttl), holders, queue)

    @abstractmethod
    def force_unlock(self, name: str, release_id: str) -> Call:
        """Free the lock whoever holds it, and wake its waiters."""

    def is_locked(self, view: LockView | None) -> bool:
        """Whether a master's view counts as this lock being held (for ``locked()``)."""
        return view is not None and bool(view.holders)

    def families(self, name: str) -> tuple[tuple[FamilyKind, str], ...]:
        return ((self, name),)


class PlainKind(FamilyKind):
    """The plain lock (see :class:`LockKind`)."""

    def first_hold(self, holds: OwnHolds, name: str, owner: str) -> LockKind:
        # A master keeps one hold count per name and owner: a name may not be held both
        # alone and in a multi-lock.
        if (name, owner) in holds.in_multi:
            raise LockUpgradeError(
                f"lock {name!r} is held by this owner in a multi-lock: it cannot take"
                " that lock by itself too (release the multi-lock first)"
            )
        return self

    def force_unlock(self, name: str, release_id: str) -> Call:
        args = ("force", keys.wake_channel(name), release_id, keys.HOME_PREFIX)
        return Call(scripts.RELEASE, self._keys(name), args)

    def probe(self, name: str) -> Call:
        return Call(scripts.PROBE, self._keys(name)[:2], ())


#: the plain lock
EXCLUSIVE = PlainKind()
