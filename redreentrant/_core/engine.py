"""What every lock of one manager shares, and the bookkeeping of holds (no I/O).

An :class:`Engine` holds one manager's settings, quorum, table of holds and owner
identity, and makes the steps (generators of effects) of every lock operation:
re-entry, ownership, loss, leases. The sync and asyncio lock objects only drive these
steps with their flavour's driver; the owner is passed in explicitly, so the steps never
depend on which thread or task happens to run them.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from types import CodeType, FrameType
from typing import Any, TypeVar

from .cluster import ClusterMember
from .durability import per_master
from .effects import Pause, Steps
from .errors import (
    FencingError,
    LockLostError,
    LockNotOwnedError,
    ManagerClosedError,
    QuorumUnavailableError,
)
from .fencing import FENCE_TTL_MS, check_token, floor_of
from .handoff import Ticket
from .holds import Guard, Hold, Holds, Signal
from .keys import home_channel
from .kinds import UPGRADEABLE, WRITE, FamilyKind, LockKind, MultiKind, SemaphoreKind
from .listeners import LockInfo, tell
from .masters import connect, master_name
from .owner import new_manager_id
from .quorum import Clock, Quorum, Tally, Uniform, lease_ms
from .replies import integer_of
from .rounds import (
    Acquire,
    Grant,
    acquire_steps,
    extend_steps,
    force_unlock_steps,
    held_by_quorum,
    next_tag,
    probe_steps,
    release_steps,
    wake_steps,
)
from .settings import Settings, check_acquire_args, check_lease
from .turns import RESERVE_MS, Due, Turns
from .views import MasterView

#: how often (seconds) a final release looks again whether the renewal of its hold that
#: was under way ended (see :meth:`Engine.release`)
RENEWAL_POLL = 0.001

S = TypeVar("S", bound=Signal)

log = logging.getLogger(__name__)

#: how many owners' ids an engine keeps made (then it starts afresh)
OWNER_ID_CACHE_SIZE = 1024

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def entry_caller() -> FrameType:
    """The frame that called the public entry calling this (for :func:`call_site`):
    one frame object made, where walking back with ``f_back`` makes one per step."""
    return sys._getframe(2)  # noqa: SLF001  # the one call that makes no other frame


class CallSite:
    """Where a first acquire was called: ``str()`` gives ``file:line in function``.

    Only the code object and the instruction's offset are kept: working out the line
    number walks the code's line table, which is left to the rare report that names
    it."""

    __slots__ = ("code", "offset")

    def __init__(self, code: CodeType, offset: int) -> None:
        self.code = code
        self.offset = offset

    def __str__(self) -> str:
        code = self.code
        line = next((n for start, end, n in code.co_lines() if start <= self.offset < end), None)
        return f"{code.co_filename}:{'?' if line is None else line} in {code.co_name}"

    __repr__ = __str__


def call_site(frame: FrameType | None = None) -> CallSite | str:
    """Where the caller outside this package is (see :class:`CallSite`; ``"?"`` if
    none): named in the warning when a hold's owner dies. The search starts at
    ``frame`` (a public entry passes its own caller's, see :func:`entry_caller`), else
    at this function's caller. No traceback is built."""
    if frame is None:
        here = inspect.currentframe()
        frame = here.f_back if here is not None else None
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    if frame is None:
        return "?"
    return CallSite(frame.f_code, frame.f_lasti)


def _check_fenced(kind: LockKind, name: str) -> None:
    """:class:`ValueError` unless ``kind`` has a fencing counter."""
    if not kind.fenced:
        raise ValueError(
            f"lock {name!r} has no fencing counter: its holders share it (the read side"
            " of a read/write lock, a semaphore)"
        )


class Engine:
    """One manager's shared state and the steps of its lock operations.

    The flavour injects what the core may not do itself: ``token()`` names the calling
    owner (a thread or a task), ``guard()`` makes the lock of the holds table, and
    ``clock``/``uniform`` are the time and randomness the rounds use (``wall``, the
    wall clock waiters tell their place in).
    """

    def __init__(
        self,
        settings: Settings,
        masters: Sequence[str],
        token: Callable[[], str],
        guard: Callable[[], Guard],
        clock: Clock,
        uniform: Uniform,
        wall: Clock = time.time,
    ) -> None:
        self.settings = settings
        durabilities = per_master(settings.durability, len(masters))
        # Within the round: a server ends a WAIT up to a tick (100 ms) after its time-out.
        wait_ms = max(1, int(settings.master_timeout * 500))
        self.quorum = Quorum(
            tuple(masters), settings.drift_factor, settings.retry_jitter, clock, uniform, wall,
            tuple(None if d is None else d.call(wait_ms) for d in durabilities)
            if any(durabilities) else (),
            durabilities,
        )  # fmt: skip
        self.clock = clock
        self._token = token
        self._guard = guard
        self.id = new_manager_id()
        #: owner ids by owner token (see :meth:`owner_id`)
        self._owner_ids: dict[str, str] = {}
        self.holds = Holds(guard())
        self.closed = False
        #: the members that are Redis Clusters (their renewals are split per hash slot)
        self.clusters: frozenset[int] = frozenset()
        #: called with each watchdog-managed hold taken (the flavour's watchdog starts,
        #: and its deadline clock looks again if the hold is due before its next look)
        self.on_managed_hold: Callable[[Hold], None] = lambda hold: None
        #: this manager's turns on contended locks (see :mod:`.turns`)
        self.turns = Turns(clock, guard())
        #: called with when a deferred wake-up is due (the flavour's timer then sends
        #: :meth:`send_wakes` of :meth:`Turns.due`)
        self.on_deferred_wake: Callable[[float], None] = lambda due: None
        #: the longest a hold of this manager may stand on a master (its longest lease,
        #: fixed leases and extensions included): how long a master whose clock was seen
        #: to jump is counted out
        self.longest_lease = settings.lease
        watch = self.quorum.watch
        watch.quarantine = lambda: self.longest_lease
        watch.on_step = self._clock_stepped
        #: a master whose memory is younger does not vote (see :mod:`.clockwatch`)
        quarantine = settings.quarantine
        watch.memory_ms = (settings.lease if quarantine is None else quarantine) * 1000.0
        watch.on_forgot = self._forgot
        # A promoted replica has every grant its replicas acknowledged: it votes at once.
        watch.trusts_failover = [d is not None and not d.aof for d in durabilities]

    @classmethod
    def connect(
        cls,
        masters: object,
        settings: Settings,
        client_type: type | tuple[type, ...],
        url_client: Callable[[str, float], Any],
        token: Callable[[], str],
        guard: Callable[[], Guard],
        cluster_types: tuple[type, ...] = (),
    ) -> tuple[Engine, list[Any], list[Any]]:
        """A manager's engine over ``masters`` (URLs, ``client_type`` clients, or
        ``cluster_types`` clients and cluster URLs for cluster members; URL clients are
        made by ``url_client(url, master_timeout)``), on the real clock and random
        source. Returns (the engine, all members, the clients made here)."""
        timeout = settings.master_timeout
        clients, own = connect(
            masters, client_type, lambda url: url_client(url, timeout), cluster_types
        )
        names = [master_name(c) for c in clients]
        engine = cls(settings, names, token, guard, time.monotonic, random.uniform)
        engine.clusters = frozenset(
            i for i, c in enumerate(clients) if isinstance(c, ClusterMember)
        )
        for i in engine.clusters:
            if engine.quorum.durabilities[i] is not None:
                raise ValueError(
                    f"durability is not supported on a Redis Cluster member"
                    f" ({names[i]}): give it None (one setting per master)"
                )
        return engine, clients, own

    @property
    def home_channel(self) -> str:
        """The channel this manager's pub/sub connections always hear: registered
        waiters of its owners are woken there (see :func:`.keys.home_channel`)."""
        return home_channel(self.id)

    def owner_id(self) -> str:
        """The calling owner's id under this manager."""
        token = self._token()
        owner = self._owner_ids.get(token)  # owner_of's lookup, without its call
        return owner if owner is not None else self.owner_of(token)

    def owner_of(self, token: str) -> str:
        """The id under this manager of the owner of ``token``."""
        owner = self._owner_ids.get(token)
        if owner is None:
            # Made once per owner rather than per call: the same string object then
            # also keeps its hash for the lookups it is used in.
            if len(self._owner_ids) >= OWNER_ID_CACHE_SIZE:
                self._owner_ids.clear()  # one call, safe while other threads look up
            owner = self._owner_ids[token] = f"{self.id}:{token}"
        return owner

    def is_closed(self) -> bool:
        return self.closed

    def _clock_stepped(self, master: int, seconds: float) -> None:
        """Master ``master``'s clock was seen to jump: it is counted out for a lease
        (see :mod:`.clockwatch`); say so."""
        name = self.quorum.masters[master]
        out = self.longest_lease
        log.warning(
            "redreentrant: the clock of %s moved %+.3fs beyond the drift allowance: its"
            " votes do not count for %.3fs",
            name, seconds, out,
        )  # fmt: skip
        listener = self.settings.listener
        if listener is not None:
            tell(partial(listener.clock_stepped, name, seconds, out))

    def _may_stand(self, seconds: float) -> None:
        """A hold of this manager may stand ``seconds`` on a master: masters are
        counted out as long (see :mod:`.clockwatch`)."""
        self.longest_lease = seconds
        if self.settings.quarantine is None:
            self.quorum.watch.memory_ms = seconds * 1000.0

    def _forgot(self, master: int, seconds: float, failover: bool) -> None:
        """Master ``master``'s memory began lately: it is counted out for ``seconds``
        (see :mod:`.clockwatch`); say so."""
        log.warning(
            "redreentrant: the memory of %s began lately (%s): its votes do not count"
            " for %.3fs (quarantine)",
            self.quorum.masters[master],
            "a replica promoted" if failover
            else "first use, a restart without its data, a flush or an eviction",
            seconds,
        )  # fmt: skip

    def check_open(self) -> None:
        if self.closed:
            raise ManagerClosedError("the lock manager is closed")

    def after_fork_in_child(self) -> None:
        """The child is a new owner: it never renews nor releases the parent's holds."""
        self.id = new_manager_id()
        self._owner_ids = {}
        self.holds = Holds(self._guard())
        self.turns = Turns(self.clock, self._guard())

    # -- local state (no I/O) -----------------------------------------------------------

    def hold(self, kind: LockKind, name: str) -> Hold | None:
        """The calling thread's or task's hold on ``name``, if any."""
        return self.holds.get(kind, name, self.owner_id())

    def remaining(self, hold: Hold | None) -> float:
        """Seconds of validity left on ``hold`` (0.0 if none or lost)."""
        if hold is None or hold.lost is not None:
            return 0.0
        return max(0.0, hold.valid_until - self.clock())

    # -- the steps of each operation ---------------------------------------------------

    def acquire(
        self,
        kind: LockKind,
        name: str,
        owner: str,
        blocking: bool,
        timeout: float,
        lease: float | None,
        fencing: bool = False,
        max_hold: float | None = None,
        signal: Signal | None = None,
        caller: FrameType | None = None,
    ) -> Steps[bool]:
        """Take or re-enter ``name`` for ``owner`` (see ``Lock.acquire``); a first hold
        with ``fencing`` gets a fencing token (see :mod:`.fencing`), and ``signal`` (if
        given) is told when it is lost. ``caller`` is the frame that called the public
        entry (see :func:`call_site`)."""
        if type(timeout) is not int or timeout != -1:  # the default needs no check
            check_acquire_args(blocking, timeout)
        q = self.quorum
        settings = self.settings
        lease_s = settings.lease if lease is None else settings.acquire_lease(lease)
        if lease_s > self.longest_lease:
            self._may_stand(lease_s)
        hold = self.holds.get(kind, name, owner)
        if hold is not None:
            if max_hold is not None:
                raise ValueError(
                    f"lock {name!r} is held already: a re-entry keeps the first hold's"
                    " max_hold (re-enter without it)"
                )
            return (yield from self._reenter(hold, lease, lease_s))
        cap = (
            settings.max_hold
            if lease is None and max_hold is None  # the usual acquire, checked cheaply
            else settings.hold_cap(lease, max_hold)
        )
        if kind.looks_around or self.holds.in_multi:
            kind = kind.first_hold(self.holds, name, owner)
        site = call_site(caller)
        deadline = None if timeout == -1 or not blocking else self.clock() + timeout
        # After its turn on several masters, an owner lets the waiter woken go first.
        polite = self.turns.polite(kind, name, owner) if q.size > 1 else 0
        listener = settings.listener
        contended: Callable[[Tally], None] | None = None
        if listener is not None:
            info = LockInfo(name, kind.label, owner)
            started = self.clock()
            tell(partial(listener.acquire_started, info))

            def contended(t: Tally) -> None:
                counts = (len(t.granted), len(t.refused), len(t.failed))
                tell(partial(listener.contended, info, *counts))

        steps = acquire_steps(
            Acquire(q, kind, name, owner, 1, lease_s, blocking, deadline, fencing, polite),
            self.is_closed,
            contended,
        )
        try:
            grant = yield from steps
            if grant is not None and self.closed:
                yield from self._closed_meanwhile(grant.kind or kind, name, owner, grant.tag)
            got = self._granted(kind, name, owner, lease, lease_s, grant, cap, signal, site)
        except BaseException as error:
            if listener is not None:
                if isinstance(error, QuorumUnavailableError):
                    tell(partial(listener.quorum_unavailable, error.action, error.errors))
                tell(partial(listener.acquire_failed, info, self.clock() - started, error))
            raise
        if listener is not None:
            wait = self.clock() - started
            if grant is None:
                tell(partial(listener.acquire_failed, info, wait, None))
            else:
                token = grant.token if isinstance(grant.token, int) else None  # not per name
                tell(partial(listener.acquired, info, wait, grant.votes, q.size, token))
        return got

    def _granted(
        self,
        kind: LockKind,
        name: str,
        owner: str,
        lease: float | None,
        lease_s: float,
        grant: Grant | None,
        cap: float | None,
        signal: Signal | None,
        site: CallSite | str,
        count: int = 1,
    ) -> bool:
        """Record a first hold's grant (False: none), or a hold taken over with its
        ``count``. Not a step of its own (no generator per acquire): the rare undo comes
        first, see :meth:`_closed_meanwhile`."""
        if grant is None:
            return False
        kind = grant.kind or kind  # a semaphore's: the slot it won
        now = self.clock()
        hold = Hold(
            kind,
            name,
            owner,
            count,
            lease_s,
            lease is None,
            grant.valid_until,
            site=site,
            fencing_token=grant.token,
            acquired_at=now,
            renew_until=None if cap is None else now + cap,
            signal=signal,
            tag=grant.tag,
        )
        self.holds.add(hold)
        if hold.managed:
            self.on_managed_hold(hold)
        if kind.hands_over:
            self.turns.granted(kind, name)
        return True

    def _closed_meanwhile(self, kind: LockKind, name: str, owner: str, tag: int) -> Steps[None]:
        """A first hold granted while the manager was closing: nothing would renew or
        report it, so it is released, and the acquire fails."""
        with contextlib.suppress(Exception):
            yield from release_steps(self.quorum, kind, name, owner, 0, tag)
        raise ManagerClosedError("the lock manager was closed during the acquire")

    def lose(self, hold: Hold, why: str) -> None:
        """Mark ``hold`` lost, found so by an owner's own call (a re-entry, release or
        extension), and tell the listener (the watchdog's finds go through the
        manager's report)."""
        if hold.lose(why):
            self.told_lost(hold)

    def told_lost(self, hold: Hold) -> None:
        """Tell the listener, if any, that ``hold`` was lost."""
        listener = self.settings.listener
        if listener is not None:
            info = LockInfo(hold.name, hold.kind.label, hold.owner)
            tell(partial(listener.lost, info, hold.lost or "?"))

    def _reenter(self, hold: Hold, lease: float | None, lease_s: float) -> Steps[bool]:
        if hold.lost is not None:
            raise LockLostError(f"lock {hold.name!r} was lost: {hold.lost}")
        if hold.managed and lease is not None:
            # The watchdog renews this hold with the manager's lease every lease/3: a
            # shorter TTL set now would expire between its ticks.
            raise ValueError(
                f"lock {hold.name!r} is held with a watchdog-managed lease: a re-entry"
                " cannot set lease= (re-enter without it, or take the first hold"
                " with a fixed lease)"
            )
        renewed = hold.lease if lease is None else lease_s
        count = hold.count + 1
        q = self.quorum
        steps = acquire_steps(
            Acquire(q, hold.kind, hold.name, hold.owner, count, renewed, True, None, tag=hold.tag)
        )
        try:
            grant = yield from steps
        except LockLostError as error:
            self.lose(hold, str(error))
            raise
        assert grant is not None  # a re-entry succeeds or raises
        hold.count = count
        hold.lease = renewed
        hold.valid_until = grant.valid_until
        return True

    def token(self, kind: LockKind, name: str, owner: str) -> int:
        """The fencing token of ``owner``'s hold on ``name`` (see ``Lock.token``)."""
        token = self._tokens(kind, name, owner)
        if isinstance(token, tuple):
            raise FencingError(f"lock {name!r} holds several names: it has a token per name")
        return token

    def tokens(self, kind: MultiKind, name: str, owner: str) -> dict[str, int]:
        """The fencing token of each name of ``owner``'s multi-lock hold."""
        tokens = self._tokens(kind, name, owner)
        assert isinstance(tokens, tuple)
        return dict(zip(kind.names, tokens, strict=True))

    def _tokens(self, kind: LockKind, name: str, owner: str) -> int | tuple[int, ...]:
        hold = self.holds.get(kind, name, owner)
        if hold is None:
            raise LockNotOwnedError(f"lock {name!r} is not held by this owner: it has no token")
        if hold.fencing_token is None:
            why = (
                "its holders share it (the read side of a read/write lock, a semaphore)"
                if not kind.fenced
                else "it was acquired without fencing (pass fencing=True to the manager"
                " or to the lock)"
            )
            raise FencingError(f"lock {name!r} has no fencing token: {why}")
        return hold.fencing_token

    def fence_floor(self, kind: LockKind, name: str) -> Steps[int]:
        """What ``name``'s fencing counters (each of a multi-lock's names') must be
        raised to for its next tokens to be larger than every token handed out (see
        ``Lock.fence_floor``)."""
        _check_fenced(kind, name)
        q = self.quorum
        floors = []
        for family, n in kind.families(name):
            replies = yield q.everywhere(family.fence_read(n))
            floors.append(floor_of(q, n, replies))
        return max(floors)

    def raise_fence(self, kind: LockKind, name: str, at_least: int) -> Steps[int]:
        """Raise ``name``'s fencing counters (each of a multi-lock's names') to at least
        ``at_least`` on every master (see ``Lock.raise_fence``); returns how many masters
        acknowledged (the fewest for a name)."""
        _check_fenced(kind, name)
        check_token(at_least, "raise_fence(at_least=...)")
        q = self.quorum
        acked = q.size
        for family, n in kind.families(name):
            replies = yield q.everywhere(family.fence_raise(n, at_least, FENCE_TTL_MS))
            failed = {
                i: r[0] if isinstance(r[0], BaseException) else RuntimeError(f"odd reply {r[0]!r}")
                for i, r in enumerate(replies)
                if integer_of(r[0]) is None
            }
            if len(failed) > q.tolerated:
                raise q.unavailable(f"raise the fencing counter of {n!r}", failed)
            acked = min(acked, q.size - len(failed))
        return acked

    def held(self, kind: LockKind, name: str, owner: str) -> Hold:
        """``owner``'s hold on ``name``, or :class:`LockNotOwnedError`."""
        hold = self.holds.get(kind, name, owner)
        if hold is None:
            raise LockNotOwnedError(f"lock {name!r} is not held by this owner")
        return hold

    def signal_of(self, hold: Hold, make: Callable[[Hold], S]) -> S:
        """The hold's signal, made by ``make`` the first time it is asked for (so a hold
        whose work never asks costs nothing), and told at once if the hold is lost."""
        signal = hold.signal
        if signal is None:
            signal = make(hold)
            hold.signal = signal
            if hold.lost is not None:  # lost before anyone asked: tell it now
                signal.notify_lost()
        return signal  # type: ignore[return-value]  # made by this flavour's ``make``

    def valid_until(self, hold: Hold | None) -> float:
        """The end of ``hold``'s validity on the monotonic clock (0.0 if none or lost)."""
        if hold is None or hold.lost is not None:
            return 0.0
        return hold.valid_until

    def ensure_held(self, kind: LockKind, name: str, owner: str) -> None:
        """Raise :class:`LockLostError` if ``owner``'s hold was lost or its validity
        ran out (see ``Lock.ensure_held``)."""
        hold = self.held(kind, name, owner)
        if hold.lost is not None:
            raise LockLostError(f"lock {name!r} was lost: {hold.lost}")
        if hold.valid_until <= self.clock():
            why = "its fixed lease ran out" if not hold.managed else "its validity ran out"
            raise LockLostError(f"lock {name!r} may be held by another owner now: {why}")

    def extend(
        self, kind: LockKind, name: str, owner: str, seconds: float, replace: bool
    ) -> Steps[None]:
        """Extend ``owner``'s fixed lease on ``name`` (see ``Lock.extend``)."""
        hold = self.held(kind, name, owner)
        kind = hold.kind  # a semaphore's: the slot it holds
        if hold.managed:
            raise ValueError(
                f"lock {name!r} has a watchdog-managed lease, which the watchdog renews:"
                " extend() is for holds taken with a fixed lease= (acquire(lease=...))"
            )
        seconds_s = (
            self.settings.acquire_lease(seconds) if replace else check_lease("seconds", seconds)
        )
        if hold.lost is not None:
            raise LockLostError(f"lock {name!r} was lost: {hold.lost}")
        if hold.valid_until <= self.clock():
            raise LockLostError(
                f"lock {name!r} may be held by another owner now: its fixed lease ran out"
            )
        ms = lease_ms(seconds_s)
        # How long the hold may stand on the masters now (what it had left, with the
        # drift allowance, and more): a master whose clock jumps is counted out as long.
        left = hold.valid_until - self.clock() + self.quorum.drift(hold.lease)
        standing = seconds_s if replace else left + seconds_s
        if standing > self.longest_lease:
            self.settings.check_quarantine("the extended hold's lease", standing)
            self._may_stand(standing)
        steps = extend_steps(self.quorum, kind, name, owner, ms, not replace, hold.tag)
        try:
            valid_until = yield from steps
        except LockLostError as error:
            self.lose(hold, str(error))
            raise
        if hold.lost is None:  # a fixed lease: the watchdog never touches it
            hold.valid_until = valid_until
            if replace:
                hold.lease = seconds_s

    def hand_off(self, kind: LockKind, name: str, owner: str) -> Steps[str]:
        """Take ``owner``'s hold on ``name`` off this manager and return its ticket (see
        ``Lock.hand_off``)."""
        hold = self.held(kind, name, owner)
        if not hold.kind.hands_off:
            raise ValueError(f"a {hold.kind.noun} hold cannot be handed off: {name!r}")
        self.ensure_held(kind, name, owner)
        self.holds.remove(hold)  # off the watchdog
        # A renewal under way may take the hold again where the lock is free after the
        # new owner released it (as for a release): the ticket goes out once it ended.
        while hold.renewing:
            yield Pause(RENEWAL_POLL)
        token = hold.fencing_token
        assert not isinstance(token, tuple)  # a multi-lock's: not handed off
        return Ticket(name, hold.kind.label, owner, hold.tag, hold.count, token).encode()

    def take_over(
        self,
        kind: LockKind,
        name: str,
        owner: str,
        ticket: str,
        lease: float | None,
        signal: Signal | None = None,
        caller: FrameType | None = None,
    ) -> Steps[bool]:
        """Move the hold ``ticket`` names to ``owner`` (see ``Lock.take_over``); True."""
        t = Ticket.decode(ticket)
        if (t.name, t.kind) != (name, kind.label):
            raise ValueError(
                f"the ticket is for {t.kind} {t.name!r}, not for {kind.label} {name!r}"
            )
        if not kind.hands_off:
            raise ValueError(f"a {kind.noun} hold cannot be handed off: {name!r}")
        if self.holds.get(kind, name, owner) is not None:
            raise ValueError(f"lock {name!r} is held by this owner already")
        settings = self.settings
        lease_s = settings.lease if lease is None else settings.acquire_lease(lease)
        if lease_s > self.longest_lease:
            self._may_stand(lease_s)
        cap = settings.hold_cap(lease, None)
        tag = next_tag()
        to = (owner, f"{t.count}:{tag}")
        q = self.quorum
        steps = extend_steps(q, kind, name, t.owner, lease_ms(lease_s), False, t.tag, to)
        try:
            valid_until = yield from steps
        except BaseException as error:
            # Where it moved, the hold is this owner's now: released again.
            with contextlib.suppress(Exception):
                yield from release_steps(q, kind, name, owner, 0, tag, lease_s)
            if isinstance(error, LockLostError):
                raise LockLostError(
                    f"lock {name!r}: the hold handed off is gone (its lease ended, or it"
                    " was taken over or released already)"
                ) from None
            raise
        if self.closed:
            yield from self._closed_meanwhile(kind, name, owner, tag)
        grant = Grant(valid_until, t.token, tag=tag)
        site = call_site(caller)
        return self._granted(kind, name, owner, lease, lease_s, grant, cap, signal, site, t.count)

    def release(self, kind: LockKind, name: str, owner: str, quiet_if_lost: bool) -> Steps[None]:
        """Release one of ``owner``'s hold levels on ``name``."""
        hold = self.holds.get(kind, name, owner)
        if hold is None:
            raise LockNotOwnedError(f"lock {name!r} is not held by this owner")
        kind = hold.kind  # a semaphore's: the slot it holds
        hold.count -= 1
        ends = 0  # the tag of the upgrade that a final release ends too
        if hold.count == 0:
            # Off the watchdog before the release runs, so it is never renewed after.
            self.holds.remove(hold)
            # The last release of an upgradeable read frees its upgrade (rwlock.lua).
            also = kind.ends_too
            upgraded = self.holds.get(also, name, owner) if also is not None else None
            if upgraded is not None:
                self.holds.remove(upgraded)
                ends = upgraded.tag
            # A renewal of it under way may reach a master after this release (on
            # another connection) and take the hold again there until its lease ends:
            # the release goes out once that renewal ended.
            while hold.renewing or (upgraded is not None and upgraded.renewing):
                yield Pause(RENEWAL_POLL)
        if hold.lost is not None:
            if hold.count == 0:
                # Already reported as lost: remove what is left where it still is; what
                # cannot be removed now expires with its lease.
                with contextlib.suppress(Exception):
                    yield from release_steps(
                        self.quorum, kind, name, owner, 0, hold.tag, hold.lease, ends=ends
                    )
            if quiet_if_lost:
                return
            raise LockLostError(f"lock {name!r} was lost: {hold.lost}")
        # A final release of a contended lock ends this manager's turn, or defers its
        # wake-up while the turn is young (see .turns).
        turns = hold.count == 0 and kind.hands_over
        several = self.quorum.size > 1
        defer = turns and not self.closed and self.turns.may_defer(kind, name)
        steps = release_steps(
            self.quorum, kind, name, owner, hold.count, hold.tag, hold.lease, defer,
            RESERVE_MS if turns and not several else 0, ends,
        )  # fmt: skip
        try:
            freed = yield from steps
        except LockLostError as error:
            self.lose(hold, str(error))
            raise
        except QuorumUnavailableError as error:
            if defer:
                # The master may have deferred the wake-up: send it in any case (it
                # does nothing where the lock is held or nobody waits).
                self._deferred_wake(kind, name, owner if several else None)
            listener = self.settings.listener
            if listener is not None:
                tell(partial(listener.quorum_unavailable, error.action, error.errors))
            raise
        if turns and freed.deferred:
            # On several masters, once the wake-up is sent, the releasing owner lets the
            # waiter woken go first (as below).
            self._deferred_wake(kind, name, owner if several else None)
        elif turns:
            # On several masters nothing reserves the lock for the waiter woken (they
            # could reserve it for different ones): the releasing owner lets it go first.
            courteous = owner if several and freed.woke else None
            self.turns.released(kind, name, False, courteous)
        if hold.count == 0 and self.settings.listener is not None:
            info = LockInfo(name, kind.label, owner)
            held = self.clock() - hold.acquired_at
            tell(partial(self.settings.listener.released, info, held))

    def upgrade(
        self,
        name: str,
        owner: str,
        timeout: float,
        fencing: bool,
        caller: FrameType | None,
        signal: Signal | None = None,
    ) -> Steps[bool]:
        """Take the write side of the read/write lock ``name`` for ``owner``, the holder
        of its upgradeable side (see ``UpgradeableReadLock.upgrade``): the upgrade
        waits until no other hold is left; a new write hold gets that hold's kind of
        lease, and an upgrade while upgraded re-enters the write hold."""
        hold = self.held(UPGRADEABLE, name, owner)
        if hold.lost is not None:
            raise LockLostError(f"lock {name!r} was lost: {hold.lost}")
        fixed = not hold.managed and self.holds.get(WRITE, name, owner) is None
        steps = self.acquire(
            WRITE, name, owner, True, timeout, hold.lease if fixed else None, fencing,
            signal=signal, caller=caller,
        )  # fmt: skip
        return (yield from steps)

    def downgrade(self, name: str, owner: str) -> Steps[None]:
        """Release one level of the write hold of ``owner``, the holder of the
        upgradeable side of ``name`` (see ``UpgradeableReadLock.downgrade``)."""
        self.held(UPGRADEABLE, name, owner)
        if self.holds.get(WRITE, name, owner) is None:
            raise LockNotOwnedError(f"lock {name!r} is not upgraded by this owner")
        yield from self.release(WRITE, name, owner, False)

    def _deferred_wake(self, kind: LockKind, name: str, courteous: str | None) -> None:
        due = self.turns.released(kind, name, True, courteous)
        if due is not None:
            self.on_deferred_wake(due)

    def send_wakes(self, due: Sequence[Due]) -> Steps[None]:
        """Send deferred wake-ups (see :mod:`.turns`); a master that fails to take one
        leaves its waiters to their own time-outs, as for a holder that died."""
        for kind, name in due:
            with contextlib.suppress(Exception):
                reserve = RESERVE_MS if self.quorum.size == 1 else 0
                yield from wake_steps(self.quorum, kind, name, reserve, self.id)

    def locked(self, kind: LockKind, name: str) -> Steps[bool]:
        """Whether anyone holds ``name`` (any of a multi-lock's names) on a quorum
        (read-only)."""
        for family, n in kind.families(name):
            views = yield from probe_steps(self.quorum, (family,), n)
            if held_by_quorum(self.quorum, family, views):
                return True
        return False

    def force_unlock(self, kind: LockKind, name: str) -> Steps[bool]:
        """Free ``name``'s lock of ``kind`` (each of a multi-lock's names) whoever holds
        it (see :meth:`force_unlock_families`)."""
        deleted = False
        for family, n in kind.families(name):
            deleted = (yield from self.force_unlock_families((family,), n)) or deleted
        return deleted

    def force_unlock_families(self, kinds: Sequence[FamilyKind], name: str) -> Steps[bool]:
        return force_unlock_steps(self.quorum, kinds, name, self.id)

    def probe(self, kinds: Sequence[FamilyKind], name: str) -> Steps[list[MasterView]]:
        return probe_steps(self.quorum, kinds, name, memories=True)

    def quarantined(self) -> Steps[list[float]]:
        """Seconds before each master's votes count (see :mod:`.clockwatch`)."""
        views = yield from probe_steps(self.quorum, (), "", memories=True)
        return [v.quarantined for v in views]

    def permits_free(self, kind: SemaphoreKind, name: str) -> Steps[int]:
        """How many of a semaphore's permits are free on a quorum (read-only)."""
        views = yield from probe_steps(self.quorum, (kind,), name)
        return kind.available(self.quorum, views)

    def permit_holders(self, kind: SemaphoreKind, name: str) -> Steps[list[str]]:
        """The owner ids holding a permit of a semaphore on a quorum (read-only)."""
        views = yield from probe_steps(self.quorum, (kind,), name)
        return kind.holders(self.quorum, views)
