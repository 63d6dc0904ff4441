"""Each master's clock, watched against this process's monotonic clock (no I/O).

A master measures leases on its own clock: one whose clock jumps forward (or runs
far fast) expires the holds it keeps early, and a rival could take the lock there
while its holder's validity runs. Every try's and every renewal's reply carries the
server's time (ms): each one bounds the master's *offset*, its clock less this
process's monotonic clock, to an interval (the reply came between the round's start
and its end). Offsets stay put but for the drift the model allows
(``drift_factor`` of the time passed, plus a few ms); an observation out of that
range means the master's clock stepped (or runs far off rate). Such a master is
*counted out* for the quarantine (the longest lease the manager hands out: by then
every hold it kept when its clock moved has ended anyway): its grants, renewals and
releases do not count toward a quorum, and the step is reported.

A master is judged against what this process saw of it before: a step that happened
before the process's first round with that master cannot be seen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

#: ms an offset may move between two observations besides the drift allowance: the
#: server's time in whole ms, and the drift allowance's own fixed part
SLACK_MS = 3.0


class ClockWatch:
    """What is known of each master's clock, and which masters are counted out, on the
    monotonic ``clock``.

    ``quarantine()`` gives how long (seconds) a master whose clock moved is counted
    out; ``on_step(master, seconds)`` is told of each step seen (seconds: how far the
    clock moved beyond what drift allows, negative for a step back)."""

    __slots__ = (
        "_at", "_clock", "_drift", "_hi", "_lo", "anyone_out", "on_step", "out_until", "quarantine",
    )  # fmt: skip

    def __init__(
        self,
        size: int,
        drift_factor: float,
        clock: Callable[[], float],
        quarantine: Callable[[], float] = lambda: 0.0,
    ) -> None:
        #: per master: the interval its offset lies in (ms), as of when (seconds)
        self._lo = [-math.inf] * size
        self._hi = [math.inf] * size
        self._at = [0.0] * size
        self._drift = drift_factor
        self._clock = clock
        #: how long (seconds) a master whose clock moved is counted out
        self.quarantine = quarantine
        #: per master: until when (monotonic seconds) it is counted out
        self.out_until = [-math.inf] * size
        #: whether any master may be counted out now (the usual round checks only this)
        self.anyone_out = False
        self.on_step: Callable[[int, float], None] = lambda master, seconds: None

    def observe(self, replies: Sequence[Sequence[object]], sent: float, received: float) -> None:
        """Note the server times in a round's replies (each master's first reply that
        is a list ending with an integer: a try's or a renewal's), the round having
        gone out at ``sent`` and ended at ``received`` (monotonic seconds)."""
        for i, per_master in enumerate(replies):
            for reply in per_master:
                if isinstance(reply, list):
                    if reply and type(reply[-1]) is int:
                        self._note(i, reply[-1], sent, received)
                    break

    def _note(self, i: int, server_ms: int, sent: float, received: float) -> None:
        # The server read its clock between ``sent`` and ``received``, in whole ms.
        lo = server_ms - received * 1000.0 - 1.0
        hi = server_ms - sent * 1000.0
        allowed = self._drift * (received - self._at[i]) * 1000.0 + SLACK_MS
        old_lo, old_hi = self._lo[i] - allowed, self._hi[i] + allowed
        self._at[i] = received
        if lo <= old_hi and hi >= old_lo:  # in step: the interval narrows
            self._lo[i], self._hi[i] = max(lo, old_lo), min(hi, old_hi)
            return
        self._lo[i], self._hi[i] = lo, hi
        self.out_until[i] = received + self.quarantine()
        self.anyone_out = True
        shift = (lo - old_hi) if lo > old_hi else (hi - old_lo)
        self.on_step(i, shift / 1000.0)

    def counts(self, i: int) -> bool:
        """Whether master ``i``'s replies count toward a quorum now."""
        if not self.anyone_out:
            return True  # the usual case, checked cheaply
        now = self._clock()
        if max(self.out_until) <= now:
            self.anyone_out = False
        return self.out_until[i] <= now
