"""Turns: how long one manager may keep a contended lock (no I/O).

Under contention the cheapest next holder is the owner that just released: it is
running, while a waiter of another manager must first be woken, and its process
scheduled. Waking that waiter at every release wastes its wake-up whenever the
releasing owner comes straight back, and handing it the lock at every release makes
every turn wait for a process to be scheduled. So a manager that took a contended
lock keeps it for a *turn*:

- while its turn is younger than :data:`TENURE`, a release that would wake a waiter
  frees the lock but *defers* the wake-up (``lua/release.lua``): if an owner of the same
  manager takes the lock again within :data:`GRACE`, the turn goes on; otherwise the
  manager sends the wake-up itself once :data:`GRACE` passed;
- once the turn is that old, the release wakes the next waiter, and the releasing
  owner coming straight back must not beat it to the lock:

  - on one master the lock is *reserved* for that waiter for :data:`RESERVE_MS`
    (``lua/acquire.lua``), or handed over to it if it is an owner of the same manager
    (see :func:`.rounds.release_steps`);
  - on several masters, which could reserve it for different waiters and split the
    vote, the releasing owner's next acquire of the lock (within :data:`COURTESY_MS`)
    makes a *polite* first try (:meth:`Turns.polite`, ``lua/acquire.lua``): the masters
    refuse it, although the lock is free, while another owner is registered there, as
    the waiter woken is until it takes the lock. The releasing owner then registers
    behind the others, and the woken waiter goes first however long it takes to come
    (a thread that waits for the interpreter, a process to be scheduled), up to
    :data:`COURTESY_MS`: a refused polite try is told to wait no longer than that, so a
    woken waiter that never comes holds the free lock up that long at most. The same
    holds when the turn ended with a deferred wake-up sent by the manager (the owner
    did not come back within :data:`GRACE`): the owner whose release deferred it is
    polite once it was sent, unless an owner of the manager took the lock meanwhile.

The threads (or tasks) of one manager thus also take turns of :data:`TENURE`: a thread
that hands the lock to another costs a thread switch, which is dearer than the round
trips it saves.

So waiters of other managers wait about one turn per manager ahead of them, and a lock
is never left free with waiters asleep for more than :data:`GRACE` (plus a round trip)
while its manager lives: the flavours send the deferred wake-ups also when the program
ends without closing the manager. If the process dies within the grace, its waiters
wait as they would for a holder that died, until their registration or wait ends.

:class:`Turns` is the per-manager bookkeeping; the flavour's timer sends the deferred
wake-ups (:meth:`Turns.due`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import NamedTuple

from .kinds import LockKind
from .quorum import Clock

#: how long (seconds) a manager's turn on a contended lock lasts at least
TENURE = 0.01

#: how long (seconds) a deferred wake-up waits for an owner of the same manager to
#: take the lock again: one default switch interval of the interpreter (5 ms), which a
#: thread coming back from a release may wait for the GIL when other threads run
GRACE = 0.005

#: how long (ms) a lock stays reserved for the waiter a release woke
RESERVE_MS = 50

#: several masters: how long (ms) an owner whose release ended its manager's turn and
#: woke a waiter lets that waiter go first: its next acquire within that time is polite,
#: and a refused polite try waits that long at most before it tries as usual. Long
#: enough for a woken thread or process of a loaded host to come (it costs nothing when
#: the waiter comes: the polite owner waits behind it anyway)
COURTESY_MS = 250

#: how many locks' turns a manager keeps (a hold freed by the watchdog, its owner
#: gone, never tells its turn's end: then it starts afresh)
MAX_TURNS = 4096


class Due(NamedTuple):
    """A deferred wake-up to send now: the lock's kind and name."""

    kind: LockKind
    name: str


class Turns:
    """One manager's turns on contended locks (see the module docstring).

    Safe to call from several threads: every method that changes it holds ``guard``
    (a lock the flavour makes).
    """

    def __init__(self, clock: Clock, guard: AbstractContextManager[object]) -> None:
        self._clock = clock
        self._lock = guard
        #: when this manager's turn on a lock began, for the locks it holds or
        #: released with a wake-up deferred
        self._since: dict[tuple[LockKind, str], float] = {}
        #: the deferred wake-ups: lock -> when to send it
        self._pending: dict[tuple[LockKind, str], float] = {}
        #: several masters: the owner whose release deferred a pending wake-up, which
        #: is courteous once the wake-up is sent
        self._deferrers: dict[tuple[LockKind, str], str] = {}
        #: several masters: (lock, owner) -> until when that owner's next acquire is polite
        self._courtesy: dict[tuple[LockKind, str, str], float] = {}

    def granted(self, kind: LockKind, name: str) -> None:
        """An owner of this manager took ``name``: its turn goes on if the manager
        released it with a wake-up deferred (that wake-up is then not sent), else a
        turn begins."""
        key = (kind, name)
        with self._lock:
            self._deferrers.pop(key, None)
            if self._courtesy:
                # Its owners hold it now: whatever courtesy was due is moot (one of them
                # may have come back while its deferred wake-up was being sent).
                self._courtesy = {c: t for c, t in self._courtesy.items() if c[:2] != key}
            if self._pending.pop(key, None) is None or key not in self._since:
                if len(self._since) >= MAX_TURNS:
                    self._since = {k: self._since[k] for k in self._pending if k in self._since}
                self._since[key] = self._clock()

    def may_defer(self, kind: LockKind, name: str) -> bool:
        """Whether a release of ``name`` now may defer its wake-up: the turn is young."""
        since = self._since.get((kind, name))
        return since is not None and self._clock() - since < TENURE

    def released(
        self, kind: LockKind, name: str, deferred: bool, courteous: str | None = None
    ) -> float | None:
        """A final release of ``name`` went through; returns when to send the wake-up
        it ``deferred`` (None if it did not: its turn is over). The owner
        ``courteous``, if given, lets the waiter woken go first (see :meth:`polite`):
        at once when the release woke one, else once the deferred wake-up is sent."""
        key = (kind, name)
        with self._lock:
            if not deferred:
                self._since.pop(key, None)
                self._pending.pop(key, None)
                self._deferrers.pop(key, None)
                if courteous is not None:
                    self._be_courteous(kind, name, courteous, self._clock())
                return None
            due = self._clock() + GRACE
            self._pending[key] = due
            if courteous is not None:
                self._deferrers[key] = courteous
            else:
                self._deferrers.pop(key, None)
            return due

    def _be_courteous(self, kind: LockKind, name: str, owner: str, now: float) -> None:
        if len(self._courtesy) >= MAX_TURNS:
            self._courtesy = {k: t for k, t in self._courtesy.items() if t > now}
        self._courtesy[(kind, name, owner)] = now + COURTESY_MS / 1000

    def polite(self, kind: LockKind, name: str, owner: str) -> int:
        """Whether ``owner``'s acquire of ``name`` now makes a polite first try (its turn
        ended with a wake-up, and the woken waiter goes first): the try's ``polite_ms``
        (:data:`COURTESY_MS`), or 0. Once only."""
        if not self._courtesy:
            return 0
        with self._lock:
            until = self._courtesy.pop((kind, name, owner), None)
        return COURTESY_MS if until is not None and until > self._clock() else 0

    def due(self) -> tuple[list[Due], float | None]:
        """The deferred wake-ups to send now (their turns are over), and when the next
        one is due (None: none is pending)."""
        now = self._clock()
        out: list[Due] = []
        later: float | None = None
        with self._lock:
            for key, at in list(self._pending.items()):
                if at <= now:
                    del self._pending[key]
                    self._since.pop(key, None)
                    owner = self._deferrers.pop(key, None)
                    if owner is not None:
                        self._be_courteous(*key, owner, now)
                    out.append(Due(*key))
                elif later is None or at < later:
                    later = at
        return out, later

    def flush(self) -> list[Due]:
        """Every pending wake-up, to send now (the manager closes)."""
        with self._lock:
            out = [Due(*key) for key in self._pending]
            self._pending.clear()
            self._deferrers.clear()
            self._since.clear()
        return out
