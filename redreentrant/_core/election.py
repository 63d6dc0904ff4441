"""Leader election (no I/O): the leader record, and who leads as a quorum sees it.

Leadership is a hold of an :class:`~.kinds.ElectionKind` lock: a fair lock (candidates
are served in arrival order), always fenced, whose fencing token is the term. Beside
the lock each master keeps the leader record (``lua/fairlock.lua``): one field, the
leader's owner id, whose value is ``"<term>\\n<seq>\\n<value as hex>\\n<thread
or task name>"`` (seq: the leader's proclaims in its term); it lives as long as the
leader's hold there, and each change of it is published on the record's own name,
which observers subscribe to.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import FrameType
from typing import TYPE_CHECKING

from .effects import Messages, Reply, Steps, Wait
from .errors import LockLostError
from .holds import Signal
from .kinds import ElectionKind
from .owner import OWNERS, OwnerInfo, parse_owner
from .quorum import Quorum
from .replies import probe

if TYPE_CHECKING:
    from .engine import Engine


@dataclass(frozen=True)
class LeaderView:
    """Who leads an election, as a quorum of the masters saw it at one read."""

    owner: str
    """The leader's owner id."""
    info: OwnerInfo | None
    """What the owner id tells (host, pid, thread or task), with the thread's or task's
    name; None for an id of another format."""
    value: bytes
    """The value the leader proclaimed."""
    term: int
    """The term of this leadership: larger than every earlier leader's."""
    validity: float
    """Seconds left of the leader's lease on a quorum of masters, at the read."""

    def same(self, other: LeaderView | None) -> bool:
        """Whether ``other`` is this leadership with this value (validity aside)."""
        return other is not None and (other.owner, other.term, other.value) == (
            self.owner,
            self.term,
            self.value,
        )


def check_value(value: object) -> bytes:
    """A candidate's value as bytes (a str is encoded as UTF-8)."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"an election's value is bytes or str, not {type(value).__name__}")


def own_part(value: bytes, name: str) -> str:
    """The leader's own part of its record: its value and its thread's or task's name
    (the masters put the term and the proclaim's number before it)."""
    return f"{value.hex()}\n{name}"


#: the order of the leader records an observer saw: (term, number of the proclaim in
#: that term); the end of a term is after every proclaim of it
Key = tuple[int, float]
ENDED = float("inf")


def parse_record(owner: str, record: str, pttl: int) -> tuple[LeaderView, Key] | None:
    """A leader record (``"<term>\\n<seq>\\n<value hex>\\n<name>"``) as a view and
    its key; None if malformed."""
    parts = record.split("\n", 3)
    if len(parts) != 4 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    term, seq = int(parts[0]), int(parts[1])
    info = parse_owner(owner)
    if info is not None:
        info = OwnerInfo(info.host, info.pid, info.manager, info.token, parts[3])
    view = LeaderView(owner, info, bytes.fromhex(parts[2]), term, max(0, pttl) / 1000.0)
    return view, (term, seq)


def read_leader(
    q: Quorum, replies: Sequence[Sequence[Reply]]
) -> tuple[LeaderView | None, Key | None]:
    """The leader in the replies to a probe round of an election (one call per
    master: ``{pttl, holders, queue, record}``): an owner that holds the lock with its
    record on a quorum (the newest of those records), and its key; (None, None) when
    nobody does. Raises :class:`QuorumUnavailableError` when too many masters failed."""
    failed: dict[int, BaseException] = {}
    seen: dict[str, list[tuple[Key, LeaderView]]] = {}
    for i, per_master in enumerate(replies):
        reply = per_master[0]
        try:
            seen_here = probe(reply)
        except ValueError as error:
            failed[i] = reply if isinstance(reply, BaseException) else error
            continue
        for owner, record in seen_here.leader.items():
            parsed = parse_record(owner, record, seen_here.pttl)
            if owner in seen_here.fields and parsed is not None:
                seen.setdefault(owner, []).append((parsed[1], parsed[0]))
    if len(failed) > q.tolerated:
        raise q.unavailable("read the leader", failed)
    for records in seen.values():
        if len(records) >= q.needed:
            # The validity a quorum gives: the needed-th longest.
            validity = sorted((v.validity for _, v in records), reverse=True)[q.needed - 1]
            key, view = max(records, key=lambda r: r[0])
            return replace(view, validity=validity), key
    return None, None


# -- the steps (the flavours' Election objects drive them) --------------------------------


def leader(q: Quorum, kind: ElectionKind, name: str) -> Steps[LeaderView | None]:
    """Who leads ``name`` as a quorum sees it (one read-only round)."""
    return read_leader(q, (yield q.everywhere(kind.probe(name))))[0]


def proclaim(
    engine: Engine, kind: ElectionKind, name: str, owner: str, value: bytes
) -> Steps[None]:
    """Make ``value`` the leader record's value of ``owner``, the leader (one round):
    written on a quorum, or :class:`LockLostError` (the hold is gone from more masters
    than a quorum can spare: lost) or :class:`QuorumUnavailableError` (written on too
    few to tell: masters failed or answered late; leadership is kept)."""
    hold = engine.held(kind, name, owner)
    if hold.lost is not None:
        raise LockLostError(f"election {name!r}: leadership was lost: {hold.lost}")
    term = engine.token(kind, name, owner)
    part = own_part(value, OWNERS.name(hold.token) or hold.token)
    q = engine.quorum
    replies = yield q.everywhere(kind.proclaim(name, owner, term, part, hold.tag))
    written = sum(1 for (r,) in replies if r == 1)
    if written >= q.needed:
        return
    failed = {i: r for i, (r,) in enumerate(replies) if isinstance(r, BaseException)}
    if sum(1 for (r,) in replies if r == 0) <= q.tolerated:  # written on too few to tell
        raise q.unavailable(f"proclaim the leader of {name!r}", failed)
    why = "the leader's hold is gone from a quorum of masters"
    engine.lose(hold, why)
    raise LockLostError(f"election {name!r}: leadership was lost: {why}")


def campaign(
    engine: Engine,
    kind: ElectionKind,
    name: str,
    owner: str,
    value: bytes,
    blocking: bool,
    timeout: float,
    signal: Signal | None,
    caller: FrameType | None,
) -> Steps[bool]:
    """Wait (``timeout``: seconds, -1 for no limit; not at all unless ``blocking``)
    until ``owner`` leads ``name``, then proclaim ``value``: True; False when the time
    passed first (nothing held). The leader already: proclaims ``value`` only."""
    if engine.holds.get(kind, name, owner) is None:
        steps = engine.acquire(
            kind, name, owner, blocking, timeout, None, True, signal=signal, caller=caller
        )
        if not (yield from steps):
            return False
        try:
            yield from proclaim(engine, kind, name, owner, value)
        except BaseException:
            with contextlib.suppress(Exception):  # held nowhere after
                yield from engine.release(kind, name, owner, True)
            raise
        return True
    yield from proclaim(engine, kind, name, owner, value)
    return True


class Observation:
    """One observer of an election (``Election.observe``): the changes it reported,
    and the steps to the next one.

    The flavour watches :attr:`channel` for :attr:`observer` as a log channel (every
    message kept) before the first :meth:`next`, and stops when done. A change is a
    message that a quorum of masters published (the record written, or ended): taken
    in order, each newer than the last reported (by term, then proclaim), so changes
    are never reported backwards and none is missed while the masters' messages come.
    A leader that dies publishes nothing: the record is read again when the validity
    it was last seen with runs out (and once a lease while nobody leads)."""

    def __init__(self, engine: Engine, kind: ElectionKind, name: str, observer: str) -> None:
        self._engine = engine
        self._kind = kind
        self._name = name
        self.channel = kind.changes(name)
        self.observer = observer
        #: the watch's generation (the flavour sets it when it watches)
        self.generation = 0
        self._started = False
        self._last: LeaderView | None = None
        self._key: Key = (0, 0)
        self._until = 0.0  # when the last leader's validity ends, as last seen
        self._votes: dict[tuple[str, Key], set[int]] = {}
        self._ready: list[LeaderView | None] = []

    def next(self) -> Steps[LeaderView | None]:
        """The leader at first (None: nobody), then each change."""
        engine = self._engine
        clock = engine.clock
        if not self._started:
            self._started = True
            yield from self._read()
            self._ready.clear()  # the first read is the answer, reported once
            return self._last
        while not self._ready:
            engine.check_open()  # a closed manager wakes its observers, which stop
            for i, data in (yield Messages(self.channel, self.observer)):
                self._count(i, data)
            if self._ready:
                break
            left = self._until - clock() if self._last is not None else engine.settings.lease
            generation = yield Wait(self.channel, self.observer, self.generation, max(0.0, left))
            if generation == self.generation:  # no message: the time passed
                yield from self._read()
            self.generation = generation
        return self._ready.pop(0)

    def _read(self) -> Steps[None]:
        view, key = read_leader(
            self._engine.quorum,
            (yield self._engine.quorum.everywhere(self._kind.probe(self._name))),
        )
        if view is not None and key is not None:
            self._until = self._engine.clock() + view.validity
            if key > self._key:
                self._report(view, key)
        elif self._last is not None:
            self._report(None, (self._key[0], ENDED))

    def _count(self, i: int, data: str) -> None:
        owner, _, rest = data.partition("\n")
        pttl, _, record = rest.partition("\n")
        parsed = parse_record(owner, record, int(pttl) if pttl.lstrip("-").isdigit() else 0)
        if parsed is None:
            return
        view, key = parsed
        ended = pttl == "-1"
        if ended:
            key = (key[0], ENDED)
        if key <= self._key:
            return
        votes = self._votes.setdefault((owner, key), set())
        votes.add(i)
        if len(votes) >= self._engine.quorum.needed:
            if not ended:
                self._until = self._engine.clock() + view.validity
            self._report(None if ended else view, key)

    def _report(self, view: LeaderView | None, key: Key) -> None:
        self._last = view
        self._key = key
        self._ready.append(view)
        self._votes = {k: v for k, v in self._votes.items() if k[1] > key}
