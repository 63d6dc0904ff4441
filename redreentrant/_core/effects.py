"""Effects: what the lock algorithms ask their driver to do.

Nothing here does I/O. The algorithms (:mod:`.rounds`, :mod:`.locking`,
:mod:`.watchdog`) are generators that yield effects (:class:`Fanout`, :class:`Watch`,
:class:`Wait`, :class:`Notify`, :class:`Relay`) and receive their results; the sync
driver (threads, redis-py) and the asyncio driver (tasks, ``redis.asyncio``) carry them
out. So there is one algorithm for both flavours.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from .scripts import Script

T = TypeVar("T")

#: makes a named tuple from all of its fields, in C: ``made(Fanout, (calls, early,
#: cleanup))``. NamedTuple's own constructor is a Python call, which costs an
#: uncontended acquire+release cycle about 0.3 % more instructions for each tuple
#: (bench_instructions.py); the tuples made on every try and release use this.
made = tuple.__new__

#: What a master answered to one call: the decoded reply, or the exception it raised
#: (an error reply, a refused connection, a time-out).
Reply = object


# The effects made on every round (Call, Early, Fanout, Notify) are named tuples:
# immutable like frozen dataclasses, but built and hashed in C.


class Groups(NamedTuple):
    """How a call over several locks' keys splits (see :class:`Call`): its keys come in
    groups of ``keys`` (one group per lock), its arguments are ``shared`` arguments
    followed by ``args`` per group, and ``merge`` makes the call's reply from the
    replies of its parts, each with the indices of its groups."""

    keys: int
    shared: int
    args: int
    merge: Callable[[list[tuple[list[int], Reply]]], Reply]


class Call(NamedTuple):
    """One script call: EVALSHA ``script`` with ``keys`` and ``args``.

    ``groups``: the call is over several locks at once (a multi-lock), atomic on one
    master; on a Redis Cluster member whose nodes own its locks' slots apart, it is
    made as one call per slot, and the parts' replies merged (see
    :func:`~.cluster.route`)."""

    script: Script
    keys: tuple[str, ...]
    args: tuple[str | int, ...]
    groups: Groups | None = None
    #: where in ``args`` the arguments of one try are (its hold, ``"<count>:<tag>"``, and
    #: a proposed place), which differ from one try to the next while the rest of the
    #: call repeats (see :class:`~.packing.Templates`)
    varies: tuple[int, ...] = ()


class Unread:
    """The reply of a master whose answer the round did not wait for (its outcome was
    decided without it). Its reply is read, and dropped, before that master's next one."""

    def __repr__(self) -> str:
        return "UNREAD"


#: see :class:`Unread`
UNREAD = Unread()


class Early(NamedTuple):
    """When a round may stop reading: once ``needed`` masters' replies (the list of a
    master's replies, one per call) pass ``vote``. ``needed == 0``: do not wait for any
    reply (an undo, whose outcome nobody reads)."""

    needed: int
    vote: Callable[[list[Reply]], bool]


class Fanout(NamedTuple):
    """Effect: send ``calls[i]`` to master ``i``, all masters at once, in one round trip each.

    Result: ``list[list[Reply]]``, one list per master with one reply per call. A master
    that does not answer within the master timeout gets the exception for every call,
    as does a master known not to answer (a *suspect*, see :mod:`.fanout`). With
    ``early``, the round ends once its outcome is decided: the masters not read by then
    get :data:`UNREAD` for every call.
    """

    calls: tuple[tuple[Call, ...], ...]
    early: Early | None = None
    #: the calls undo or release what earlier calls may have taken: they are queued for
    #: suspect masters too (in order, behind those earlier calls), which other calls
    #: are not (a suspect is sent no new acquire)
    cleanup: bool = False


@dataclass(frozen=True)
class Watch:
    """Effect: ``owner`` begins to wait for wake-ups on ``channel``; result: its
    generation (0 for a fresh watch; a wake-up may already be counted against it).

    A plain channel is subscribed on every master (confirmed before the result): a
    ``broadcast`` one wakes all its local waiters on a release (readers), any other one
    at a time (the woken one takes the lock, or relays the wake-up). A ``targeted``
    channel is not subscribed at all: the masters wake one registered waiter by name,
    on its manager's home channel, and the channel only names the lock locally.
    """

    channel: str
    owner: str
    broadcast: bool = False
    targeted: bool = False


@dataclass(frozen=True)
class Messages:
    """Effect: the messages of a log channel (one the hub keeps every message of for
    its waiters: an election's changes) that came for ``owner`` since it last took
    them. Result: ``list[tuple[int, str]]``, (master, data) in order of arrival."""

    channel: str
    owner: str


@dataclass(frozen=True)
class Wait:
    """Effect: ``owner`` waits until its wake-ups on ``channel`` move past
    ``generation``, or ``timeout`` seconds. Result: its generation when the wait ended.
    """

    channel: str
    owner: str
    generation: int
    timeout: float


@dataclass(frozen=True)
class Handover:
    """A grant that a release made in this process to a waiter of its manager directly
    (see :class:`Handed`): the lease in ms the waiter was granted with, the masters
    that granted it, when the release went out (before the grants), on the monotonic
    clock, and the tag of the hold it made (see :func:`~.kinds.hold_value`)."""

    lease_ms: int
    masters: frozenset[int]
    since: float
    tag: int = 0


class Notify(NamedTuple):
    """Effect: a release made here freed a lock: wake local waiters on ``channels`` now.

    ``release_id`` is the release's wake-up payload: the pub/sub messages of the same
    release (one per master) are then recognised and not counted again. ``woken``
    names the waiters the masters chose (targeted channels): each of them that waits
    here is woken, and nobody else; when the masters chose nobody (``()``), one local
    waiter is.
    """

    channels: tuple[str, ...]
    release_id: str
    woken: tuple[str, ...] = ()
    #: the woken waiters the masters also handed the lock over to
    handovers: tuple[tuple[str, Handover], ...] = ()
    #: wake every local waiter: a hand-over was asked for, and some master's reply
    #: was lost (so a waiter may hold the lock without knowing)
    everyone: bool = False


@dataclass(frozen=True)
class Handed:
    """Effect: ``owner`` was woken on ``channel``: the :class:`Handover` it was given
    with that wake-up, if any (taken: asked again, it is None). Result:
    ``Handover | None``."""

    channel: str
    owner: str


@dataclass(frozen=True)
class Pause:
    """Effect: sleep ``seconds`` (a back-off that no release cuts short); result None."""

    seconds: float


@dataclass(frozen=True)
class Relay:
    """Effect: ``owner``, a waiter that was woken, gives up: pass the wake-up on to
    another local waiter."""

    channel: str
    owner: str


Effect = Fanout | Watch | Wait | Notify | Relay | Pause | Handed | Messages
Steps = Generator[Effect, Any, T]
