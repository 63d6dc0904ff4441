"""Leader election (no I/O): the leader record, and who leads as a quorum sees it.

Leadership is a hold of an :class:`~.kinds.ElectionKind` lock: a fair lock (candidates
are served in arrival order), always fenced, whose fencing token is the term. Beside
the lock each master keeps the leader record (``lua/fairlock.lua``): one field, the
leader's owner id, whose value is ``"<term>\\n<value as hex>\\n<thread or task
name>"``; it lives as long as the leader's hold there, and each change of it is
published on the record's own name, which observers subscribe to.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

from .effects import Reply, Steps, Wait, Watch
from .errors import LockLostError
from .holds import Signal
from .kinds import ElectionKind
from .owner import OWNERS, OwnerInfo, parse_owner
from .quorum import Quorum
from .rounds import release_id
from .views import pairs, text

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


def record_of(term: int, value: bytes, name: str) -> str:
    """The leader record's value: the term, the value and the owner's name."""
    return f"{term}\n{value.hex()}\n{name}"


def leader_of(q: Quorum, replies: Sequence[Sequence[Reply]]) -> LeaderView | None:
    """The leader in the replies to a probe round of an election (one call per
    master: ``{pttl, holders, queue, record}``): an owner that holds the lock with its
    record on a quorum, with the largest term among those records; None when nobody
    does. Raises :class:`QuorumUnavailableError` when too many masters failed."""
    failed: dict[int, BaseException] = {}
    seen: dict[str, list[tuple[int, int, bytes, str]]] = {}
    for i, per_master in enumerate(replies):
        reply = per_master[0]
        if isinstance(reply, BaseException):
            failed[i] = reply
            continue
        if not isinstance(reply, list) or len(reply) < 4:
            failed[i] = ValueError(f"unexpected reply {reply!r}")
            continue
        holders = pairs(reply[1])
        for owner, record in pairs(reply[3]).items():
            parts = record.split("\n", 2)
            if owner in holders and len(parts) == 3 and parts[0].isdigit():
                pttl = int(text(reply[0]))
                value = bytes.fromhex(parts[1])
                seen.setdefault(owner, []).append((pttl, int(parts[0]), value, parts[2]))
    if len(failed) > q.tolerated:
        raise q.unavailable("read the leader", failed)
    for owner, records in seen.items():
        if len(records) >= q.needed:
            pttl = sorted((r[0] for r in records), reverse=True)[q.needed - 1]
            _, term, value, name = max(records, key=lambda r: r[1])
            info = parse_owner(owner)
            if info is not None:
                info = OwnerInfo(info.host, info.pid, info.manager, info.token, name)
            return LeaderView(owner, info, value, term, max(0, pttl) / 1000.0)
    return None


# -- the steps (the flavours' Election objects drive them) --------------------------------


def leader(q: Quorum, kind: ElectionKind, name: str) -> Steps[LeaderView | None]:
    """Who leads ``name`` as a quorum sees it (one read-only round)."""
    return leader_of(q, (yield q.everywhere(kind.probe(name))))


def proclaim(
    engine: Engine, kind: ElectionKind, name: str, owner: str, value: bytes
) -> Steps[None]:
    """Make ``value`` the leader record's value of ``owner``, the leader (one round):
    written on a quorum, or :class:`LockLostError` (the hold is gone from a quorum:
    lost) or :class:`QuorumUnavailableError` (too many masters failed)."""
    hold = engine.held(kind, name, owner)
    if hold.lost is not None:
        raise LockLostError(f"election {name!r}: leadership was lost: {hold.lost}")
    term = engine.token(kind, name, owner)
    record = record_of(term, value, OWNERS.name(hold.token) or hold.token)
    q = engine.quorum
    replies = yield q.everywhere(kind.proclaim(name, owner, record, release_id(owner)))
    written = sum(1 for (r,) in replies if r == 1)
    if written >= q.needed:
        return
    failed = {i: r for i, (r,) in enumerate(replies) if isinstance(r, BaseException)}
    if len(failed) > q.tolerated:
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


def next_leader(
    engine: Engine,
    kind: ElectionKind,
    name: str,
    observer: str,
    last: LeaderView | None,
    first: bool = False,
) -> Steps[LeaderView | None]:
    """The leader of ``name`` (``first``: at once), or else once it is not ``last``
    (another leader, another value, or nobody). Woken by the masters' messages on the
    record's channel; a leader that dies publishes nothing, so the record is read again
    when the validity it was seen with runs out (and once a lease while nobody
    leads)."""
    q = engine.quorum
    channel = kind.changes(name)
    generation = yield Watch(channel, observer, broadcast=True)
    while True:
        now = yield from leader(q, kind, name)
        if first or (now is None) != (last is None) or (now is not None and not now.same(last)):
            return now
        wait = now.validity if now is not None else engine.settings.lease
        generation = yield Wait(channel, observer, generation, wait)
