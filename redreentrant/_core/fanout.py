"""The fan-out round, once for both transports (no I/O).

One round sends each master its calls (EVALSHA, pipelined) on a kept connection, then
reads the masters' replies under one deadline. :class:`FanoutProtocol` holds what a
transport remembers of its masters between rounds (:mod:`.health`) and makes each
round's *steps*: a generator of the I/O it needs (``CONNECT``, ``SEND``, ``READ``,
``DROP``, ``SPAWN``, ``SLEEP``: see below), which the sync and asyncio transports carry
out. A transport only connects, sends, reads
until a deadline and closes; what to send where, when to stop reading, and what
becomes of a master that stops answering is decided here:

- A round sends to the masters with a kept connection first, then connects the
  missing ones, all at once (so k unreachable masters cost one connect time-out, not
  k). A connection is sent ``SCRIPT LOAD`` of each script before its first call of it
  (:func:`~.packing.load_commands`), pipelined with that call: a master that restarted
  (which a new connection may have met) knows every script it is sent, also where a
  round does not read the reply (an undo, a release decided without it), and loading
  costs no round trip of its own, nor a payload of every script at once.
- It reads the masters in the order they were sent to, masters that are behind last,
  under one deadline (the master timeout from when the last request went out), and
  stops once its outcome is decided (:class:`~.effects.Early`). A master it did not
  read gets :data:`~.effects.UNREAD`; its connection is kept *behind*: the replies it
  still owes are read, and dropped, before the next round's, so a late reply can never
  be taken for a later one, and later calls reach that master in order after the
  earlier ones (a late grant is undone by the undo sent after it). A round looks for
  them without waiting only once they are due (:meth:`~.health.MasterHealth.catch_up_due`);
  until then it sends behind them.
- A master whose reply did not come within the master timeout is *suspect*. Rounds do
  not wait for a suspect: it fails at once. It is sent no new acquire, but clean-ups
  (undo, release: ``Fanout.cleanup``) are still sent, queued in order on its
  connections behind the calls they clean up after (on each of them: see
  :meth:`~.health.MasterHealth.queue_behind`), while a connection owes at most
  :data:`~.health.MAX_OWED` replies (then the connection is given up and later calls are not
  sent). A suspect rejoins as soon as it answers: when a reply it owed has come in
  (checked without waiting at the start of every round), or when a probe (a PING on a
  fresh connection, in the background, at most every ``probe_interval``) is answered.
- A master that answers, but later than the master timeout on a connection (its owed
  replies come in, yet one is overdue), is sent the round on another connection
  (idle, or new), the clean-ups queued on the slow one too. Requests for one lock may
  then reach a master out of order, which changes nothing: a script changes a hold
  only for a request of the try that made it or a later one (see
  :func:`~.kinds.hold_value`), so a master whose round trip nears the master timeout
  stays usable.
- A master that has not answered for :data:`~.health.IDLE_CHECK` has its idle
  connections looked at, without waiting, before a round sends on them: one the master
  closed meanwhile (a restart, an idle time-out, ``CLIENT KILL``) is replaced by a new
  one instead of failing the round.
- A master that answers NOSCRIPT (its scripts flushed while a connection was kept) is
  sent ``SCRIPT LOAD`` and the calls again, pipelined, in a round trip of its own; every
  connection then loads the scripts again before it uses them.
- A round interrupted (an asyncio cancellation, a ``KeyboardInterrupt``) leaves its
  connections behind: what it sent is read, and dropped, before anything sent later.
- The usual round on one master (one call, to a master that owes nothing and answers,
  on an idle connection) is one send and one read, without the round's bookkeeping.
- The members that are Redis Clusters are routed by :func:`~.cluster.route`, whose
  rounds over the nodes run as any round (a node is an *endpoint* of its own).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NamedTuple, TypeVar

from .cluster import Endpoints, NodeCommands, NodeRound, route
from .durability import durable
from .effects import UNREAD, Call, Early, Fanout, Reply
from .health import IDLE_CHECK, Behind, MasterHealth, suspect_error_text
from .masters import master_name
from .packing import Templates, evalsha_args, load_commands, pack_calls

T = TypeVar("T")

# -- what a round asks of its transport ---------------------------------------------------
# A round's steps yield plain tuples (cheap to make, on every round), tagged by their
# first item; each names its result:
#
#   (CONNECT, endpoints)            new connections to ``endpoints``, all at once: per
#                                   endpoint, the connection or :class:`Failed` (LATE
#                                   when the connect timed out)
#   (SEND, [(endpoint, conn, packed), ...])
#                                   send each connection its packed commands
#                                   (pipelined): None when every send went out, else per
#                                   send None (sent), the exception that failed it (the
#                                   transport dropped the connection), or, from an
#                                   interruption on (cancelled, ``KeyboardInterrupt``):
#                                   the interruption where it struck (that connection
#                                   dropped), then :data:`NOT_SENT`
#   (READ, endpoint, conn, n, deadline)
#                                   ``n`` replies from ``conn`` by ``deadline`` (once it
#                                   passed, or None: only those already there), an error
#                                   reply being a reply: ``(replies, None)``, or the
#                                   replies read and :class:`Failed`
#   (DROP, endpoint, conn)          close ``conn``, give it back to its pool: None
#   (SPAWN, steps)                  carry out ``steps`` in the background (a probe): None
#   (SLEEP, seconds)                sleep (a routed round's back-off): None
CONNECT, SEND, READ, DROP, SPAWN, SLEEP = range(6)

#: a send that did not go out (see SEND): the connection is unchanged
NOT_SENT = "not sent"

#: how a read (or a connect) failed: :attr:`Failed.kind`
LATE = 0
"""No reply in time: the connection stays usable, and owes the replies not read."""
BROKEN = 1
"""The stream broke: the transport has dropped the connection."""
STOPPED = 2
"""Interrupted (cancelled, ``KeyboardInterrupt``): nothing that came is lost; the round
leaves the connection behind and the interruption goes on."""


class Failed(NamedTuple):
    """Why a read or a connect did not complete (``kind``: :data:`LATE`,
    :data:`BROKEN` or :data:`STOPPED`)."""

    error: BaseException
    kind: int


#: an effect of a round's steps (see above)
IO = tuple[Any, ...]
#: the steps of a round, or of a probe
Steps = Generator[IO, Any, T]
#: a transport's packing of ``conn``'s commands: what the bytes depend on (the
#: connection's class and encoding), and the packer
Packing = Callable[[Any], tuple[object, Callable[[list[tuple[object, ...]]], Any]]]
#: a connection a round reads: (endpoint, connection, what it owed before the round's
#: calls (None: nothing), when the round's calls went out on it)
_Pending = tuple[int, Any, "Behind | None", float]
#: what a round sends: (endpoint, connection, packed commands, what the connection owed
#: before (None: nothing), how the replies are read: _FIRST, _LAST or _QUEUED, the SHAs
#: of the scripts loaded ahead of the calls: their replies are owed too)
_Send = tuple[int, Any, Any, "Behind | None", int, tuple[str, ...]]
#: read first; read last (behind replies owed); not read (a clean-up queued on a suspect)
_FIRST, _LAST, _QUEUED = range(3)


def is_noscript(reply: Reply) -> bool:
    """A master that does not know the script (restarted or flushed). Matched by class
    name: the core imports no client library, and valkey-py has a class of that name."""
    return isinstance(reply, Exception) and type(reply).__name__ == "NoScriptError"


def read_failed(out: list[Reply], count: int, error: BaseException) -> list[Reply]:
    """The replies of a connection whose stream broke (or timed out) after ``out``: the
    error stands for every reply still owed. The caller closes the connection."""
    return out + [error] * (count - len(out))


class FanoutRound:
    """One round: ``calls[i]`` for master ``i``, and what each master answered.

    ``voters``: the masters whose replies count for ``early`` (default all). A round
    over the nodes of cluster members (see :mod:`.cluster`) counts a node only where it
    carries all of a member's calls. ``templates``: where calls that repeat but for
    their hold are kept packed (None: packed anew; clean-ups carry a unique release id).
    """

    __slots__ = (
        "_early", "_last", "_templates", "_voters", "_yes", "calls", "decided", "noscript",
        "results",
        "targets",
    )  # fmt: skip

    def __init__(
        self,
        calls: Sequence[Sequence[Call]],
        early: Early | None = None,
        voters: Collection[int] | None = None,
        templates: Templates | None = None,
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
        self._templates = templates
        self._yes = 0
        #: whether the outcome is known: the replies not read yet need no waiting for
        self.decided = early is not None and early.needed <= 0
        # The calls packed last, how, and the bytes (see :meth:`packed`).
        self._last: tuple[object, object, Any] | None = None
        #: whether a master answered NOSCRIPT to a call: only then has :meth:`reload`
        #: anything to redo (the usual round skips it)
        self.noscript = False

    def unread(self, i: int) -> None:
        """Master ``i`` was not read: the round was decided without it."""
        self.results[i] = [UNREAD] * len(self.calls[i])

    def packed(
        self, i: int, packing: tuple[object, Callable[[list[tuple[object, ...]]], T]]
    ) -> tuple[T, frozenset[str]]:
        """Master ``i``'s commands packed by ``packing`` (what the bytes depend on, and
        the packer: see :func:`~.transport.packing`), and the SHAs of their scripts:
        worked out once for the masters after one that was sent the same calls (the
        usual round: the same list) packed the same way (the same object)."""
        calls = self.calls[i]
        last = self._last
        if last is not None and last[0] is calls and last[1] is packing:
            done: tuple[T, frozenset[str]] = last[2]  # stored below, from ``packing``
            return done
        templates = self._templates
        if templates is not None and len(calls) == 1 and calls[0].varies:  # a try
            out = templates.packed(packing[0], calls[0], packing[1])
        else:
            out = pack_calls(calls, packing[0], packing[1])
        done = (out, frozenset(c.script.sha for c in calls if c.script.command is None))
        self._last = (calls, packing, done)
        return done

    def failed(self, i: int, error: BaseException) -> None:
        """Master ``i`` could not be sent to (or its connection broke): every call
        failed with ``error``."""
        self.results[i] = [error] * len(self.calls[i])

    def answered(self, i: int, replies: list[Reply]) -> None:
        self.results[i] = replies
        for reply in replies:
            if isinstance(reply, Exception) and is_noscript(reply):
                self.noscript = True
        early = self._early
        if (
            early is not None
            and replies
            and (self._voters is None or i in self._voters)
            and early.vote(replies)
            and (self.calls[i][-1].script.command is None or durable(self.calls[i][-1], replies))
        ):
            self._yes += 1
            self.decided = self._yes >= early.needed

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
        shas = list(dict.fromkeys(c.script.sha for c in redo))
        # A script the master would not load (it cannot compile it, say): its calls
        # fail with that error rather than NOSCRIPT again.
        refused = {
            sha: r for sha, r in zip(shas, replies, strict=False) if isinstance(r, Exception)
        }
        fresh = iter(replies[len(shas) :])
        self.results[i] = [
            (refused.get(c.script.sha) or next(fresh)) if is_noscript(r) else r
            for c, r in zip(self.calls[i], self.results[i], strict=True)
        ]

    def _redo(self, i: int) -> list[Call]:
        return [c for c, r in zip(self.calls[i], self.results[i], strict=False) if is_noscript(r)]


class FanoutProtocol:
    """What a transport remembers of its endpoints between rounds, and the steps of its
    rounds (see the module docstring).

    Endpoint ``i`` is member ``i``; the nodes of cluster members are added as they are
    first routed to (:class:`~.cluster.Endpoints`). ``packing(conn)``: how ``conn``'s
    commands are packed; ``timeout_error``: the client library's time-out exception,
    which the round's own failures (a suspect not waited for) are; ``guard()`` makes
    the lock that keeps threads from growing the tables at once.

    A connection a round is done with goes back to its endpoint's idle list, also once
    the transport closed: the transport then takes them (:meth:`connections`)."""

    def __init__(
        self,
        members: Sequence[object],
        timeout: float,
        probe_interval: float,
        packing: Packing,
        timeout_error: Callable[[str], BaseException],
        guard: Callable[[], AbstractContextManager[object]] = nullcontext,
    ) -> None:
        self.timeout = timeout
        self.probe_interval = probe_interval
        self.ends = Endpoints(members, probe_interval, guard)
        #: per endpoint: its name (for messages) and what is known of it
        self.names = [master_name(m) for m in members]
        self.masters = [MasterHealth(probe_interval) for _ in members]
        #: the transport closed (probes are not started)
        self.closed = False
        self._packing = packing
        self._timeout_error = timeout_error
        self._packings: dict[object, tuple[object, Any]] = {}
        self._guard = guard()
        self._templates = Templates()

    def lone(self, fanout: Fanout, clock: Callable[[], float]) -> tuple[Any, Any, float] | None:
        """The usual round on one master, if ``fanout`` is one: one call, to a master
        that owes nothing and answers, with an idle connection. Then the connection
        (taken), the packed call and when it goes out: the transport sends the call
        (:data:`SEND`), reads its reply (:data:`READ`, by the master timeout) and gives
        both outcomes to :meth:`lone_answer`. None otherwise (:meth:`steps` then)."""
        calls = fanout.calls
        if len(calls) != 1 or len(calls[0]) != 1 or self.ends.clustered:
            return None
        m = self.masters[0]
        now = clock()
        if m.behind or m.suspect_since is not None or now - m.answered_at > IDLE_CHECK:
            return None
        try:
            conn = m.idle.pop()  # list.pop is atomic: safe across threads
        except IndexError:
            return None
        call = calls[0][0]
        if call.script.sha not in m.scripts:
            m.idle.append(conn)  # its script is to be loaded first: a full round
            return None
        packing = m.packing or self._packing_of(0, conn)
        if call.varies:  # a try
            return conn, self._templates.packed(packing[0], call, packing[1]), now
        return conn, packing[1]([evalsha_args(call)]), now

    def lone_answer(
        self,
        lone: tuple[Any, Any, float],
        sent: list[object] | None,
        got: tuple[list[Reply], Failed | None] | None,
        clock: Callable[[], float],
    ) -> list[list[Reply]] | None:
        """The outcome of :meth:`lone`'s round, from what its send and its read
        (None when the send failed) gave; None when NOSCRIPT says the call did not run
        (a full round then loads the script)."""
        if sent is not None:
            error = sent[0]
            if not isinstance(error, Exception):
                raise error  # type: ignore[misc]  # an interruption
            return [[error]]
        assert got is not None
        replies, failed = got
        if failed is None:  # the usual case, settled here
            m = self.masters[0]
            m.suspect_since = None  # it answered
            m.answered_at = lone[2]
            m.idle.append(lone[0])
        else:
            replies = self._settle(0, lone[0], None, 1, lone[2], got, clock)
        reply = replies[0]
        return None if isinstance(reply, Exception) and is_noscript(reply) else [replies]

    def steps(self, fanout: Fanout, clock: Callable[[], float]) -> Steps[list[list[Reply]]]:
        """The steps of one round carrying out ``fanout``; ``clock`` is monotonic."""
        if self.ends.clustered:
            return self._routed(fanout, clock)
        return self._round(fanout.calls, fanout.early, None, fanout.cleanup, clock)

    def connections(self) -> list[tuple[int, Any, bool]]:
        """Take every kept connection, to close them: (endpoint, connection, whether it
        owes replies)."""
        out: list[tuple[int, Any, bool]] = []
        for i, m in enumerate(self.masters):
            while m.idle:
                out.append((i, m.idle.pop(), False))
            while m.behind:
                out.append((i, m.behind.pop().conn, True))
        return out

    def reset(self) -> None:
        """Forget every connection (a forked child must not use its parent's)."""
        self.masters = [MasterHealth(self.probe_interval) for _ in self.masters]

    def _round(
        self,
        calls: Sequence[Sequence[Call]],
        early: Early | None,
        voters: Collection[int] | None,
        cleanup: bool,
        clock: Callable[[], float],
    ) -> Steps[list[list[Reply]]]:
        """One round over endpoints: ``calls[i]`` to endpoint ``i``."""
        fan = FanoutRound(calls, early, voters, None if cleanup else self._templates)
        now = clock()
        reads: list[_Pending] = []  # what the round reads, in this order
        late: list[_Pending] = []  # read last: sent behind replies a connection owes
        rest = 0  # reads[rest:] are not read yet
        try:
            sends: list[_Send] = []
            unconnected: list[int] = []
            for i in fan.targets:
                m = self.masters[i]
                behind = None
                if m.behind:
                    try:
                        behind = m.behind.pop()  # atomic: safe across threads
                    except IndexError:
                        pass
                    else:
                        if m.catch_up_due(behind, now, self.timeout):
                            behind = yield from self._catch_up(i, behind, now)
                if behind is not None and (
                    m.suspect_since is not None or m.overdue(behind, now, self.timeout)
                ):
                    # A suspect, or a reply it owes is overdue: clean-ups are queued behind
                    # the owed replies (they reach the master in order after the calls
                    # they clean up after), not waited for.
                    slow = m.heard == now  # it answered just now (see _catch_up)
                    if not slow:
                        m.timed_out(now)
                    send, close = m.queue_behind(behind, len(calls[i]), cleanup)
                    for b in close:
                        yield (DROP, i, b.conn)
                    for b in send:
                        packed, loads = self._loading(fan, i, b.conn)
                        sends.append((i, b.conn, packed, b, _QUEUED, loads))
                    behind = None
                    if not slow:  # nothing else is sent to a suspect
                        yield from self._suspect(fan, i, now, clock)
                        continue
                    # It answers, later than the master timeout on that connection: the
                    # round is sent on another one. Their order does not matter: nothing
                    # sent for a try changes what a later try made (see kinds.hold_value).
                if behind is not None:
                    packed, loads = self._loading(fan, i, behind.conn)
                    sends.append((i, behind.conn, packed, behind, _LAST, loads))
                elif m.suspect_since is not None:
                    yield from self._suspect(fan, i, now, clock)
                else:
                    if m.idle and now - m.answered_at > IDLE_CHECK:
                        yield from self._check_idle(i, now)
                    try:
                        conn = m.idle.pop()
                    except IndexError:
                        unconnected.append(i)
                    else:
                        packed, shas = fan.packed(i, m.packing or self._packing_of(i, conn))
                        if shas <= m.scripts:  # the usual round: nothing to load first
                            sends.append((i, conn, packed, None, _FIRST, ()))
                        else:
                            packed, loads = self._loading(fan, i, conn)
                            sends.append((i, conn, packed, None, _FIRST, loads))
            if sends:
                self._sent(fan, sends, (yield (SEND, sends)), reads, late, now)
            if unconnected:
                sends = []
                for i, conn in zip(unconnected, (yield (CONNECT, unconnected)), strict=True):
                    if isinstance(conn, Failed):
                        if conn.kind == LATE:
                            self.masters[i].timed_out(now)
                        fan.failed(i, conn.error)
                        continue
                    # The calls' scripts first (their replies are owed), then the calls.
                    self._made(i)
                    packed, loads = self._loading(fan, i, conn)
                    sends.append((i, conn, packed, None, _FIRST, loads))
                self._sent(fan, sends, (yield (SEND, sends)), reads, late, clock())
            reads += late
            late = []
            # The master timeout runs from when the last request went out, so a slow
            # connect to one master does not eat the others' time.
            deadline = clock() + self.timeout
            for n, (i, conn, prior, at) in enumerate(reads):
                rest = n + 1
                count = len(calls[i])
                if fan.decided:
                    fan.unread(i)
                    self.masters[i].behind.append(Behind.after(prior, conn, count, at))
                    continue
                if prior is None:
                    replies, failed = got = yield (READ, i, conn, count, deadline)
                    if failed is None:  # the usual case, settled here
                        m = self.masters[i]
                        m.suspect_since = None  # it answered
                        m.answered_at = at
                        m.idle.append(conn)
                        fan.answered(i, replies)
                        continue
                else:
                    got = yield (READ, i, conn, prior.owed + count, deadline)
                fan.answered(i, self._settle(i, conn, prior, count, at, got, clock))
            if fan.noscript:
                # A master forgot its scripts: no master is known to have any now. A
                # redo is a round trip of its own, with a time-out of its own.
                for m in self.masters:
                    m.scripts = set()
                redo_deadline = clock() + self.timeout
                for i in fan.targets:
                    redo = fan.reload(i)
                    if redo is not None:
                        fan.reloaded(i, (yield from self._run(i, redo, redo_deadline, clock)))
        except BaseException:
            # Interrupted: the replies still due on these connections are read later
            # (they stay behind), so what follows, an undo, reaches each master after
            # this round's calls, on the same connection.
            for i, conn, prior, at in reads[rest:] + late:
                self.masters[i].behind.append(Behind.after(prior, conn, len(calls[i]), at))
            raise
        return fan.results

    def _sent(
        self,
        fan: FanoutRound,
        sends: list[_Send],
        failures: list[object] | None,
        reads: list[_Pending],
        late: list[_Pending],
        at: float,
    ) -> None:
        """``sends`` went out ``at``, but for ``failures`` (see :data:`SEND`): what went
        out is to be read (``reads``, ``late``) or is queued on a suspect."""
        stop: object = None
        for k, (i, conn, _, prior, how, loads) in enumerate(sends):
            failure = None if failures is None else failures[k]
            if failure is None:
                if loads:
                    prior = self._owing(i, conn, prior, loads, at)
                if how == _FIRST:
                    reads.append((i, conn, prior, at))
                elif how == _LAST:
                    late.append((i, conn, prior, at))
                else:
                    assert prior is not None
                    self.masters[i].queued(prior, len(fan.calls[i]), at)
            elif failure is NOT_SENT:  # the connection is as it was
                if prior is None:
                    self.masters[i].idle.append(conn)
                elif how != _FIRST:
                    self.masters[i].behind.append(prior)
            else:
                if how != _QUEUED:
                    fan.failed(i, failure)  # type: ignore[arg-type]
                if not isinstance(failure, Exception):
                    stop = failure
        if stop is not None:
            raise stop  # type: ignore[misc]  # the interruption

    def _settle(
        self,
        i: int,
        conn: Any,
        prior: Behind | None,
        count: int,
        at: float,
        got: tuple[list[Reply], Failed | None],
        clock: Callable[[], float],
    ) -> list[Reply]:
        """What was read on ``conn``: what ``prior`` owed (dropped), then the replies to
        ``count`` calls sent ``at``. The connection is then idle again, or behind (late,
        or interrupted: the interruption is raised), or dropped (broken)."""
        replies, failed = got
        if prior is not None and prior.owed:
            owed = prior.owed
            prior.read(min(owed, len(replies)))  # owed replies: dropped
            replies = replies[owed:]
        m = self.masters[i]
        if failed is None:
            m.suspect_since = None  # it answered
            m.answered_at = at
            m.idle.append(conn)
            return replies
        if failed.kind != BROKEN:
            if failed.kind == LATE:
                m.timed_out(clock())
            m.behind.append(Behind.after(prior, conn, count - len(replies), at))
            if failed.kind == STOPPED:
                raise failed.error
        return read_failed(replies, count, failed.error)

    def _check_idle(self, i: int, now: float) -> Steps[None]:
        """Endpoint ``i`` has not answered for :data:`~.health.IDLE_CHECK`: its idle
        connections are looked at without waiting. One the master closed meanwhile
        breaks (the transport drops it); one with anything to read is out of step, and
        is dropped."""
        m = self.masters[i]
        good = []
        try:
            for _ in range(len(m.idle)):
                try:
                    conn = m.idle.pop()
                except IndexError:
                    break
                replies, failed = yield (READ, i, conn, 1, None)
                if failed is not None and failed.kind == STOPPED:
                    good.append(conn)  # nothing was read
                    raise failed.error
                if failed is not None and failed.kind == LATE and not replies:
                    good.append(conn)  # nothing came: open, and in step
                elif failed is None or failed.kind != BROKEN:
                    yield (DROP, i, conn)
        finally:
            m.idle += good
        m.answered_at = now

    def _catch_up(self, i: int, behind: Behind, now: float) -> Steps[Behind | None]:
        """``behind`` (a connection of endpoint ``i``, due a catch-up: see
        :meth:`MasterHealth.catch_up_due`) and those behind it, caught up as far as the
        replies that have come allow, without waiting: the first that still owes, or
        None when they caught up (their connections are idle again) or broke. A reply
        that came says the master answers: it is not suspect, and ``heard`` is ``now``."""
        m = self.masters[i]
        while True:
            replies, failed = yield (READ, i, behind.conn, behind.owed, None)
            behind.read(len(replies))
            if replies:
                m.heard = now
                m.suspect_since = None
            if failed is not None and failed.kind == STOPPED:
                m.behind.append(behind)
                raise failed.error
            if failed is None or failed.kind != BROKEN:
                if behind.owed:
                    return behind
                m.idle.append(behind.conn)
            try:
                behind = m.behind.pop()
            except IndexError:
                return None
            if not m.catch_up_due(behind, now, self.timeout):
                return behind

    def _suspect(
        self, fan: FanoutRound, i: int, now: float, clock: Callable[[], float]
    ) -> Steps[None]:
        """Endpoint ``i`` is suspect: it fails this round at once, and is probed."""
        m = self.masters[i]
        since = m.suspect_since if m.suspect_since is not None else now
        fan.failed(i, self._timeout_error(suspect_error_text(self.names[i], since, now)))
        if m.start_probe(now) and not self.closed:
            yield (SPAWN, self._probe(i, clock))

    def _probe(self, i: int, clock: Callable[[], float]) -> Steps[None]:
        """PING endpoint ``i`` on a fresh connection: when it answers in time (one
        round trip, within the master timeout), it rejoins at once."""
        m = self.masters[i]
        answered = False
        (conn,) = yield (CONNECT, [i])
        if not isinstance(conn, Failed):
            self._made(i)
            ping = self._packing(conn)[1]([("PING",)])
            failed: Failed | None = None
            if (yield (SEND, [(i, conn, ping)])) is None:
                deadline = clock() + self.timeout
                replies, failed = yield (READ, i, conn, 1, deadline)
                pong = replies[-1] if failed is None else None
                answered = bool(pong) and not isinstance(pong, Exception)
                if answered and not self.closed:
                    m.idle.append(conn)
                elif failed is None or failed.kind != BROKEN:
                    yield (DROP, i, conn)
        for behind in m.probed(answered):
            yield (DROP, i, behind.conn)

    def _run(
        self,
        i: int,
        commands: list[tuple[object, ...]],
        deadline: float,
        clock: Callable[[], float],
    ) -> Steps[list[Reply]]:
        """Send ``commands`` to endpoint ``i`` and read their replies (the NOSCRIPT
        redo, a routed round's single commands)."""
        m = self.masters[i]
        prior = None
        try:
            conn = m.idle.pop()
            packed = self._packing(conn)[1](commands)
        except IndexError:
            (conn,) = yield (CONNECT, [i])
            if isinstance(conn, Failed):
                if conn.kind == LATE:
                    m.timed_out(clock())
                return read_failed([], len(commands), conn.error)
            self._made(i)
            packed = self._packing(conn)[1](commands)
        failures = yield (SEND, [(i, conn, packed)])
        if failures is not None:
            if not isinstance(failures[0], Exception):
                raise failures[0]
            return read_failed([], len(commands), failures[0])
        owed = 0 if prior is None else prior.owed
        got = yield (READ, i, conn, owed + len(commands), deadline)
        return self._settle(i, conn, prior, len(commands), clock(), got, clock)

    def _routed(self, fanout: Fanout, clock: Callable[[], float]) -> Steps[list[list[Reply]]]:
        """A round over members some of which are Redis Clusters (see :func:`route`)."""
        steps = route(fanout, self.ends, clock, self.timeout)
        result: object = None
        try:
            while True:
                effect = steps.send(result)
                self._grow()
                if isinstance(effect, NodeRound):
                    calls, early, voters = effect.calls, effect.early, effect.voters
                    result = yield from self._round(calls, early, voters, effect.cleanup, clock)
                elif isinstance(effect, NodeCommands):
                    deadline = clock() + self.timeout
                    commands = list(effect.commands)
                    result = yield from self._run(effect.endpoint, commands, deadline, clock)
                else:
                    result = yield (SLEEP, effect.seconds)  # a Backoff
        except StopIteration as stop:
            replies: list[list[Reply]] = stop.value
            return replies

    def _grow(self) -> None:
        """Tables for the endpoints :func:`route` added (nodes routed to for the first
        time)."""
        table = self.ends.table
        if len(self.masters) == len(table):
            return
        with self._guard:
            while len(self.masters) < len(table):
                i, node = table[len(self.masters)]
                assert node is not None
                self.names.append(f"{self.names[i]} node {node[0]}:{node[1]}")
                # Last: the endpoint is in use once its health is there.
                self.masters.append(MasterHealth(self.probe_interval))

    def _packing_of(self, i: int, conn: Any) -> tuple[object, Any]:
        """How endpoint ``i``'s connections pack, found on ``conn``: they all come from
        one pool, so they pack alike. One object per way of packing, shared by the
        endpoints that pack alike (see :meth:`FanoutRound.packed`)."""
        found = self._packing(conn)
        packing = self.masters[i].packing = self._packings.setdefault(found[0], found)
        return packing

    def _made(self, i: int) -> None:
        """A new connection to endpoint ``i`` was made: its master may have restarted
        since the scripts were loaded there (which closed the older connections), so
        none is known to be loaded any more."""
        self.masters[i].scripts = set()

    def _loading(self, fan: FanoutRound, i: int, conn: Any) -> tuple[Any, tuple[str, ...]]:
        """Endpoint ``i``'s calls packed for ``conn`` (once per round for every endpoint
        with the same calls and the same packing; an endpoint's connections all come
        from one pool, so they pack alike: its packing is found on the first), after
        ``SCRIPT LOAD`` of each of their scripts the master is not known to have (the
        usual round has none), and the SHAs of those (see :meth:`_owing`)."""
        m = self.masters[i]
        packed, shas = fan.packed(i, m.packing or self._packing_of(i, conn))
        loaded = m.scripts
        if shas <= loaded:
            return packed, ()  # the usual round
        calls = fan.calls[i]
        scripts = {
            c.script.sha: c.script
            for c in calls
            if c.script.sha not in loaded and c.script.command is None
        }
        loads = self._packing(conn)[1](load_commands(list(scripts.values())))
        both = loads + packed
        if all(type(part) is bytes for part in both):
            # One write: a second small one may wait for the first to leave the host
            # (TCP autocorking), a round trip on a slow link.
            both = [b"".join(both)]
        return both, tuple(scripts)

    def _owing(
        self, i: int, conn: Any, prior: Behind | None, loads: tuple[str, ...], at: float
    ) -> Behind:
        """``conn`` (of endpoint ``i``) was sent ``SCRIPT LOAD`` of ``loads`` (after what
        ``prior`` owed), at ``at``: its master has them, and the connection owes their
        replies ahead of the calls."""
        self.masters[i].scripts.update(loads)
        if prior is None:
            return Behind(conn, len(loads), at)
        prior.sent(len(loads), at)
        return prior
