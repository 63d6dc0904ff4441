"""Lock kinds: what makes one kind of lock differ from another.

A kind supplies the script calls for its operations, the channels its waiters listen
on, and how to read its probe reply. The rounds themselves (fan-out, validity, undo,
retry, wake-ups, renewal) are the same for every kind and live in
:mod:`redreentrant._core.rounds`. Kinds are stateless singletons.

Keys: each kind has keys of its own under the lock's hash tag, so ``lock("x")``,
``rw_lock("x")`` and ``fair_lock("x")`` are three independent locks.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Sequence

from . import keys, scripts
from .effects import Call, Early, Fanout, Groups
from .quorum import NO_WAIT, Quorum, Tally, tally_grants
from .views import LockView, MasterView, pairs, text, ttl_of

#: one hold to renew: ``(name, owner, hold)``, the hold as :func:`hold_value` makes it
#: (count 0: renew it only, never take it again)
Renewal = tuple[str, str, str]


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


class LockKind:
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

    #: the plain locks a hold of this kind takes (a multi-lock's names)
    names: tuple[str, ...] = ()

    @property
    def upgrade_from(self) -> LockKind | None:
        """A kind whose holder may not take this one (it would wait for itself)."""
        return None

    def key(self, name: str) -> str:
        """The key that holds the lock (named in errors)."""
        return keys.lock_key(name)

    def _keys(self, name: str) -> tuple[str, ...]:
        return keys.lock_key(name), keys.waiters_key(name), keys.reserved_key(name)

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

    def attempt(
        self,
        q: Quorum,
        name: str,
        owner: str,
        lease_ms: int,
        hold: str,
        wait_ms: int,
        polite_ms: int = 0,
        place_ms: int = 0,
        ticket: int = 0,
    ) -> Call:
        """The call of one try (see :meth:`acquire`); ``q`` draws at random for a kind
        that needs to. ``ticket`` names the acquire, the same in each of its tries: a
        kind that queues its waiters in order (the fair lock) tags the owner's place
        with it."""
        return self.acquire(name, owner, lease_ms, hold, wait_ms, polite_ms, place_ms)

    def judge(
        self, q: Quorum, name: str, replies: Sequence[Sequence[object]]
    ) -> tuple[Tally, LockKind]:
        """A try's replies judged, and the kind a grant is held as: this one."""
        return tally_grants(q, self.key(name), replies), self

    def kept(
        self, q: Quorum, name: str, owner: str, tally: Tally, held: LockKind, tag: int
    ) -> Fanout | None:
        """After a grant (``held``, by the try of ``tag``): the round that takes back what
        the masters outside ``tally.granted`` may have granted besides; None: nothing to
        take back."""
        return None

    def acquire(
        self,
        name: str,
        owner: str,
        lease_ms: int,
        hold: str,
        wait_ms: int,
        polite_ms: int = 0,
        place_ms: int = 0,
    ) -> Call:
        """Take (count 1) or re-enter (count > 1) with ``hold``, ``"<count>:<tag>"``
        (see :func:`hold_value`); replies ``{1, n, time}`` or ``{0, ms, time}`` (the
        server's time in ms last, as every try's reply has it).

        A refused take registers the owner as a waiter for ``wait_ms`` (0: not at all),
        until ``place_ms`` if given (the end the owner proposes, in ms since the epoch,
        the same on every master: see ``lua/acquire.lua``). A ``polite_ms`` take (see
        :mod:`.turns`) is refused, although the lock is free, while another owner is
        registered, and told what is left of that registration, at most ``polite_ms``."""
        args: tuple[str | int, ...] = (owner, lease_ms, hold, wait_ms)
        if place_ms:
            return Call(
                scripts.ACQUIRE, self._keys(name), (*args, polite_ms, place_ms), None, (2, 5)
            )
        if polite_ms:
            args = (*args, polite_ms)
        return Call(scripts.ACQUIRE, self._keys(name), args, None, (2,))

    def release(
        self, name: str, owner: str, left: str, release_id: str, handover: str = "0"
    ) -> Call:
        """Set the owner's hold to ``left``, ``"<count>:<tag>"`` (count 0 frees a hold
        of that tag or an earlier one); replies ``{1, ''}``, ``{0, woken, ms, 0}`` or
        ``{-1, ''}``, where ``woken`` is the waiter the masters woke and ``ms`` the lease
        it was handed the lock with (0: only woken).

        ``release_id`` is the payload of the wake-up sent when the lock is freed;
        ``handover``, ``"<ms>:<tag>"`` (``"0"``: none), hands the lock over to the
        waiter woken, with that lease and tag."""
        return self._release_call(name, owner, left, release_id, "1", handover)

    def release_in_turn(
        self, name: str, owner: str, left: str, release_id: str, handover: str, defer: bool,
        reserve_ms: int,
    ) -> Call:  # fmt: skip
        """A final release by a manager taking turns (see :mod:`.turns`; only for a
        kind that :attr:`hands_over`): as :meth:`release`, and ``defer`` wakes (or hands
        the lock to) nobody, replying ``{0, '', 0, 1}`` when there was a waiter to wake,
        while ``reserve_ms`` > 0 reserves the lock that long for the waiter woken."""
        extra = ("1" if defer else "0", reserve_ms)
        return self._release_call(name, owner, left, release_id, "1", handover, extra)

    def wake(self, name: str, release_id: str, reserve_ms: int) -> Call:
        """A deferred wake-up: where the lock is free, wake the next waiter, reserving
        the lock for it ``reserve_ms``; replies ``{0, woken}``."""
        args = ("wake", keys.wake_channel(name), release_id, keys.HOME_PREFIX, reserve_ms)
        return Call(scripts.RELEASE, self._keys(name), args)

    def undo(self, name: str, owner: str, left: str, release_id: str) -> Call:
        """Take back a try that failed to reach a quorum (``left``: the try's hold less
        one level, see :meth:`release`), keeping any place the owner holds as a waiter
        (it is still waiting)."""
        return self._release_call(name, owner, left, release_id, "0")

    def _release_call(
        self,
        name: str,
        owner: str,
        left: str,
        rid: str,
        leave: str,
        handover: str = "0",
        extra: tuple[str | int, ...] = (),
    ) -> Call:
        channel = keys.wake_channel(name)
        args = ("release", owner, left, channel, rid, keys.HOME_PREFIX, leave, handover)
        return Call(scripts.RELEASE, self._keys(name), args + extra)

    def abandon(self, name: str, owner: str, release_id: str, tag: int) -> Call | None:
        """Remove a waiter's place when its acquire gives up (and, where the lock is
        free, hand a wake-up it may have had on to the next waiter), and any hold of
        ``tag`` or an earlier one that a try left or a release handed it; None if the
        kind keeps no place for waiters."""
        args = ("abandon", owner, keys.wake_channel(name), release_id, keys.HOME_PREFIX, tag)
        return Call(scripts.RELEASE, self._keys(name), args)

    def settle(
        self, name: str, owner: str, replies: Sequence[Sequence[object]], release_id: str
    ) -> Call | None:
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

    def renew(self, entries: Sequence[Renewal], lease_ms: int) -> Call:
        """Renew many ``(name, owner, hold)`` holds of this kind in one call, taking
        each again where the lock is free (unless its hold's count is 0); replies a
        flag per hold (1 renewed, 2 taken again, 0 not held), then the server's time."""
        return Call(
            scripts.RENEW,
            tuple(keys.lock_key(name) for name, _, _ in entries),
            (lease_ms, *(x for _, owner, hold in entries for x in (owner, hold))),
        )

    def force_unlock(self, name: str, release_id: str) -> Call:
        args = ("force", keys.wake_channel(name), release_id, keys.HOME_PREFIX)
        return Call(scripts.RELEASE, self._keys(name), args)

    def probe(self, name: str) -> Call:
        return Call(scripts.PROBE, (keys.lock_key(name), keys.waiters_key(name)), ())

    def view(self, reply: object) -> LockView | None:
        """Read a probe reply; None when nobody holds or waits for the lock on that
        master."""
        if not isinstance(reply, list) or len(reply) < 3 or not isinstance(reply[2], list):
            raise ValueError(f"unexpected probe reply {reply!r}")
        holders = {owner: count_of(hold) for owner, hold in pairs(reply[1]).items()}
        # A holder keeps its registration until its final release: not a waiter.
        queue = [owner for owner in map(text, reply[2]) if owner not in holders]
        if not holders and not queue:
            return None
        return LockView(self.family, None, ttl_of(reply[0]), holders, queue)

    def is_locked(self, view: LockView | None) -> bool:
        """Whether a master's view counts as this lock being held (for ``locked()``)."""
        return view is not None and bool(view.holders)


class _ReadWriteKind(LockKind):
    """One side of the read/write lock (see ``lua/rwlock.lua``): ``r`` (read), ``w``
    (write) or ``u`` (upgradeable read)."""

    family = "rw"
    stems = ("rw",)
    side = ""
    targeted = False
    hands_over = False

    def _keys(self, name: str) -> tuple[str, str, str]:
        return (
            keys.aux_key(name, "rw"),
            keys.aux_key(name, "rw:leases"),
            keys.aux_key(name, "rw:writers"),
        )

    def key(self, name: str) -> str:
        return keys.aux_key(name, "rw")

    def _channels(self, name: str) -> tuple[str, str, str]:
        """Where readers (and upgradeable readers), writers and an upgrade wait."""
        return (
            keys.aux_key(name, "rw:wake:r"),
            keys.aux_key(name, "rw:wake:w"),
            keys.aux_key(name, "rw:wake:u"),
        )

    def wake_channel(self, name: str, owner: str) -> str:
        readers, writers, _ = self._channels(name)
        return writers if self.side == "w" else readers

    def notify_channels(self, name: str) -> tuple[str, ...]:
        return self._channels(name)

    def acquire(
        self,
        name: str,
        owner: str,
        lease_ms: int,
        hold: str,
        wait_ms: int,
        polite_ms: int = 0,
        place_ms: int = 0,
    ) -> Call:
        # Never polite: a read/write lock takes no turns (it does not hand over). No
        # place either: its waiting writers are woken by broadcast, not in order.
        args = ("acquire", self.side, owner, lease_ms, hold, wait_ms)
        return Call(scripts.RWLOCK, self._keys(name), args, None, (4,))

    def release(
        self, name: str, owner: str, left: str, release_id: str, handover: str = "0"
    ) -> Call:
        return self._release(name, owner, left, release_id, "1")

    def undo(self, name: str, owner: str, left: str, release_id: str) -> Call:
        return self._release(name, owner, left, release_id, "0")

    def abandon(self, name: str, owner: str, release_id: str, tag: int) -> Call | None:
        return None  # readers keep no place as waiters

    def _release(self, name: str, owner: str, left: str, rid: str, stop_waiting: str) -> Call:
        readers, writers, upgrade = self._channels(name)
        args = ("release", self.side, owner, left, readers, writers, rid, stop_waiting, upgrade)
        return Call(scripts.RWLOCK, self._keys(name), args)

    def extend(self, name: str, owner: str, ms: int, add: bool, tag: int) -> Call:
        args = ("extend", self.side, owner, ms, "add" if add else "set", tag)
        return Call(scripts.RWLOCK, self._keys(name), args)

    def renew(self, entries: Sequence[Renewal], lease_ms: int) -> Call:
        return Call(
            scripts.RWLOCK,
            tuple(k for name, _, _ in entries for k in self._keys(name)),
            ("renew", lease_ms, *(x for _, o, hold in entries for x in (self.side, o, hold))),
        )

    def force_unlock(self, name: str, release_id: str) -> Call:
        readers, writers, upgrade = self._channels(name)
        args = ("force", readers, writers, release_id, upgrade)
        return Call(scripts.RWLOCK, self._keys(name), args)

    def probe(self, name: str) -> Call:
        return Call(scripts.RWLOCK, self._keys(name), ("probe",))

    def view(self, reply: object) -> LockView | None:
        if not isinstance(reply, list) or len(reply) < 3:
            raise ValueError(f"unexpected probe reply {reply!r}")
        fields = pairs(reply[1])
        waiting = [text(x) for x in reply[2]]
        holders = {
            f"{owner[2:]} ({_SIDES[owner[:2]]})": count_of(hold)
            for owner, hold in fields.items()
            if owner[:2] in _SIDES
        }
        if not holders and not waiting:
            return None
        mode = fields.get("mode") if holders else None
        return LockView(self.family, mode, ttl_of(reply[0]), holders, waiting)

    def is_locked(self, view: LockView | None) -> bool:
        wanted = "read" if self.side == "r" else "write"
        return view is not None and view.mode == wanted


#: how a view names each side of a hold (``inspect``: ``"<owner id> (read)"``)
_SIDES = {"r:": "read", "w:": "write", "u:": "upgradeable"}


class ReadKind(_ReadWriteKind):
    """The read side: shared with other readers, excluded by a writer."""

    label = "rw:read"
    side = "r"
    broadcast = True
    fenced = False  # readers share: a token orders exclusive holds only


class WriteKind(_ReadWriteKind):
    """The write side: exclusive; a waiting writer stops new readers."""

    label = "rw:write"
    side = "w"
    queued = True

    @property
    def upgrade_from(self) -> LockKind | None:
        return READ

    def fence_key(self, name: str) -> str:
        return keys.aux_key(name, "rw:fence")

    def holder_field(self, owner: str) -> str:
        return f"w:{owner}"

    def abandon(self, name: str, owner: str, release_id: str, tag: int) -> Call | None:
        # A waiting writer leaves no hold behind (a try that was granted is undone).
        readers = self._channels(name)[0]
        return Call(scripts.RWLOCK, self._keys(name), ("abandon", owner, readers, release_id))


class UpgradeableKind(_ReadWriteKind):
    """The upgradeable read side: shared with readers, excluded by a writer and by
    another upgradeable reader (one at a time, so two upgrades never wait for each
    other). Its holder may take the write side: that is its upgrade (:data:`UPGRADE`).
    The last release of this side also frees the owner's write hold (see
    ``lua/rwlock.lua``). A holder of the read side cannot take it (an upgrade in
    progress would wait for that reader, and the reader for the upgrade), nor can a
    writer (see ``Engine._side``)."""

    label = "rw:upgradeable"
    side = "u"
    broadcast = True  # it waits where readers wait, woken with them
    fenced = False  # it shares with readers: its upgrade's write hold gets the token

    @property
    def upgrade_from(self) -> LockKind | None:
        return READ

    def is_locked(self, view: LockView | None) -> bool:
        return view is not None and any(h.endswith(" (upgradeable)") for h in view.holders)


class UpgradeKind(WriteKind):
    """The write side as the holder of the upgradeable side takes it: its upgrade. The
    masters grant it once every hold but the owner's own has ended, and refuse new
    readers meanwhile (the owner waits as a writer). The same hold as the write side's
    (the same label, calls and fencing counter), waiting on a channel of its own, which
    the release that leaves only the owner's holds publishes on."""

    broadcast = True

    def wake_channel(self, name: str, owner: str) -> str:
        return self._channels(name)[2]


class FairKind(LockKind):
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

    def attempt(
        self,
        q: Quorum,
        name: str,
        owner: str,
        lease_ms: int,
        hold: str,
        wait_ms: int,
        polite_ms: int = 0,
        place_ms: int = 0,
        ticket: int = 0,
    ) -> Call:
        return self.acquire(name, owner, lease_ms, hold, wait_ms, ticket=ticket)

    def acquire(
        self,
        name: str,
        owner: str,
        lease_ms: int,
        hold: str,
        wait_ms: int,
        polite_ms: int = 0,
        place_ms: int = 0,
        ticket: int = 0,
    ) -> Call:
        # Never polite, and no proposed place: fairlock.lua keeps its own queue, each
        # place in it tagged with the ticket of the acquire that took it (see settle).
        queued = ticket if ticket and wait_ms > 0 and hold.startswith("1:") else ""
        args = ("acquire", owner, lease_ms, hold, wait_ms, queued)
        return Call(scripts.FAIRLOCK, self._keys(name), args, None, (3,))

    def release(
        self, name: str, owner: str, left: str, release_id: str, handover: str = "0"
    ) -> Call:
        return self._release(name, owner, left, release_id, "1")

    def undo(self, name: str, owner: str, left: str, release_id: str) -> Call:
        return self._release(name, owner, left, release_id, "0")

    def _release(self, name: str, owner: str, left: str, rid: str, leave_queue: str) -> Call:
        args = ("release", owner, left, self._prefix(name), rid, leave_queue)
        return Call(scripts.FAIRLOCK, self._keys(name), args)

    def abandon(self, name: str, owner: str, release_id: str, tag: int) -> Call | None:
        # Leaves the queue only: a try that was granted is undone, holding nothing.
        return Call(
            scripts.FAIRLOCK, self._keys(name), ("abandon", owner, self._prefix(name), release_id)
        )

    def settle(
        self, name: str, owner: str, replies: Sequence[Sequence[object]], release_id: str
    ) -> Call | None:
        # Masters whose queues disagree grant different heads, round after round. A
        # waiter caught in such a split yields to the head of the most masters (of the
        # smallest owner id among equals) unless that is itself: the order most masters
        # saw wins everywhere, and the next round reaches a quorum. A head is a place
        # in the queues: its owner and the ticket of the acquire that took it. The
        # yield moves the waiter behind that place only: by the time it runs, the head
        # may have been a holder that released and queued again, now a new arrival.
        heads: dict[tuple[str, str], int] = {}
        for per_master in replies:
            reply = per_master[0] if per_master else None
            if not isinstance(reply, list) or not reply:
                continue
            head = (owner, "")
            if int(reply[0]) != 1:
                if len(reply) < 3 or not reply[2]:
                    continue
                head = (text(reply[2]), text(reply[3]) if len(reply) >= 4 else "")
                if head[0] == owner:
                    head = (owner, "")
            heads[head] = heads.get(head, 0) + 1
        first, ticket = min(heads, key=lambda h: (-heads[h], h), default=(owner, ""))
        if first == owner:
            return None
        args = ("yield", owner, first, self._prefix(name), release_id, ticket)
        return Call(scripts.FAIRLOCK, self._keys(name), args)

    def renew(self, entries: Sequence[Renewal], lease_ms: int) -> Call:
        # The held lock is a plain owner -> hold hash: the plain renewal serves.
        return Call(
            scripts.RENEW,
            tuple(self.key(name) for name, _, _ in entries),
            (lease_ms, *(x for _, owner, hold in entries for x in (owner, hold))),
        )

    def force_unlock(self, name: str, release_id: str) -> Call:
        return Call(scripts.FAIRLOCK, self._keys(name), ("force", self._prefix(name), release_id))

    def probe(self, name: str) -> Call:
        return Call(scripts.FAIRLOCK, self._keys(name), ("probe",))

    def view(self, reply: object) -> LockView | None:
        if not isinstance(reply, list) or len(reply) < 3:
            raise ValueError(f"unexpected probe reply {reply!r}")
        holders = {owner: count_of(hold) for owner, hold in pairs(reply[1]).items()}
        # The holder keeps its place at the head until it releases: not a waiter.
        queue = [w for w in map(text, reply[2]) if w not in holders]
        if not holders and not queue:
            return None
        return LockView(self.family, None, ttl_of(reply[0]), holders, queue)


class ElectionKind(FairKind):
    """Leader election: a fair lock of keys of its own, always fenced (the term is the
    grant's fencing token), with a leader record beside it (``lua/fairlock.lua``): the
    leader's term, value and thread or task name, living as long as its hold; a
    change of it is published on the record's own name (:meth:`changes`)."""

    label = "election"
    family = "election"
    stems = ("election",)
    noun = "election"

    def _keys(self, name: str) -> tuple[str, ...]:
        return (*super()._keys(name), self.changes(name))

    def changes(self, name: str) -> str:
        """The channel a change of the leader record is published on."""
        return keys.aux_key(name, "election:leader")

    def proclaim(self, name: str, owner: str, term: int, part: str, tag: int) -> Call:
        """Where ``owner`` holds the lock (its hold of ``tag``), make its record
        (``term``, and ``part``, its own part: see :mod:`.election`) the leader record;
        replies 1 (written) or 0 (not held there)."""
        args = ("proclaim", owner, term, part, tag)
        return Call(scripts.FAIRLOCK, self._keys(name), args)

    def renew(self, entries: Sequence[Renewal], lease_ms: int) -> Call:
        # The lock and its leader record, renewed together.
        return Call(
            scripts.FAIRLOCK,
            tuple(k for name, _, _ in entries for k in (self.key(name), self.changes(name))),
            ("renew", lease_ms, *(x for _, owner, hold in entries for x in (owner, hold))),
        )


class SemaphoreKind(LockKind):
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

    def early(self, q: Quorum) -> Early | None:
        # Masters may grant different slots: a try reads them all.
        return None if self.slot is None else q.until_granted

    def attempt(
        self,
        q: Quorum,
        name: str,
        owner: str,
        lease_ms: int,
        hold: str,
        wait_ms: int,
        polite_ms: int = 0,
        place_ms: int = 0,
        ticket: int = 0,
    ) -> Call:
        if self.slot is not None:
            return self.acquire(name, owner, lease_ms, hold, wait_ms)
        order = list(range(1, self.permits + 1))  # positions in the keys, 1-based
        for i in range(len(order) - 1, 0, -1):  # Fisher-Yates, on the injected source
            j = min(i, int(q.uniform(0.0, i + 1)))
            order[i], order[j] = order[j], order[i]
        args: tuple[str | int, ...] = ("acquire", owner, lease_ms, hold, wait_ms, place_ms, *order)
        return Call(scripts.SEMAPHORE, self._all(name), args)

    def acquire(
        self,
        name: str,
        owner: str,
        lease_ms: int,
        hold: str,
        wait_ms: int,
        polite_ms: int = 0,
        place_ms: int = 0,
    ) -> Call:
        # This slot: a re-entry (see attempt for a first acquire).
        args = ("acquire", owner, lease_ms, hold, wait_ms, place_ms, 1)
        return Call(scripts.SEMAPHORE, self._own(name), args)

    def judge(
        self, q: Quorum, name: str, replies: Sequence[Sequence[object]]
    ) -> tuple[Tally, LockKind]:
        tally = tally_grants(q, self.key(name), replies)
        if self.slot is not None or not tally.granted:
            return tally, self
        # Granted: the slot most masters granted (replies {1, count, position}).
        votes: dict[int, list[int]] = {}
        for i in tally.granted:
            votes.setdefault(int(replies[i][0][2]) - 1, []).append(i)  # type: ignore[index]
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

    def release(
        self, name: str, owner: str, left: str, release_id: str, handover: str = "0"
    ) -> Call:
        return self._release(name, owner, left, release_id, "1")

    def undo(self, name: str, owner: str, left: str, release_id: str) -> Call:
        if self.slot is None:
            return self._drop(name, owner, None, tag_of(left))  # a first acquire's try
        return self._release(name, owner, left, release_id, "0")

    def _release(self, name: str, owner: str, left: str, rid: str, final: str) -> Call:
        channel = keys.aux_key(name, "sem:wake")
        args = ("release", owner, left, channel, rid, keys.HOME_PREFIX, final)
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
        if not isinstance(reply, list) or len(reply) < 2:
            raise ValueError(f"unexpected probe reply {reply!r}")
        holders: dict[str, int] = {}
        slots: dict[str, int] = {}
        ttls: list[float] = []
        for slot, owner, count, pttl in reply[0]:
            holders[text(owner)] = int(count)
            slots[text(owner)] = int(slot)
            if (ttl := ttl_of(pttl)) is not None:
                ttls.append(ttl)
        queue = [w for w in map(text, reply[1]) if w not in holders]
        if not holders and not queue:
            return None
        return LockView(self.family, None, max(ttls, default=None), holders, queue, slots)

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

    def __init__(self, names: tuple[str, ...]) -> None:
        #: the names, by cluster hash slot, then by name: the one order they are taken in
        self.names = names
        #: the name of its holds: the names, as one string
        self.label_of_names = json.dumps(list(names), ensure_ascii=False)

    def __repr__(self) -> str:
        return f"<MultiKind {list(self.names)!r}>"

    def _all(self) -> tuple[str, ...]:
        # Each name's plain lock keys, as acquire.lua and release.lua have them.
        return tuple(
            k
            for n in self.names
            for k in (keys.lock_key(n), keys.waiters_key(n), keys.reserved_key(n))
        )

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

    def acquire(
        self,
        name: str,
        owner: str,
        lease_ms: int,
        hold: str,
        wait_ms: int,
        polite_ms: int = 0,
        place_ms: int = 0,
    ) -> Call:
        return self._call(("acquire", owner, lease_ms, hold, wait_ms), _all_granted, (3,))

    def judge(
        self, q: Quorum, name: str, replies: Sequence[Sequence[object]]
    ) -> tuple[Tally, LockKind]:
        tally, held = super().judge(q, name, replies)
        # A cluster member that granted part of the names (see route): not a grant,
        # and, like a master not read, undone if the try fails. After a grant, what it
        # holds is kept, as a master not read keeps its grant: the release frees it.
        partial = [i for i in tally.refused if _partial(replies[i][0])]
        if partial:
            tally.refused = [i for i in tally.refused if i not in partial]
            tally.unread += partial
        return tally, held

    def release(
        self, name: str, owner: str, left: str, release_id: str, handover: str = "0"
    ) -> Call:
        args = ("release", owner, left, release_id, keys.HOME_PREFIX, "1")
        return self._call(args, _least_status)

    def undo(self, name: str, owner: str, left: str, release_id: str) -> Call:
        args = ("release", owner, left, release_id, keys.HOME_PREFIX, "0")
        return self._call(args, _least_status)

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

    def force_unlock(self, name: str, release_id: str) -> Call:
        raise TypeError("a multi-lock is unlocked name by name")

    def probe(self, name: str) -> Call:
        raise TypeError("a multi-lock is read name by name")


#: how a call's parts (each with its groups' indices) merge into its reply
Merge = Callable[[list[tuple[list[int], object]]], object]


def _all_granted(parts: list[tuple[list[int], object]]) -> object:
    """An acquire's parts: granted if every part granted, else refused, marked partial
    (``[0, ms, [1], time]``) when some part granted (see :meth:`MultiKind.judge`)."""
    replies = [r for _, r in parts]
    granted = [isinstance(r, list) and r[:1] == [1] for r in replies]
    if all(granted):
        return replies[0]
    waits = [int(r[1]) for r in replies if isinstance(r, list) and r[:1] == [0]]
    times = [r[-1] for r in replies if isinstance(r, list) and len(r) >= 4]
    return [0, max(waits, default=-2), [1] if any(granted) else [], *times[:1]]


def _partial(reply: object) -> bool:
    return isinstance(reply, list) and len(reply) >= 3 and reply[0] == 0 and bool(reply[2])


def _least_status(parts: list[tuple[list[int], object]]) -> object:
    """A release's parts: the least status (a part that held nothing makes the whole
    lost), and the first waiter woken."""
    replies = [r for _, r in parts if isinstance(r, list) and r]
    status = min(int(r[0]) for r in replies)
    woken = next((r[1] for r in replies if len(r) > 1 and r[1]), "")
    return [status, woken, []]


def _least_ttl(parts: list[tuple[list[int], object]]) -> object:
    """An extension's parts: the least time left (0 where a part held nothing)."""
    return min(int(r) if isinstance(r, int) else 0 for _, r in parts)


def _renewed(hold_of: list[int], parts: list[tuple[list[int], object]]) -> object:
    """A renewal's parts: a hold is renewed where every part that has its names
    renewed them (``hold_of``: the hold of each name in the call), taken again where
    one part took it again and none failed it; the first part's time last."""
    flags: dict[int, int] = {}
    times: list[object] = []
    for groups, reply in parts:
        seen = list(dict.fromkeys(hold_of[g] for g in groups))
        replied = reply if isinstance(reply, list) else []
        times += replied[len(seen) :][:1]
        for hold, flag in zip(seen, replied, strict=False):
            old, new = flags.get(hold, 1), int(flag)
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


EXCLUSIVE = LockKind()
READ = ReadKind()
WRITE = WriteKind()
UPGRADEABLE = UpgradeableKind()
UPGRADE = UpgradeKind()
FAIR = FairKind()
ELECTION = ElectionKind()

#: one kind per family: what ``inspect`` and ``force_unlock`` of a name go through
FAMILIES: tuple[LockKind, ...] = (EXCLUSIVE, READ, FAIR, SEMAPHORES, ELECTION)


def name_and_family(key: str) -> tuple[str, str] | None:
    """The name and the family of the lock a key on a master belongs to; None for a key
    that is not ours, or for a fencing counter (which outlives its lock on purpose)."""
    try:
        name = keys.name_of(key)
    except ValueError:
        return None
    if any(key == kind.fence_key(name) for kind in (EXCLUSIVE, READ, WRITE, FAIR, ELECTION)):
        return None
    stem = key[len(keys.tag(name)) :].removeprefix(":").split(":")[0]
    return next(((name, k.family) for k in FAMILIES if stem in k.stems), None)
