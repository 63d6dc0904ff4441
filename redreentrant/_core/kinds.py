"""Lock kinds: what makes one kind of lock differ from another.

A kind supplies the script calls for its operations, the channels its waiters listen
on, and how to read its probe reply. The rounds themselves (fan-out, validity, undo,
retry, wake-ups, renewal) are the same for every kind and live in
:mod:`redreentrant._core.rounds`. Kinds are stateless singletons.

Keys: each kind has keys of its own under the lock's hash tag, so ``lock("x")``,
``rw_lock("x")`` and ``fair_lock("x")`` are three independent locks.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import keys, scripts
from .effects import Call
from .views import LockView, pairs, text, ttl_of


class LockKind:
    """An exclusive, reentrant lock: a hash ``owner -> hold count`` under one key.

    Its waiters register on the masters (a zset under the name's hash tag), and a
    release wakes one of them by name on its manager's home channel (see
    ``lua/release.lua``): nothing is subscribed per lock.
    """

    #: tells holds of different kinds apart (manager registry, renewal batches)
    label = "lock"
    #: the lock family shown by ``inspect``
    family = "lock"
    #: wake every waiter on a release (readers), rather than one at a time
    broadcast = False
    #: waiters hold a place in Redis that they must refresh while they wait
    queued = False
    #: refused waiters register on the masters, which wake one of them by name on its
    #: manager's home channel; the wake channel is then not subscribed
    targeted = True

    #: grants of this kind may carry a fencing token (``lua/fence.lua``)
    fenced = True

    #: a final release may hand the lock over to the waiter it wakes (see
    #: :func:`~redreentrant._core.rounds.release_steps`)
    hands_over = True

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

    def acquire(
        self,
        name: str,
        owner: str,
        lease_ms: int,
        count: int,
        wait_ms: int,
        polite_ms: int = 0,
        place_ms: int = 0,
    ) -> Call:
        """Take (count 1) or re-enter (count > 1); replies ``{1, n}`` or ``{0, ms}``.

        A refused take registers the owner as a waiter for ``wait_ms`` (0: not at all),
        until ``place_ms`` if given (the end the owner proposes, in ms since the epoch,
        the same on every master: see ``lua/acquire.lua``). A ``polite_ms`` take (see
        :mod:`.turns`) is refused, although the lock is free, while another owner is
        registered, and told what is left of that registration, at most ``polite_ms``."""
        args: tuple[str | int, ...] = (owner, lease_ms, count, wait_ms)
        if place_ms:
            args = (*args, polite_ms, place_ms)
        elif polite_ms:
            args = (*args, polite_ms)
        return Call(scripts.ACQUIRE, self._keys(name), args)

    def release(
        self, name: str, owner: str, count_left: int, release_id: str, handover_ms: int = 0
    ) -> Call:
        """Set the owner's count to ``count_left`` (0 frees); replies ``{1, ''}``,
        ``{0, woken, ms, 0}`` or ``{-1, ''}``, where ``woken`` is the waiter the masters
        woke and ``ms`` the lease it was handed the lock with (0: only woken).

        ``release_id`` is the payload of the wake-up sent when the lock is freed;
        ``handover_ms`` > 0 hands the lock over to the waiter woken, with that lease."""
        return self._release_call(name, owner, count_left, release_id, "1", handover_ms)

    def release_in_turn(
        self, name: str, owner: str, release_id: str, handover_ms: int, defer: bool, reserve_ms: int
    ) -> Call:
        """A final release by a manager taking turns (see :mod:`.turns`; only for a
        kind that :attr:`hands_over`): as :meth:`release`, and ``defer`` wakes (or hands
        the lock to) nobody, replying ``{0, '', 0, 1}`` when there was a waiter to wake,
        while ``reserve_ms`` > 0 reserves the lock that long for the waiter woken."""
        extra = ("1" if defer else "0", reserve_ms)
        return self._release_call(name, owner, 0, release_id, "1", handover_ms, extra)

    def wake(self, name: str, release_id: str, reserve_ms: int) -> Call:
        """A deferred wake-up: where the lock is free, wake the next waiter, reserving
        the lock for it ``reserve_ms``; replies ``{0, woken}``."""
        args = ("wake", keys.wake_channel(name), release_id, keys.HOME_PREFIX, reserve_ms)
        return Call(scripts.RELEASE, self._keys(name), args)

    def undo(self, name: str, owner: str, count_left: int, release_id: str) -> Call:
        """Take back a try that failed to reach a quorum, keeping any place the owner
        holds as a waiter (it is still waiting)."""
        return self._release_call(name, owner, count_left, release_id, "0")

    def _release_call(
        self,
        name: str,
        owner: str,
        left: int,
        rid: str,
        leave: str,
        handover_ms: int = 0,
        extra: tuple[str | int, ...] = (),
    ) -> Call:
        channel = keys.wake_channel(name)
        args = ("release", owner, left, channel, rid, keys.HOME_PREFIX, leave, handover_ms)
        return Call(scripts.RELEASE, self._keys(name), args + extra)

    def abandon(self, name: str, owner: str, release_id: str) -> Call | None:
        """Remove a waiter's place when its acquire gives up (and, where the lock is
        free, hand a wake-up it may have had on to the next waiter); None if the kind
        keeps no place for waiters."""
        args = ("abandon", owner, keys.wake_channel(name), release_id, keys.HOME_PREFIX)
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

    def extend(self, name: str, owner: str, ms: int, add: bool) -> Call:
        """Extend ``owner``'s hold where it still holds it: by ``ms`` (``add``) or to
        ``ms`` from now; replies the hold's milliseconds left, 0 where it holds nothing."""
        args = (owner, ms, "add" if add else "set")
        return Call(scripts.EXTEND, (self.key(name),), args)

    def renew(self, entries: Sequence[tuple[str, str]], lease_ms: int) -> Call:
        """Renew many ``(name, owner)`` holds of this kind in one call."""
        return Call(
            scripts.RENEW,
            tuple(keys.lock_key(name) for name, _ in entries),
            (lease_ms, *(owner for _, owner in entries)),
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
        holders = {owner: int(count) for owner, count in pairs(reply[1]).items()}
        # A holder keeps its registration until its final release: not a waiter.
        queue = [owner for owner in map(text, reply[2]) if owner not in holders]
        if not holders and not queue:
            return None
        return LockView(self.family, None, ttl_of(reply[0]), holders, queue)

    def is_locked(self, view: LockView | None) -> bool:
        """Whether a master's view counts as this lock being held (for ``locked()``)."""
        return view is not None and bool(view.holders)


class _ReadWriteKind(LockKind):
    """One side of the read/write lock (see ``lua/rwlock.lua``)."""

    family = "rw"
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

    def _channels(self, name: str) -> tuple[str, str]:
        return keys.aux_key(name, "rw:wake:r"), keys.aux_key(name, "rw:wake:w")

    def wake_channel(self, name: str, owner: str) -> str:
        readers, writers = self._channels(name)
        return readers if self.side == "r" else writers

    def notify_channels(self, name: str) -> tuple[str, ...]:
        return self._channels(name)

    def acquire(
        self,
        name: str,
        owner: str,
        lease_ms: int,
        count: int,
        wait_ms: int,
        polite_ms: int = 0,
        place_ms: int = 0,
    ) -> Call:
        # Never polite: a read/write lock takes no turns (it does not hand over). No
        # place either: its waiting writers are woken by broadcast, not in order.
        return Call(
            scripts.RWLOCK,
            self._keys(name),
            ("acquire", self.side, owner, lease_ms, count, wait_ms),
        )

    def release(
        self, name: str, owner: str, count_left: int, release_id: str, handover_ms: int = 0
    ) -> Call:
        return self._release(name, owner, count_left, release_id, "1")

    def undo(self, name: str, owner: str, count_left: int, release_id: str) -> Call:
        return self._release(name, owner, count_left, release_id, "0")

    def abandon(self, name: str, owner: str, release_id: str) -> Call | None:
        return None  # readers keep no place as waiters

    def _release(self, name: str, owner: str, left: int, rid: str, stop_waiting: str) -> Call:
        channels = self._channels(name)
        args = ("release", self.side, owner, left, *channels, rid, stop_waiting)
        return Call(scripts.RWLOCK, self._keys(name), args)

    def extend(self, name: str, owner: str, ms: int, add: bool) -> Call:
        args = ("extend", self.side, owner, ms, "add" if add else "set")
        return Call(scripts.RWLOCK, self._keys(name), args)

    def renew(self, entries: Sequence[tuple[str, str]], lease_ms: int) -> Call:
        return Call(
            scripts.RWLOCK,
            tuple(k for name, _ in entries for k in self._keys(name)),
            ("renew", lease_ms, *(x for _, owner in entries for x in (self.side, owner))),
        )

    def force_unlock(self, name: str, release_id: str) -> Call:
        return Call(scripts.RWLOCK, self._keys(name), ("force", *self._channels(name), release_id))

    def probe(self, name: str) -> Call:
        return Call(scripts.RWLOCK, self._keys(name), ("probe",))

    def view(self, reply: object) -> LockView | None:
        if not isinstance(reply, list) or len(reply) < 3:
            raise ValueError(f"unexpected probe reply {reply!r}")
        fields = pairs(reply[1])
        waiting = [text(x) for x in reply[2]]
        holders = {
            f"{owner[2:]} ({'read' if owner[0] == 'r' else 'write'})": int(count)
            for owner, count in fields.items()
            if owner[:2] in ("r:", "w:")
        }
        if not holders and not waiting:
            return None
        mode = fields.get("mode") if holders else None
        return LockView(self.family, mode, ttl_of(reply[0]), holders, waiting)

    def is_locked(self, view: LockView | None) -> bool:
        wanted = "read" if self.side == "r" else "write"
        return view is not None and view.mode == wanted


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

    def abandon(self, name: str, owner: str, release_id: str) -> Call | None:
        readers, _ = self._channels(name)
        return Call(scripts.RWLOCK, self._keys(name), ("abandon", owner, readers, release_id))


class FairKind(LockKind):
    """The fair lock: granted in order of arrival (see ``lua/fairlock.lua``)."""

    label = "fair"
    family = "fair"
    queued = True
    targeted = False
    hands_over = False

    def _keys(self, name: str) -> tuple[str, str, str]:
        return (
            keys.aux_key(name, "fair"),
            keys.aux_key(name, "fair:queue"),
            keys.aux_key(name, "fair:deadlines"),
        )

    def _prefix(self, name: str) -> str:
        return keys.aux_key(name, "fair:wake:")

    def key(self, name: str) -> str:
        return keys.aux_key(name, "fair")

    def fence_key(self, name: str) -> str:
        return keys.aux_key(name, "fair:fence")

    def wake_channel(self, name: str, owner: str) -> str:
        return self._prefix(name) + owner

    def notify_channels(self, name: str) -> tuple[str, ...]:
        return ()  # the next owner is chosen in Redis and woken through its own channel

    def acquire(
        self,
        name: str,
        owner: str,
        lease_ms: int,
        count: int,
        wait_ms: int,
        polite_ms: int = 0,
        place_ms: int = 0,
    ) -> Call:
        # Never polite, and no proposed place: fairlock.lua keeps its own queue.
        return Call(
            scripts.FAIRLOCK, self._keys(name), ("acquire", owner, lease_ms, count, wait_ms)
        )

    def release(
        self, name: str, owner: str, count_left: int, release_id: str, handover_ms: int = 0
    ) -> Call:
        return self._release(name, owner, count_left, release_id, "1")

    def undo(self, name: str, owner: str, count_left: int, release_id: str) -> Call:
        return self._release(name, owner, count_left, release_id, "0")

    def _release(self, name: str, owner: str, left: int, rid: str, leave_queue: str) -> Call:
        args = ("release", owner, left, self._prefix(name), rid, leave_queue)
        return Call(scripts.FAIRLOCK, self._keys(name), args)

    def abandon(self, name: str, owner: str, release_id: str) -> Call | None:
        return Call(
            scripts.FAIRLOCK, self._keys(name), ("abandon", owner, self._prefix(name), release_id)
        )

    def settle(
        self, name: str, owner: str, replies: Sequence[Sequence[object]], release_id: str
    ) -> Call | None:
        # Masters whose queues disagree grant different heads, round after round. Every
        # waiter caught in such a split yields to the smallest other head it was refused
        # for, so one order wins on every master and the next round reaches a quorum.
        heads = {
            text(reply[2])
            for per_master in replies
            for reply in per_master[:1]
            if isinstance(reply, list) and len(reply) >= 3 and int(reply[0]) == 0
        }
        heads -= {"", owner}
        if not heads or min(heads) > owner:
            return None
        args = ("yield", owner, min(heads), self._prefix(name), release_id)
        return Call(scripts.FAIRLOCK, self._keys(name), args)

    def renew(self, entries: Sequence[tuple[str, str]], lease_ms: int) -> Call:
        # The held lock is a plain owner -> count hash: the plain renewal serves.
        return Call(
            scripts.RENEW,
            tuple(self.key(name) for name, _ in entries),
            (lease_ms, *(owner for _, owner in entries)),
        )

    def force_unlock(self, name: str, release_id: str) -> Call:
        return Call(scripts.FAIRLOCK, self._keys(name), ("force", self._prefix(name), release_id))

    def probe(self, name: str) -> Call:
        return Call(scripts.FAIRLOCK, self._keys(name), ("probe",))

    def view(self, reply: object) -> LockView | None:
        if not isinstance(reply, list) or len(reply) < 3:
            raise ValueError(f"unexpected probe reply {reply!r}")
        holders = {owner: int(count) for owner, count in pairs(reply[1]).items()}
        # The holder keeps its place at the head until it releases: not a waiter.
        queue = [w for w in map(text, reply[2]) if w not in holders]
        if not holders and not queue:
            return None
        return LockView(self.family, None, ttl_of(reply[0]), holders, queue)


EXCLUSIVE = LockKind()
READ = ReadKind()
WRITE = WriteKind()
FAIR = FairKind()

#: one kind per family: what ``inspect`` and ``force_unlock`` of a name go through
FAMILIES: tuple[LockKind, ...] = (EXCLUSIVE, READ, FAIR)


def lock_name_of(key: str) -> str | None:
    """The name of the lock a key on a master belongs to; None for a key that is not
    ours, or for a fencing counter (which outlives its lock on purpose)."""
    try:
        name = keys.name_of(key)
    except ValueError:
        return None
    if any(key == kind.fence_key(name) for kind in (EXCLUSIVE, READ, WRITE, FAIR)):
        return None
    return name
