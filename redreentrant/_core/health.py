"""What a transport remembers of each master between rounds (no I/O): its idle
connections, the connections that still owe replies (:class:`Behind`), and whether it
is *suspect* (it stopped answering: rounds do not wait for it, it is probed, and it
rejoins once it answers). :mod:`.fanout` says how a round uses them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

#: the most replies a connection may owe (clean-ups queued behind replies that did not
#: come): then it is given up
MAX_OWED = 128

#: how old (a share of the master timeout) the oldest reply a healthy master's connection
#: owes must be before a round first reads what came on it (see MasterHealth.catch_up_due)
CATCH_UP_AFTER = 0.25

#: how long (seconds) a master may go without answering before a round looks, without
#: waiting, whether its idle connections were closed meanwhile (a restart, an idle
#: time-out of the server or a proxy, CLIENT KILL): those are replaced before the round
#: sends, so a closed connection does not cost the master its vote
IDLE_CHECK = 1.0


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

    def read(self, n: int = 1) -> None:
        """The ``n`` oldest owed replies were read."""
        self.owed -= n
        batches = self._batches
        first = batches[0]
        first[0] -= n
        while first[0] <= 0 and len(batches) > 1:  # the last batch stays: since keeps a value
            batches.popleft()
            left = first[0]  # what that batch had fewer than was read: the next one's
            first = batches[0]
            first[0] += left


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
    #: how its connections pack commands (they all come from one pool): found on the
    #: first one a round packs for (see :func:`~.transport.packing`)
    packing: Any = None
    #: when it last answered, or its idle connections were checked (monotonic clock):
    #: see :data:`IDLE_CHECK`
    answered_at: float = float("-inf")
    #: when a round last read a reply it owed (monotonic clock): see fanout's round
    heard: float = float("-inf")
    #: the SHAs of the scripts loaded on the master since the last new connection to it
    #: (see fanout's ``_loading``)
    scripts: set[str] = field(default_factory=set)

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

    @staticmethod
    def overdue(behind: Behind, now: float, timeout: float) -> bool:
        """Whether the oldest reply ``behind`` owes is overdue (the master stopped
        answering, or answers later than the timeout on that connection)."""
        return now - behind.since >= timeout

    def queue_behind(
        self, first: Behind, count: int, cleanup: bool
    ) -> tuple[list[Behind], list[Behind]]:
        """Where a round's ``count`` calls go on the connections that owe this master's
        replies, given ``first``, the one it took (not caught up): ``(send on these,
        close these)``; a round sends nothing else there (a suspect is sent nothing
        else at all, a master that answers slowly is sent the round on another
        connection).

        Unless the calls are a ``cleanup``, ``first`` goes back behind and nothing is
        sent. A clean-up goes on *every* connection behind, so that it runs after
        whichever carried the call it cleans up after (it may run more than once:
        releases and undos set absolute holds, so a repeat changes nothing); a
        connection that would then owe more than :data:`MAX_OWED` replies is given up
        instead. Call :meth:`queued` for each one sent."""
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
