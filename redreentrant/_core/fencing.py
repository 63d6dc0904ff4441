"""Fencing tokens: which token a grant's counter replies prove (no I/O).

Each master keeps a counter per lock (``lua/fence.lua``). A grant steps the counter on
every master where it was granted, in the same round as the acquire; the token is the
largest of those counters, written back (``counter = max(counter, token)``) to every
master, and handed out only once a quorum acknowledged the write-back within the
lease's validity. A later grant's quorum meets that write-back quorum in at least one
master, whose counter then steps past the token: tokens grow.

A counter that is absent on a master (it restarted without its data, was flushed, the
name is new to it, or it idled past :data:`FENCE_TTL`) is *fresh*: it stands for the
master's clock in microseconds. Tokens start from such clocks, so a fresh counter
exceeds the tokens of every history the master forgot as long as the masters' clocks
do not go back and agree within the quarantine. This is the quarantine's rule (see
:mod:`.clockwatch`): a master that forgot does not vote, nor does its counter count,
until its memory is older than the longest lease; then its clock does. So with the
quarantine on, the token is the largest of the granting masters' counters, kept or
fresh. Without it (``quarantine=0``), a fresh counter proves nothing unless no master
knows a counter at all: a token is then handed out only when a quorum of the granting
masters kept theirs (any such quorum meets every earlier write-back quorum in a master
that kept its counter), and when more counters were lost than a quorum tolerates while
others kept theirs, no token can be proven larger than the last: the acquire is
refused with :class:`FencingError`. Either way the write-back then seeds the fresh
ones.

Counters and tokens are integers from 0 to :data:`MAX_TOKEN` (``2**63 - 1``, the range
of Redis's ``INCR``), exact at any size: the scripts reply them as decimal strings and
compare them as such. A counter at the maximum cannot step: a grant that would step it
is refused with :class:`FencingError` too (no token larger than the last exists).
"""

from __future__ import annotations

from collections.abc import Sequence

from .effects import Reply
from .errors import FencingError
from .quorum import Quorum
from .replies import counter_of, first_granted

#: how long a lock's fencing counters outlive its last grant (seconds): long, so that
#: counters do not pile up for every name ever locked, yet outlive any pause
FENCE_TTL = 30 * 24 * 3600.0
FENCE_TTL_MS = int(FENCE_TTL * 1000)

#: the largest fencing counter and token (a signed 64-bit integer, Redis's ``INCR``)
MAX_TOKEN = 2**63 - 1


def check_token(value: object, where: str) -> int:
    """``value`` if it is a token in the counters' range (an ``int`` from 0 to
    :data:`MAX_TOKEN`), else :class:`ValueError` naming ``where`` it was given."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKEN:
        raise ValueError(
            f"{where}: a fencing token must be an int from 0 to 2**63-1 ({MAX_TOKEN}),"
            f" not {value!r}"
        )
    return value


def kept_counter(replies: Sequence[Reply]) -> bool:
    """A master's replies (acquire, then each ``fence next``) granted with kept
    counters: the vote of a fenced acquire round, which may end once a quorum gave one."""
    if len(replies) < 2 or not first_granted(replies):
        return False
    counters = [counter_of(r) for r in replies[1:]]
    return all(c is not None and c.held and not c.fresh for c in counters)


def token_of(
    q: Quorum,
    name: str,
    granted: Sequence[int],
    replies: Sequence[Sequence[Reply]],
    call: int = 1,
) -> int | None:
    """The token a fenced grant on the masters ``granted`` proves, from each master's
    ``fence next`` reply (its call number ``call``); None when this round cannot tell (too few
    granting masters kept their counters, but no more were lost than a quorum
    tolerates: another round may). Raises :class:`FencingError` when the counters were
    lost on too many masters to prove any token."""
    counters = [
        counter_of(per_master[call]) if len(per_master) > call else None for per_master in replies
    ]
    if full := [q.masters[i] for i in granted if (c := counters[i]) is not None and c.full]:
        raise FencingError(
            f"lock {name!r}: its fencing counter is at its maximum, 2**63-1 ({MAX_TOKEN}),"
            f" on {', '.join(full)}: no larger token exists, so none is handed out"
            " (nothing is held). Its tokens are spent: use another lock name."
        )
    kept = [c.value for i in granted if (c := counters[i]) is not None and c.held and not c.fresh]
    if len(kept) >= q.needed:
        return max(kept)
    known = [c for c in counters if c is not None]
    if q.watch.memory_ms > 0 or (known and not any(c.fresh is False for c in known)):
        # Quarantined masters are not granting: the counters and clocks of the others.
        # (Without a quarantine, only where no master knows a counter: a first start.)
        clocks = [c.value for i in granted if (c := counters[i]) is not None and c.held]
        return max(clocks) if len(clocks) >= q.needed else None
    lost = [q.masters[i] for i, c in enumerate(counters) if c is not None and c.fresh]
    silent = [q.masters[i] for i, c in enumerate(counters) if c is None]
    if lost and len(lost) + len(silent) > q.tolerated:
        # No quorum of kept counters can answer, this round or the next.
        also = f", and {len(silent)} did not answer ({', '.join(silent)})" if silent else ""
        raise FencingError(
            f"lock {name!r}: its fencing counter was lost on {len(lost)} of {q.size}"
            f" masters ({', '.join(lost)}){also}, while others kept theirs: fewer than a"
            f" quorum ({q.needed}) can prove a token larger than the last one handed"
            " out, so none is (nothing is held). To resume, raise the counters above the"
            " largest token the protected resource accepted: lock.raise_fence(TOKEN),"
            " or `redreentrant fence NAME --at-least TOKEN`; if it is not known, past"
            " every counter and clock of the masters: lock.raise_fence(lock.fence_floor()),"
            " or `redreentrant fence NAME` (`--kind` rw, fair or election for those locks)."
        )
    return None


def floor_of(q: Quorum, name: str, replies: Sequence[Sequence[Reply]]) -> int:
    """What ``name``'s counters must be raised to for its next tokens to be larger than
    every token handed out, when no such token is known, from each master's reply to
    :meth:`~.kinds.LockKind.fence_read`: the largest counter a master kept and, where a
    master has none, its clock in microseconds (as the tokens of a name no master knows
    start).

    Every token was written back to a quorum, which meets the quorum read here in a
    master that either kept a counter at least as large, or lost it since: its clock is
    then past the token, under the assumption the tokens of a name no master knows rest
    on (clocks that do not go back, fewer grants than microseconds). Raises
    :class:`~.errors.QuorumUnavailableError` when fewer than a quorum replied."""
    counters = [counter_of(r[0]) for r in replies]
    failed = {
        i: r[0] if isinstance(r[0], BaseException) else RuntimeError(f"odd reply {r[0]!r}")
        for i, (r, c) in enumerate(zip(replies, counters, strict=True))
        if c is None
    }
    if len(failed) > q.tolerated:
        raise q.unavailable(f"read the fencing counter of {name!r}", failed)
    return max(c.value for c in counters if c is not None)
