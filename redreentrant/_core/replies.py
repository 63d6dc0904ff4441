"""Each script's reply, decoded here into named fields (no I/O).

A reply is what its script's header in ``lua/`` says: a Redis array or an integer. The
rest of the core reads replies only through this module. A decoder takes what a
master answered (the reply, the exception it raised, or UNREAD) and returns named
fields, or None when the answer is not such a reply (an error, an odd reply, one not
read); a probe's decoder raises :class:`ValueError` instead, for ``inspect`` to show.
A try's and a release's replies are decoded for every master of every round: each
decoder is one call, and makes its tuple in C (:data:`.effects.made`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from .effects import made


def text(value: object) -> str:
    """A reply item as text (clients may or may not decode responses)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def pairs(flat: object) -> dict[str, str]:
    """A flat ``[field, value, ...]`` reply as a dict."""
    items = [text(x) for x in flat] if isinstance(flat, list) else []
    return dict(zip(items[::2], items[1::2], strict=False))


def ttl_of(pttl: object) -> float | None:
    """A PTTL in seconds; None for a key without one, or absent."""
    ms = int(pttl) if isinstance(pttl, (int, str, bytes)) else -2
    return ms / 1000.0 if ms >= 0 else None


# -- a try: every script's ``acquire`` ------------------------------------------------------


class Attempt(NamedTuple):
    """A try's reply: ``{1, count, ..., stamp}`` granted, ``{0, ms, ..., stamp}``
    refused, the stamp ``{time, age, failover}`` (``{time}`` or a bare time where the
    master keeps no memory record: a cluster node). What comes between is the kind's
    (:func:`head`, :func:`position`, :func:`partial`)."""

    granted: bool
    #: granted: the hold's count; refused: ms until a retry may succeed (-2: a
    #: re-entry whose hold is gone, or a try a later one overtook)
    value: int
    #: the server's time in ms (None in a cluster member's merged reply without one)
    time: int | None
    #: ms since the master's memory began (its memory record, see ``lua/acquire.lua``);
    #: None where the script cannot keep one (a cluster node)
    age: int | None
    #: the memory began with a failover (this server was promoted from a replica)
    failover: bool


def attempt(reply: object) -> Attempt | None:
    if isinstance(reply, list) and len(reply) >= 2:
        stamp = reply[-1]
        if type(stamp) is list:
            if len(stamp) == 3:
                time, age, failover = stamp
                return made(Attempt, (reply[0] == 1, reply[1], time, age, failover == 1))
            stamp = stamp[0] if stamp else None
        time = stamp if type(stamp) is int else None  # a stamp without a record
        return made(Attempt, (reply[0] == 1, reply[1], time, None, False))
    return None


class Memory(NamedTuple):
    """A master's memory record, as ``lua/memory.lua`` reads it."""

    #: ms since the master's memory began; -1: no record yet (the next try makes it);
    #: None: the master keeps none (a Redis Cluster node)
    age: int | None
    #: the memory began with a failover (a replica promoted)
    failover: bool


def memory(reply: object) -> Memory | None:
    if isinstance(reply, list) and reply:
        return Memory(int(reply[1]), reply[2] == 1) if len(reply) >= 3 else Memory(None, False)
    return None


def first_granted(replies: Sequence[object]) -> bool:
    """A master's first reply (its try's) granted: the vote of a round that ends once
    a quorum granted."""
    reply = replies[0]
    return isinstance(reply, list) and len(reply) >= 2 and reply[0] == 1


def head(reply: object) -> tuple[str, str] | None:
    """A fair lock's refusal ``{0, ms, head, ticket, time}``: the queue's head there
    and the ticket of its place; None for a grant, or a queue without a head."""
    if isinstance(reply, list) and len(reply) >= 3 and reply[0] != 1 and reply[2]:
        return text(reply[2]), text(reply[3]) if len(reply) >= 4 else ""
    return None


def position(reply: object) -> int:
    """A semaphore's grant ``{1, count, position, time}``: the slot granted, from 0."""
    return int(reply[2]) - 1  # type: ignore[index]


def partial(reply: object) -> bool:
    """A multi-lock's refusal ``{0, ms, {1}, time}``: a cluster member granted some of
    the names (see :mod:`.kinds.multi`)."""
    return isinstance(reply, list) and len(reply) >= 3 and reply[0] == 0 and bool(reply[2])


# -- a release, and what else answers with its status ------------------------------------


class Release(NamedTuple):
    """A release's reply (an undo's, an abandon's, a wake's, a force's): a status
    alone, or ``{status, woken, ms, deferred}`` (the fields after the status may be
    absent)."""

    #: 1 still held (a force: a lock was deleted), 0 the hold is gone, -1 the owner
    #: held nothing there
    status: int
    #: the waiter the master woke ('' none)
    woken: str
    #: the lease (ms) the woken waiter was handed the lock with (0 none)
    handover_ms: int
    #: the master deferred the wake-up (see :mod:`.turns`)
    deferred: bool


def release(reply: object) -> Release | None:
    if type(reply) is int:
        return made(Release, (reply, "", 0, False))
    if isinstance(reply, list) and reply and type(reply[0]) is int:
        n = len(reply)
        woken = text(reply[1]) if n > 1 and reply[1] else ""
        ms = reply[2] if n > 2 and type(reply[2]) is int else 0
        return made(Release, (reply[0], woken, ms, n > 3 and reply[3] == 1))
    return None


def first_held(replies: Sequence[object]) -> bool:
    """A master's first reply (its release's) confirmed the owner's hold there (status
    0 or 1): the vote of a round that ends once a quorum confirmed."""
    reply = replies[0]
    status = reply[0] if isinstance(reply, list) and reply else reply
    return type(status) is int and status >= 0


# -- a renewal, an extension --------------------------------------------------------------


class Renewed(NamedTuple):
    """A renewal's reply: per hold 1 renewed, 2 taken again, 0 not held; then the
    server's time."""

    flags: list[int]
    #: the server's time in ms (None in a cluster member's merged reply without one)
    time: int | None
    #: as a try's (:class:`Attempt`); a renewal's reply carries no memory record
    age: None = None
    failover: bool = False


def renewed(reply: object, holds: int) -> Renewed | None:
    """The reply to a renewal of ``holds`` holds."""
    if not isinstance(reply, list):
        return None
    time = reply[holds] if len(reply) > holds else None
    return made(
        Renewed, ([int(f) for f in reply[:holds]], time if type(time) is int else None, None, False)
    )


def extended(reply: object) -> int | None:
    """An extension's reply: the ms left on the hold (0: the owner held nothing)."""
    return reply if type(reply) is int else None


# -- a probe ------------------------------------------------------------------------------


class Probe(NamedTuple):
    """A probe's reply ``{pttl, {field, value, ...}, {waiter, ...}, {leader, record}}``
    (the last a fair lock's only)."""

    #: -2 when the key is absent
    pttl: int
    fields: dict[str, str]
    waiting: list[str]
    #: an election's leader record (empty when none)
    leader: dict[str, str]


def probe(reply: object) -> Probe:
    if not isinstance(reply, list) or len(reply) < 3 or not isinstance(reply[2], list):
        raise ValueError(f"unexpected probe reply {reply!r}")
    leader = pairs(reply[3]) if len(reply) > 3 else {}
    return Probe(int(reply[0]), pairs(reply[1]), [text(w) for w in reply[2]], leader)


class Slot(NamedTuple):
    """One held permit in a semaphore's probe reply."""

    slot: int
    owner: str
    #: the owner's hold count
    holds: int
    #: seconds left (None: no TTL)
    ttl: float | None


class Slots(NamedTuple):
    """A semaphore's probe reply ``{{slot, owner, count, pttl}, ...}, {waiter, ...}}``."""

    held: list[Slot]
    waiting: list[str]


def slots(reply: object) -> Slots:
    if not isinstance(reply, list) or len(reply) < 2:
        raise ValueError(f"unexpected probe reply {reply!r}")
    held = [Slot(int(s), text(o), int(c), ttl_of(p)) for s, o, c, p in reply[0]]
    return Slots(held, [text(w) for w in reply[1]])


# -- fencing ------------------------------------------------------------------------------


def integer_of(reply: object) -> int | None:
    """A counter or token in a reply (``fence raise``'s): a Redis integer, or a decimal
    string (bytes or str, as the client decodes it); None for anything else."""
    if isinstance(reply, int) and not isinstance(reply, bool):
        return reply
    if isinstance(reply, bytes | str) and reply.isdigit() and reply.isascii():
        return int(reply)
    return None


class Counter(NamedTuple):
    """One master's reply to ``fence.lua next``: ``{held, value, state}``."""

    #: the caller holds the lock on this master (so the counter was stepped)
    held: bool
    #: the counter, or (fresh) the master's clock in microseconds
    value: int
    #: the counter was absent: it proves nothing about earlier tokens
    fresh: bool
    #: the counter is at its largest and was held: it could not step
    full: bool = False


def counter_of(reply: object) -> Counter | None:
    if isinstance(reply, list) and len(reply) == 3 and reply[0] in (0, 1) and reply[2] in (0, 1, 2):
        value = integer_of(reply[1])
        if value is not None:
            return Counter(reply[0] == 1, value, reply[2] == 1, reply[2] == 2)
    return None


def accepted(reply: object) -> bool:
    """A fenced write's ``{1, token}`` / ``{0, largest}``: True if it was made."""
    if isinstance(reply, list) and len(reply) == 2 and reply[0] in (0, 1):
        return bool(reply[0] == 1)
    raise RuntimeError(f"odd reply from the fenced write script: {reply!r}")
