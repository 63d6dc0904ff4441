"""Each master's clock and memory, watched against this process's monotonic clock (no
I/O).

A master measures leases on its own clock: one whose clock jumps forward (or runs
far fast) expires the holds it keeps early, and a rival could take the lock there
while its holder's validity runs. Every try's and every renewal's reply carries the
server's time (ms): each one bounds the master's *offset*, its clock less this
process's monotonic clock, to an interval (the reply came between the round's start
and its end). Offsets stay put but for the drift the model allows
(``drift_factor`` of the time passed, plus a few ms); an observation out of that
range means the master's clock stepped (or runs far off rate). Such a master is
*counted out* for the quarantine (as long as a hold of the manager may stand: by then
every hold it kept when its clock moved has ended anyway): its grants, renewals and
extensions do not count toward a quorum, and the step is reported.

A master is judged against what this process saw of it before: a step that happened
before the process's first round with that master cannot be seen.

Every try's reply also carries the age of the master's *memory* (see the stamp in
``lua/acquire.lua``): a master whose memory began lately (it restarted without its
data, was flushed, lost keys to eviction, or was promoted from a replica) may have
forgotten holds that still stand. While its memory is younger than the *memory
quarantine* (``memory_ms``), it is counted out as above, until its memory is that
old: its grants count for nobody, and no rival takes a lock there while a holder's
validity from before may run. A failover is let pass on a member whose grants are all
acknowledged by replicas (``trusts_failover``): the promoted replica has them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from .replies import Attempt, Renewed

#: ms an offset may move between two observations besides the drift allowance: the
#: server's time in whole ms, and the drift allowance's own fixed part
SLACK_MS = 3.0

#: ms after which a master's observation in step becomes its new anchor: each one is
#: judged against the anchor, not the previous one, so that a clock running fast by a
#: little per round cannot creep past the allowance, which is that of this long (the
#: drift over it, and SLACK_MS), or of the time since the anchor when longer
REANCHOR_MS = 1_000.0


class ClockWatch:
    """What is known of each master's clock, and which masters are counted out, on the
    monotonic ``clock``.

    ``quarantine()`` gives how long (seconds) a master whose clock moved is counted
    out; ``on_step(master, seconds)`` is told of each step seen (seconds: how far the
    clock moved beyond what drift allows, negative for a step back)."""

    __slots__ = (
        "_at", "_clock", "_drift", "_high", "_low", "anyone_out", "memory_ms", "on_change",
        "on_forgot", "on_step", "out_until", "quarantine", "trusts_failover",
    )  # fmt: skip

    def __init__(
        self,
        size: int,
        drift_factor: float,
        clock: Callable[[], float],
        quarantine: Callable[[], float] = lambda: 0.0,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        #: per master: the range its offset may lie in (ms), widened by the allowance, as
        #: of its anchor, and the anchor's time (ms; -inf: none yet)
        self._low = [-math.inf] * size
        self._high = [math.inf] * size
        self._at = [-math.inf] * size
        self._drift = drift_factor
        self._clock = clock
        #: how long (seconds) a master whose clock moved is counted out
        self.quarantine = quarantine
        #: per master: until when (monotonic seconds) it is counted out
        self.out_until = [-math.inf] * size
        #: whether any master may be counted out now (the usual round checks only this)
        self.anyone_out = False
        self.on_step: Callable[[int, float], None] = lambda master, seconds: None
        #: told when masters are counted out, or all back in
        self.on_change = on_change
        #: how young (ms) a master's memory may be and still count (0: any age counts)
        self.memory_ms = 0.0
        #: per master: a failover does not count it out (its grants reach replicas)
        self.trusts_failover = [False] * size
        #: told of each master counted out for its memory: (master, seconds, failover)
        self.on_forgot: Callable[[int, float, bool], None] = lambda master, s, failover: None

    def observe(
        self, replies: Sequence[Attempt | Renewed | None], sent: float, received: float
    ) -> None:
        """Note the server times in a round's decoded replies (each master's first, a
        try's or a renewal's: see :mod:`.replies`), the round having gone out at
        ``sent`` and ended at ``received`` (monotonic seconds). A master without one (an
        error, or not read) is passed over."""
        # On every try: one pass, the usual case (in step) settled inline.
        sent_ms = sent * 1000.0
        received_ms = received * 1000.0
        lows, highs, ats = self._low, self._high, self._at
        young = self.memory_ms
        for i, reply in enumerate(replies):
            # The server read its clock between ``sent`` and ``received``, in whole ms:
            # its offset lies in [lo, hi]; against the anchor's, it may have moved by the
            # allowance (``_low``, ``_high``).
            if reply is None or reply.time is None:
                continue
            lo = reply.time - received_ms - 1.0
            hi = reply.time - sent_ms
            if lo > highs[i] or hi < lows[i]:
                self._stepped(i, lo, hi, received)
            elif received_ms - ats[i] > REANCHOR_MS:
                self._anchor(i, lo, hi, received_ms)
            age = reply.age
            if age is not None and age < young:
                self._forgot(i, (young - age) / 1000.0, reply.failover, received)

    def _forgot(self, i: int, left: float, failover: bool, now: float) -> None:
        """Master ``i``'s memory is ``left`` seconds short of the memory quarantine (it
        began with a failover if ``failover``): counted out until it is not."""
        if failover and self.trusts_failover[i]:
            return
        until = now + left
        if until > self.out_until[i]:
            told = self.out_until[i] > now  # out already: told before
            self.out_until[i] = until
            self.anyone_out = True
            self.on_change()
            if not told:
                self.on_forgot(i, left, failover)

    def _anchor(self, i: int, lo: float, hi: float, at_ms: float) -> None:
        """Master ``i``'s offset lies in ``[lo, hi]`` (ms) at ``at_ms``: until the next
        anchor, an offset beyond that range widened by the allowance over
        :data:`REANCHOR_MS` is a step."""
        allowed = self._drift * REANCHOR_MS + SLACK_MS
        self._low[i], self._high[i], self._at[i] = lo - allowed, hi + allowed, at_ms

    def _stepped(self, i: int, lo: float, hi: float, now: float) -> None:
        """Master ``i`` was seen at an offset in ``[lo, hi]`` (ms), out of its anchor's
        range: unless the drift allowed since the anchor (a master seen seldom) covers
        it, it is counted out, reported, and anchored anew."""
        now_ms = now * 1000.0
        more = self._drift * max(0.0, now_ms - self._at[i] - REANCHOR_MS)
        high, low = self._high[i] + more, self._low[i] - more
        self._anchor(i, lo, hi, now_ms)
        if low <= hi and lo <= high:
            return  # in step after all
        shift = lo - high if lo > high else hi - low
        self.out_until[i] = now + self.quarantine()
        self.anyone_out = True
        self.on_change()
        self.on_step(i, shift / 1000.0)

    def counts(self, i: int) -> bool:
        """Whether master ``i``'s replies count toward a quorum now."""
        if not self.anyone_out:
            return True  # the usual case, checked cheaply
        now = self._clock()
        if max(self.out_until) <= now:
            self.anyone_out = False
            self.on_change()
        return self.out_until[i] <= now

    def counting_from(self, needed: int) -> float:
        """When (on the clock) ``needed`` masters count, as far as known: a time past
        (``-inf`` if none was ever counted out) when they count now."""
        return sorted(self.out_until)[needed - 1]

    def out_count(self) -> int:
        """How many masters are counted out now."""
        now = self._clock()
        return sum(1 for until in self.out_until if until > now)
