"""The fan-out protocol, the same for both transports (no I/O).

One round sends each master its calls (EVALSHA, pipelined) on a kept connection, then
reads the masters' replies under one deadline. :class:`FanoutRound` is the round's
bookkeeping: what to send to whom, what each master answered, when the outcome is
decided (:class:`~.effects.Early`), and the redo of calls a master answered NOSCRIPT to
(it restarted or was flushed: SCRIPT LOAD and the calls again, pipelined on the same
connection). :class:`MasterHealth` is what a transport remembers of each master between
rounds. The sync and asyncio transports do only the I/O around them: take or open
connections (all masters at once), send, read, probe.

Rounds never wait for what they do not need:

- A round reads the masters in the order they were sent to, masters that are behind
  last, and stops once its outcome is decided. A master it did not read gets
  :data:`~.effects.UNREAD`; its connection is kept *behind*: the replies it still owes
  are read, and dropped, before the next round's, so a late reply can never be taken
  for a later one, and later calls reach that master in order after the earlier ones
  (a late grant is undone by the undo sent after it). A round looks for them without
  waiting only once they are due (:meth:`MasterHealth.catch_up_due`); until then it
  sends behind them.
- A master whose reply did not come within the master timeout is *suspect*. Rounds do
  not wait for a suspect: it fails at once. It is sent no new acquire, but clean-ups
  (undo, release: ``Fanout.cleanup``) are still sent, queued in order on its connections
  behind the calls they clean up after (on each of them: see
  :meth:`MasterHealth.queue_for_suspect`), while a connection owes at most
  :data:`MAX_OWED` replies (then the connection is given up and later calls are not
  sent). A suspect rejoins as soon
  as it answers: when its owed replies have come in (checked without waiting at the
  start of every round), or when a probe (a PING on a fresh connection, in the
  background, at most every ``probe_interval``) is answered.
"""

from __future__ import annotations

import codecs
import functools
import inspect
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .effects import UNREAD, Call, Early, Reply
from .scripts import LOCK_SCRIPTS

T = TypeVar("T")

#: the most replies a suspect master's connection may owe: then it is given up, and
#: calls are not sent to that master until it answers a probe
MAX_OWED = 128

#: how old (a share of the master timeout) the oldest reply a healthy master's connection
#: owes must be before a round first reads what came on it (see MasterHealth.catch_up_due)
CATCH_UP_AFTER = 0.25


@functools.lru_cache(maxsize=8)
def wire_packer(
    encoding: str, errors: str
) -> Callable[[list[tuple[object, ...]]], list[bytes]] | None:
    """A packer of commands into the Redis protocol in C (hiredis's), for a connection
    that encodes text as hiredis does (UTF-8, strict); None when hiredis is not
    installed or the connection encodes otherwise (its own packer is then used). The
    asyncio client packs in Python, a large share of a round's time."""
    try:
        from hiredis import pack_command
    except ImportError:  # an optional speed-up of redis-py
        return None
    if codecs.lookup(encoding).name != "utf-8" or errors != "strict":
        return None

    def pack(commands: list[tuple[object, ...]]) -> list[bytes]:
        # Our commands hold only str and int arguments, which hiredis packs as is.
        if len(commands) == 1:
            return [pack_command(commands[0])]  # type: ignore[arg-type,unused-ignore]
        return [b"".join(pack_command(c) for c in commands)]  # type: ignore[arg-type,unused-ignore]

    return pack


def preload_commands() -> list[tuple[object, ...]]:
    """``SCRIPT LOAD`` of every script the masters run, sent on each new connection
    before anything else: a master that restarted (or never ran a script) then knows
    them all, so a call whose reply a round does not read (an undo, a release decided
    without it) cannot be dropped there as NOSCRIPT."""
    return [("SCRIPT", "LOAD", script.source) for script in LOCK_SCRIPTS]


def evalsha_args(call: Call) -> tuple[object, ...]:
    """The EVALSHA command for a call."""
    return ("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)


#: how many packed calls a :class:`WireCache` keeps (then it starts afresh)
WIRE_CACHE_SIZE = 256

_MISSING = object()


class WireCache:
    """The packed bytes of calls sent before, so that a call repeated as it is (the same
    owner taking the same lock again) is packed once. Bounded: emptied when full.

    An entry is found only by everything its bytes depend on: the packing (``how``),
    and each call's script, keys, arguments and the arguments' types (``1``, ``1.0``
    and ``True`` are equal keys of a dict, but not the same bytes)."""

    def __init__(self, size: int = WIRE_CACHE_SIZE) -> None:
        self.size = size
        self._packed: dict[tuple[object, ...], Any] = {}

    def packed(
        self,
        how: object,
        calls: Sequence[Call],
        pack: Callable[[list[tuple[object, ...]]], T],
    ) -> T:
        if len(calls) == 1:
            c = calls[0]
            key: tuple[object, ...] = (how, c.script.sha, c.keys, c.args, *map(type, c.args))
        else:
            parts: list[object] = [how]
            for c in calls:
                parts += (c.script.sha, c.keys, c.args, *map(type, c.args))
            key = tuple(parts)
        out = self._packed.get(key, _MISSING)
        if out is _MISSING:
            if len(self._packed) >= self.size:
                self._packed.clear()  # one call, safe while other threads look up
            out = self._packed[key] = pack([evalsha_args(c) for c in calls])
        result: T = out  # stored by this method, from ``pack``
        return result


def connection_getter(pool: Any) -> Callable[[], Any]:
    """``pool.get_connection`` across redis-py versions (5.0 needs a command name,
    later versions warn when given one)."""
    params = inspect.signature(pool.get_connection).parameters
    first = next(iter(params.values()), None)
    if first is not None and first.default is inspect.Parameter.empty:
        return lambda: pool.get_connection("EVALSHA")
    return pool.get_connection  # type: ignore[no-any-return]


def is_noscript(reply: Reply) -> bool:
    """A master that does not know the script (restarted or flushed). Matched by class
    name: the core imports no client library, and valkey-py has a class of that name."""
    return isinstance(reply, Exception) and type(reply).__name__ == "NoScriptError"


def read_failed(out: list[Reply], count: int, error: BaseException) -> list[Reply]:
    """The replies of a connection whose stream broke (or timed out) after ``out``: the
    error stands for every reply still owed. The caller closes the connection."""
    return out + [error] * (count - len(out))


def pack_calls(
    calls: Sequence[Call],
    how: object,
    pack: Callable[[list[tuple[object, ...]]], T],
    wire: WireCache | None,
) -> T:
    """``calls`` packed by ``pack`` (``how``: what the packing depends on), through
    ``wire`` when given (calls that are not kept, such as clean-ups with their unique
    release ids, are packed anew)."""
    if wire is None:
        return pack([evalsha_args(c) for c in calls])
    return wire.packed(how, calls, pack)


def lone_calls(
    calls: Sequence[Sequence[Call]], health: Sequence[MasterHealth]
) -> Sequence[Call] | None:
    """The calls of a round that needs none of :class:`FanoutRound`'s bookkeeping, or
    None: one call to the only master, which owes nothing and is not suspect (the
    usual round on one master, whose one reply is its outcome). Its transport sends it
    on an idle connection and reads the reply as any round's (a time-out leaves the
    connection behind, a broken stream drops it); with no idle connection it makes a
    full round instead. A NOSCRIPT reply means the call did not run: the transport then
    makes it again as a full round, which loads the script (see
    :meth:`FanoutRound.reload`)."""
    if len(calls) != 1 or len(calls[0]) != 1:
        return None
    m = health[0]
    if m.behind or m.suspect_since is not None:
        return None
    return calls[0]


class FanoutRound:
    """One round: ``calls[i]`` for master ``i``, and what each master answered.

    ``voters``: the masters whose replies count for ``early`` (default all). A round
    over the nodes of cluster members (see :mod:`.cluster`) counts a node only where it
    carries all of a member's calls. ``wire``: where packed calls are kept across
    rounds (None: packed anew; clean-ups carry a unique release id, and are not kept).
    """

    __slots__ = (
        "_early", "_packed", "_voters", "_wire", "_yes", "calls", "noscript", "results", "targets",
    )  # fmt: skip

    def __init__(
        self,
        calls: Sequence[Sequence[Call]],
        early: Early | None = None,
        voters: Collection[int] | None = None,
        wire: WireCache | None = None,
    ) -> None:
        self.calls = calls
        self.results: list[list[Reply]] = [[] for _ in calls]
        #: the masters this round sends to
        self.targets = (
            list(range(len(calls)))  # the usual round: every master has calls
            if all(calls)
            else [i for i, per_master in enumerate(calls) if per_master]
        )
        self._early = early
        self._voters = voters
        self._yes = 0
        self._packed: dict[tuple[int, object], Any] = {}
        self._wire = wire
        #: whether a master answered NOSCRIPT to a call: only then has :meth:`reload`
        #: anything to redo (the usual round skips it)
        self.noscript = False

    @property
    def decided(self) -> bool:
        """Whether the outcome is known: the replies not read yet need no waiting for."""
        return self._early is not None and self._yes >= self._early.needed

    def unread(self, i: int) -> None:
        """Master ``i`` was not read: the round was decided without it."""
        self.results[i] = [UNREAD] * len(self.calls[i])

    def commands(self, i: int) -> list[tuple[object, ...]]:
        return [evalsha_args(c) for c in self.calls[i]]

    def packed(self, i: int, how: object, pack: Callable[[list[tuple[object, ...]]], T]) -> T:
        """Master ``i``'s commands packed by ``pack``, packed once for all the masters
        that are sent the same calls (the usual round) and packed the same way
        (``how``: what the packing depends on, such as the connection's encoding)."""
        calls = self.calls[i]
        key = (id(calls), how)
        out = self._packed.get(key, _MISSING)
        if out is _MISSING:
            out = self._packed[key] = pack_calls(calls, how, pack, self._wire)
        result: T = out  # stored by this method, from ``pack``
        return result

    def count(self, i: int) -> int:
        return len(self.calls[i])

    def failed(self, i: int, error: BaseException) -> None:
        """Master ``i`` could not be sent to (or its connection broke): every call
        failed with ``error``."""
        self.results[i] = [error] * len(self.calls[i])

    def answered(self, i: int, replies: list[Reply]) -> None:
        self.results[i] = replies
        for reply in replies:
            if isinstance(reply, Exception) and is_noscript(reply):
                self.noscript = True
        if (
            self._early is not None
            and replies
            and (self._voters is None or i in self._voters)
            and self._early.vote(replies)
        ):
            self._yes += 1

    def reload(self, i: int) -> list[tuple[object, ...]] | None:
        """The pipelined commands that load the scripts master ``i`` did not know and
        run those calls again, or None when it knew them all."""
        for reply in self.results[i]:
            if isinstance(reply, Exception) and is_noscript(reply):
                break
        else:
            return None  # the usual case, checked cheaply
        redo = self._redo(i)
        sources = {c.script.sha: c.script.source for c in redo}
        commands: list[tuple[object, ...]] = [("SCRIPT", "LOAD", s) for s in sources.values()]
        return commands + [evalsha_args(c) for c in redo]

    def reloaded(self, i: int, replies: list[Reply]) -> None:
        """The replies to :meth:`reload`'s commands: the calls' new answers."""
        redo = self._redo(i)
        loads = len({c.script.sha for c in redo})
        fresh = iter(replies[loads:])
        self.results[i] = [next(fresh) if is_noscript(r) else r for r in self.results[i]]

    def _redo(self, i: int) -> list[Call]:
        return [c for c, r in zip(self.calls[i], self.results[i], strict=False) if is_noscript(r)]


class Behind:
    """A connection that still owes replies: they are read, and dropped, before the
    replies of anything sent on it later.

    It keeps when each batch of owed replies went out, so that :attr:`since` is the
    time of the oldest reply still owed also after some of them were read."""

    __slots__ = ("_batches", "conn", "owed")

    def __init__(self, conn: Any, owed: int, since: float) -> None:
        self.conn = conn
        #: replies still owed
        self.owed = owed
        # [how many replies, when their commands went out], oldest first
        self._batches: deque[list[float]] = deque([[owed, since]])

    @staticmethod
    def after(prior: Behind | None, conn: Any, count: int, at: float) -> Behind:
        """``conn``, owing ``count`` replies sent ``at`` after what ``prior`` (the
        connection's earlier state, if it was behind) still owes."""
        if prior is None:
            return Behind(conn, count, at)
        prior.sent(count, at)
        return prior

    @property
    def since(self) -> float:
        """When the oldest reply still owed went out (monotonic clock)."""
        return self._batches[0][1]

    def sent(self, count: int, at: float) -> None:
        """``count`` more commands went out on the connection ``at``."""
        if count <= 0:
            return
        if self.owed <= 0:
            self._batches.clear()
        self.owed += count
        self._batches.append([count, at])

    def read(self) -> None:
        """The oldest owed reply was read."""
        self.owed -= 1
        first = self._batches[0]
        first[0] -= 1
        if first[0] <= 0 and len(self._batches) > 1:
            self._batches.popleft()  # the last batch stays: since keeps a value


@dataclass(eq=False)
class MasterHealth:
    """What a transport remembers of one master between rounds (no I/O).

    Lists are used as thread-safe stacks (``append``/``pop``), so the sync transport's
    threads need no lock here; each connection is in the hands of one round at a time.
    """

    probe_interval: float
    #: connections ready for a round
    idle: list[Any] = field(default_factory=list)
    #: connections that owe replies (see :class:`Behind`)
    behind: list[Behind] = field(default_factory=list)
    #: when the master stopped answering in time, or None while it answers
    suspect_since: float | None = None
    #: the next time a probe may start, and whether one is under way
    probe_at: float = 0.0
    probing: bool = False

    @property
    def suspect(self) -> bool:
        return self.suspect_since is not None

    def timed_out(self, now: float) -> None:
        """The master did not answer within the master timeout."""
        if self.suspect_since is None:
            self.suspect_since = now
            self.probe_at = now + self.probe_interval

    def answered(self) -> None:
        """The master answered in time: it is not (or no longer) suspect."""
        self.suspect_since = None

    def catch_up_due(self, behind: Behind, now: float, timeout: float) -> bool:
        """Whether a round first reads, without waiting, the replies that came on
        ``behind``. Always for a suspect: it rejoins as soon as they came. For a master
        that answers, only once the oldest owed reply is :data:`CATCH_UP_AFTER` of the
        master timeout old, which is well before it would be overdue: until then the
        round sends behind the owed replies and reads them before its own, if it reads
        that master at all. Looking for a reply that has not come yet costs a pass of
        the event loop on asyncio, and most rounds decide before they read the masters
        behind."""
        return self.suspect or now - behind.since >= CATCH_UP_AFTER * timeout

    def lagging(self, behind: Behind, now: float, timeout: float) -> bool:
        """Whether ``behind`` (not caught up) shows the master stopped answering: its
        oldest owed reply is overdue."""
        if now - behind.since >= timeout:
            self.timed_out(now)
        return self.suspect

    def queue_for_suspect(
        self, first: Behind, count: int, cleanup: bool
    ) -> tuple[list[Behind], list[Behind]]:
        """Where a round's ``count`` calls go on a suspect, given ``first``, the
        connection it took (not caught up): ``(send on these, close these)``.

        A suspect is sent no new acquire: unless the calls are a ``cleanup``, ``first``
        goes back behind and nothing is sent. A clean-up goes on *every* connection
        behind, so that it runs after whichever carried the call it cleans up after (it
        may run more than once: releases and undos set absolute hold counts, so a repeat
        changes nothing); a connection that would then owe more than :data:`MAX_OWED`
        replies is given up instead. Call :meth:`queued` for each one sent."""
        if not cleanup:
            self.behind.append(first)
            return [], []
        every = [first]
        while True:
            try:
                every.append(self.behind.pop())
            except IndexError:
                break
        send = [b for b in every if b.owed + count <= MAX_OWED]
        return send, [b for b in every if b.owed + count > MAX_OWED]

    def queued(self, behind: Behind, count: int, at: float) -> None:
        """``count`` more calls went out on ``behind`` ``at``: it owes their replies
        too."""
        behind.sent(count, at)
        self.behind.append(behind)

    def start_probe(self, now: float) -> bool:
        """Whether to start a probe of this suspect now (at most one under way)."""
        if self.suspect_since is None or self.probing or now < self.probe_at:
            return False
        self.probing = True
        self.probe_at = now + self.probe_interval
        return True

    def probed(self, answered: bool) -> list[Behind]:
        """A probe ended. When it was answered, the master rejoins, and the connections
        still behind (their replies never came) are returned to be closed."""
        self.probing = False
        if not answered:
            return []
        self.answered()
        stale = []
        while self.behind:
            stale.append(self.behind.pop())
        return stale


def suspect_error_text(master: str, since: float, now: float) -> str:
    """Why a round did not wait for a suspect master."""
    return f"{master} has not answered for {now - since:.3f}s: not waited for until it answers"
