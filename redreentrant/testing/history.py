"""Histories of lock operations recorded by many clients, and a checker for them.

A fault test runs clients (processes, threads) against real masters while it injects
faults, and proves mutual exclusion afterwards from what the clients saw. Each client
records :class:`Event` s with a :class:`Recorder`; :func:`load` merges the files and
:func:`check` derives the holds and judges them.

**One clock.** Every ``t`` (and ``valid_until``) is ``time.monotonic_ns()`` of one host:
the clients of a test run on one machine, and the monotonic clock is shared by all of
its processes, so events of different processes compare directly. Histories from
several hosts cannot be checked this way.

**What a client records.** An operation is an ``invoke`` event taken just before the
call and an ``ok`` or ``fail`` event taken just after it returns. Because the call
happened between the two, a hold taken from the acquire's ``ok`` to the release's
``invoke`` lies inside the time the lock service really granted it: two such holds that
overlap are a real violation, never an artefact of recording.

The events, by ``op`` (others are kept and ignored by the checker):

``acquire``
    ``ok`` starts a hold (or a nested level of one), with ``owner``, ``token`` (fencing,
    ``None`` when fencing is off) and ``valid_until`` (the validity end the lock reported).
``renew``
    ``ok`` with a later ``valid_until`` extends the open hold, if it came before the
    current validity end (a lease that lapsed is not revived by a late renewal).
``release``
    ``invoke`` ends the hold once its level reaches 0; a ``fail`` (e.g. ``LockLostError``)
    ends the hold at its ``invoke`` whatever the level. A ``fail`` may name the
    exception's class in ``error``: a ``"LockLostError"`` not preceded or followed by a
    loss report is judged (``gone-while-valid``, see :func:`check`).
``lost``
    ``ok`` with ``owner``: the library told that owner its hold was lost (``lock.lost``
    set): it ends the owner's open hold of the lock in that mode, whichever client
    (thread) recorded it, and only the hold of ``token`` when one is given. Without an
    ``owner`` (an ``on_lost`` report that does not know it) it ends nothing.
``write``
    A write to a fenced resource: ``ok`` with ``token``, ``accepted`` and, when the
    resource reports it, ``seq`` (the resource's own order of writes). The resource is
    named by ``lock``: one fenced resource per lock name.
``incr``
    An increment of a shared counter done under the lock: read ``v``, write ``v + 1``;
    ``ok`` with ``value = v + 1``. The counter is named by ``lock``.

Any ``fail`` may carry ``error``, the class name of the exception (kept for figures;
only a release's is judged).
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import TextIO, TypeVar

from typing_extensions import TypedDict, Unpack

PHASES = ("invoke", "ok", "fail")
#: "x" exclusive (plain lock), "r"/"w" the two sides of a read/write lock, "fair" the
#: fair (FIFO) exclusive lock, "u" the upgradeable side of a read/write lock (see
#: :func:`upgradeable_violations`), "sem" a permit of a semaphore (see ``permits``),
#: "lead" the leadership of an election, whose token is the term (see
#: :func:`leadership_violations`).
MODES = ("x", "r", "w", "fair", "u", "sem", "lead")
#: modes whose holds exclude every other owner's hold of the same family
EXCLUSIVE_MODES = frozenset({"x", "w", "fair", "lead"})
KINDS = (
    "overlap",
    "reader-writer",
    "fifo",
    "stale-write",
    "lost-update",
    "upgrade-gap",
    "over-capacity",
    "term-order",
    "token-order",
    "late-loss",
    "gone-while-valid",
)

#: default of :func:`check`'s ``fifo_slack_ns``: 50 ms, a few quorum rounds on loopback
#: plus thread scheduling; raise it when a test slows the masters down.
DEFAULT_FIFO_SLACK_NS = 50_000_000
#: default of :func:`check`'s ``loss_slack_ns``: 50 ms. The library reports a loss at
#: least 100 ms before the validity ends; the slack absorbs the recording's own delay.
DEFAULT_LOSS_SLACK_NS = 50_000_000


def family(mode: str) -> str:
    """The lock family of a mode: a name is one lock per family, so an "x" lock and a
    "fair" lock of the same name never exclude each other (nor an election, "lead", of
    that name), and "r"/"w"/"u" share "rw"."""
    return "rw" if mode in ("r", "w", "u") else mode


# -- events -------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One thing one client saw, at ``t`` (``time.monotonic_ns()``).

    ``client`` names who did it (e.g. ``"p3/t1"``: process 3, thread 1); ``owner`` is the
    lock's owner id when known, else the client stands for the owner (see :attr:`who`).
    Only JSON types: :meth:`to_json` and :meth:`from_json` round-trip exactly.
    """

    client: str
    op: str
    phase: str
    t: int
    lock: str
    mode: str = "x"
    owner: str | None = None
    token: int | None = None
    valid_until: int | None = None
    value: int | None = None
    accepted: bool | None = None
    seq: int | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        # A typo here would silently make the checker ignore events: refuse it early.
        if self.phase not in PHASES:
            raise ValueError(f"phase {self.phase!r} is not one of {PHASES}")
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {MODES}")
        if not isinstance(self.t, int) or isinstance(self.t, bool):
            raise TypeError(f"t must be an int (monotonic ns), got {self.t!r}")

    @property
    def who(self) -> str:
        """The owner id, or the client when no owner was recorded."""
        return self.client if self.owner is None else self.owner

    def to_json(self) -> str:
        """One line of JSON (no newline)."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> Event:
        """The event of one JSON line; unknown keys are an error (ValueError)."""
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError(f"not an event: {line!r}")
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown event fields {sorted(unknown)}: {line!r}")
        return cls(**data)


class Fields(TypedDict, total=False):
    """The optional fields of an event, as keyword arguments of the recorder."""

    owner: str | None
    token: int | None
    valid_until: int | None
    value: int | None
    accepted: bool | None
    seq: int | None
    error: str | None


# -- recording ----------------------------------------------------------------------


class _Sink:
    """One open history file, shared by a recorder and its children."""

    def __init__(self, path: Path, clock: Callable[[], int]) -> None:
        _cut_torn_tail(path)
        self.path = path
        self.clock = clock
        self.lock = threading.Lock()
        self.file: TextIO = path.open("a", encoding="utf-8", newline="\n")

    def write(self, make: Callable[..., Event]) -> Event:
        """Record ``make(t=now)``."""
        # The time is read under the lock so that each file is in time order: a reader
        # of one file (or a human) sees the order the events were recorded in.
        with self.lock:
            if self.file.closed:
                raise ValueError(f"recorder for {self.path} is closed")
            event = make(t=self.clock())
            # One write and a flush per line: a process killed with SIGKILL loses at
            # most the line it was writing (which load() then skips).
            self.file.write(event.to_json() + "\n")
            self.file.flush()
            return event

    def close(self) -> None:
        with self.lock:
            self.file.close()


def _cut_torn_tail(path: Path) -> None:
    """Cut a torn last line left by a killed writer, so that a process reopening its
    file does not glue its first event onto the fragment."""
    try:
        with path.open("r+b") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)
    except FileNotFoundError:
        pass


class Outcome:
    """The fields of a :meth:`Recorder.span` 's outcome event, set inside its block."""

    def __init__(self) -> None:
        self.fields: Fields = {}
        self.failed = False

    def update(self, **more: Unpack[Fields]) -> None:
        """Add fields to the outcome event (``ok``, or ``fail`` after :meth:`fail`)."""
        self.fields.update(more)

    def fail(self, **more: Unpack[Fields]) -> None:
        """Record the outcome as ``fail`` though no exception was raised (e.g. an
        ``acquire(blocking=False)`` that returned False)."""
        self.failed = True
        self.fields.update(more)


class Recorder:
    """Appends one JSON line per event to ``path``, for client ``client``.

    Every process records into its own file (opened in append mode, flushed after every
    line); the threads of a process share it through :meth:`child` recorders, which
    carry their own client name. Recording is thread-safe. A recorder is a context
    manager that closes the file; children share the parent's file and close nothing.

    ``clock`` gives ``t``; it must be ``time.monotonic_ns`` (the default) for events of
    several processes to compare.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        client: str,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.client = client
        self._sink = _Sink(Path(path), clock)
        self._owns_sink = True

    @property
    def path(self) -> Path:
        return self._sink.path

    def child(self, name: str) -> Recorder:
        """A recorder into the same file for client ``"<client>/<name>"`` (a thread)."""
        view = copy.copy(self)
        view.client = f"{self.client}/{name}"
        view._owns_sink = False  # noqa: SLF001  # a copy of itself: its own privates
        return view

    def record(self, op: str, phase: str, lock: str, mode: str = "x", **f: Unpack[Fields]) -> Event:
        """Record an event now; returns it."""
        make = partial(Event, client=self.client, op=op, phase=phase, lock=lock, mode=mode, **f)
        return self._sink.write(make)

    def invoke(self, op: str, lock: str, mode: str = "x", **f: Unpack[Fields]) -> Event:
        """Record that ``op`` is about to be called."""
        return self.record(op, "invoke", lock, mode, **f)

    def ok(self, op: str, lock: str, mode: str = "x", **f: Unpack[Fields]) -> Event:
        """Record that ``op`` returned successfully."""
        return self.record(op, "ok", lock, mode, **f)

    def fail(self, op: str, lock: str, mode: str = "x", **f: Unpack[Fields]) -> Event:
        """Record that ``op`` failed (raised, or returned a refusal)."""
        return self.record(op, "fail", lock, mode, **f)

    @contextmanager
    def span(self, op: str, lock: str, mode: str = "x", **f: Unpack[Fields]) -> Iterator[Outcome]:
        """Record ``invoke`` on entry, then ``ok`` on a normal exit or ``fail`` if the
        block raised (the exception propagates) or called :meth:`Outcome.fail`.

        The fields given here go into every event of the span; those set on the yielded
        :class:`Outcome` go into the outcome event only (a token, a validity end)::

            with rec.span("acquire", "L", owner=me) as out:
                lock.acquire()
                out.update(valid_until=time.monotonic_ns() + int(lock.remaining() * 1e9))
        """
        self.invoke(op, lock, mode, **f)
        outcome = Outcome()
        failed = True  # unless the block ends normally
        try:
            yield outcome
            failed = outcome.failed
        finally:
            merged: Fields = {**f, **outcome.fields}
            (self.fail if failed else self.ok)(op, lock, mode, **merged)

    def close(self) -> None:
        """Close the file (a child's close does nothing: its parent owns the file)."""
        if self._owns_sink:
            self._sink.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Event]:
    """The events of all ``paths`` (or of one path) merged and sorted by ``t`` (stable:
    ties keep file and line order).

    A file's last line that does not parse is skipped: its writer was killed while
    writing it. A bad line anywhere else raises ValueError: that is not a kill's damage
    and the history cannot be trusted.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]  # one file, not an iterable of its name's characters
    events: list[Event] = []
    for path in paths:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            try:
                events.append(Event.from_json(line))
            except (ValueError, TypeError) as error:
                if number == len(lines):
                    break
                raise ValueError(f"{path}:{number}: bad history line: {error}") from error
    events.sort(key=lambda e: e.t)
    return events


# -- holds --------------------------------------------------------------------------


@dataclass(frozen=True)
class Hold:
    """The time ``[start, end)`` a client held ``lock`` in ``mode``, as it saw it.

    ``ended_by`` is ``"release"`` (its last release's invoke, or a failed release's),
    ``"lost"`` (the owner was told it lost the hold), ``"validity"`` (the reported
    ``valid_until`` came first, or it was never released) or ``"end-of-history"``
    (never released, no ``valid_until``).
    """

    client: str
    lock: str
    mode: str
    owner: str
    token: int | None
    start: int
    end: int
    ended_by: str
    valid_until: int | None

    @property
    def family(self) -> str:
        return family(self.mode)

    def overlaps(self, other: Hold) -> bool:
        """Whether the two half-open intervals share an instant (touching is not)."""
        return self.start < other.end and other.start < self.end

    def describe(self, origin: int) -> str:
        label = "term" if self.mode == "lead" else "token"
        token = "" if self.token is None else f", {label} {self.token}"
        return (
            f"{self.client} (owner {self.owner}{token}) held {self.mode} "
            f"[{_at(self.start, origin)}, {_at(self.end, origin)}) ended by {self.ended_by}"
        )


@dataclass
class _Open:
    """A hold being built: its nesting level and what ends it."""

    client: str
    lock: str
    mode: str
    owner: str
    token: int | None
    start: int
    valid_until: int | None
    level: int = 1
    last_release_invoke: int | None = None

    def close(self, release: int | None, reason: str) -> Hold:
        """The hold, ended at ``release`` (None: never released) or at its validity end,
        whichever comes first; ``reason`` names what ``release`` is."""
        candidates = ((release, reason), (self.valid_until, "validity"))
        ends = [(t, why) for t, why in candidates if t is not None]
        end, ended_by = min(ends, key=lambda e: e[0])  # a tie goes to ``reason``
        return Hold(
            client=self.client,
            lock=self.lock,
            mode=self.mode,
            owner=self.owner,
            token=self.token,
            start=self.start,
            end=max(self.start, end),
            ended_by=ended_by,
            valid_until=self.valid_until,
        )


@dataclass(frozen=True)
class _Attempt:
    """One acquire from invoke to outcome (``ok_t`` None when it failed)."""

    client: str
    lock: str
    mode: str
    owner: str
    invoke_t: int
    ok_t: int | None
    nested: bool


@dataclass
class _Scan:
    holds: list[Hold] = field(default_factory=list)
    attempts: list[_Attempt] = field(default_factory=list)
    #: the invoke time of each write's ok event (by identity), when one was recorded
    write_invokes: dict[int, int] = field(default_factory=dict)


_Key = tuple[str, str, str, str]  # client, lock, mode, owner


def _scan(events: list[Event], end: int) -> _Scan:
    """Derive holds, acquire attempts and write invokes from time-ordered events."""
    out = _Scan()
    open_: dict[_Key, _Open] = {}
    waiting: dict[tuple[str, str, str], Event] = {}  # acquire invokes awaiting an outcome
    writing: dict[tuple[str, str], Event] = {}  # write invokes awaiting an outcome
    for e in events:
        key: _Key = (e.client, e.lock, e.mode, e.who)
        if e.op == "acquire":
            if e.phase == "invoke":
                waiting[(e.client, e.lock, e.mode)] = e
            else:
                start = waiting.pop((e.client, e.lock, e.mode), None)
                if start is not None:
                    out.attempts.append(
                        _Attempt(
                            e.client,
                            e.lock,
                            e.mode,
                            e.who,
                            start.t,
                            e.t if e.phase == "ok" else None,
                            # A re-entry never queues: judge only first-level acquires.
                            nested=any(k[:3] == key[:3] for k in open_),
                        )
                    )
            if e.phase == "ok":
                _acquired(open_, out.holds, key, e)
        elif e.op == "renew" and e.phase == "ok":
            held = open_.get(key)
            # A renewal after the lease ran out does not revive it: someone else may
            # have been granted the lock in between.
            if (
                held is not None
                and e.valid_until is not None
                and (held.valid_until is None or e.t < held.valid_until)
            ):
                held.valid_until = e.valid_until
        elif e.op == "release":
            held = open_.get(key)
            if held is None:
                continue
            if e.phase == "invoke":
                held.level -= 1
                held.last_release_invoke = e.t
                if held.level <= 0:
                    out.holds.append(open_.pop(key).close(e.t, "release"))
            elif e.phase == "fail":
                # A failed release (the lease was lost, or never owned) means the
                # client holds nothing from its invoke on, whatever the level.
                release_t = e.t if held.last_release_invoke is None else held.last_release_invoke
                out.holds.append(open_.pop(key).close(release_t, "release"))
        elif e.op == "lost" and e.phase == "ok" and e.owner is not None:
            # Told lost: from here the owner holds nothing (its later release fails).
            for k, held in list(open_.items()):
                if k[1:] == (e.lock, e.mode, e.owner) and e.token in (None, held.token):
                    out.holds.append(open_.pop(k).close(e.t, "lost"))
        elif e.op == "write":
            if e.phase == "invoke":
                writing[(e.client, e.lock)] = e
            else:
                started = writing.pop((e.client, e.lock), None)
                if started is not None:
                    out.write_invokes[id(e)] = started.t
    for held in open_.values():
        # Never released (a killed client): the hold lasts its validity, else it lasts
        # to the end of the history.
        last = None if held.valid_until is not None else end
        out.holds.append(held.close(last, "end-of-history"))
    out.holds.sort(key=lambda h: (h.start, h.end))
    return out


def _acquired(open_: dict[_Key, _Open], holds: list[Hold], key: _Key, e: Event) -> None:
    held = open_.get(key)
    if held is not None and held.valid_until is not None and e.t >= held.valid_until:
        # A re-entry granted after the hold's validity ended: the old hold ended at its
        # validity; the client holds anew from here, keeping its level count so that
        # its releases still pair up.
        holds.append(held.close(None, "validity"))
        open_[key] = _Open(
            e.client, e.lock, e.mode, e.who, e.token, e.t, e.valid_until, held.level + 1
        )
    elif held is not None:
        # A nested level: the same hold, its lease refreshed by the re-entry.
        held.level += 1
        if e.valid_until is not None:
            held.valid_until = e.valid_until
        if held.token is None:
            held.token = e.token
    else:
        open_[key] = _Open(e.client, e.lock, e.mode, e.who, e.token, e.t, e.valid_until)


def derive_holds(events: Iterable[Event], *, end: int | None = None) -> list[Hold]:
    """The holds of ``events`` (see the module docstring), sorted by start.

    ``end`` is the end of the history (default: the last event's ``t``): a hold never
    released and without ``valid_until`` lasts until then.
    """
    ordered = sorted(events, key=lambda e: e.t)
    last = ordered[-1].t if ordered else 0
    return _scan(ordered, last if end is None else end).holds


# -- the checker --------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    """One broken rule: ``kind`` (one of :data:`KINDS`), the ``lock`` (or resource,
    counter), the time ``t`` it happened (monotonic ns) and a readable ``detail``; for
    ``gone-while-valid``, ``since``: when the hold began."""

    kind: str
    lock: str
    t: int
    detail: str
    since: int | None = None


@dataclass
class Report:
    """What :func:`check` found: the ``violations`` (sorted by time), the derived
    ``holds``, and the history's span ``[origin, end]`` (details give times relative
    to ``origin``, in ms)."""

    violations: list[Violation]
    holds: list[Hold]
    events: int
    origin: int
    end: int

    @property
    def ok(self) -> bool:
        return not self.violations

    def kinds(self) -> set[str]:
        """The kinds of violation found."""
        return {v.kind for v in self.violations}

    def summary(self) -> str:
        """One line: the history's size and the violations by kind."""
        size = f"{self.events} events, {len(self.holds)} holds"
        if self.ok:
            return f"history of {size}: no violation"
        by_kind = Counter(v.kind for v in self.violations)
        counts = ", ".join(f"{kind}: {by_kind[kind]}" for kind in KINDS if by_kind[kind])
        return f"history of {size}: {len(self.violations)} violation(s) ({counts})"

    def format(self, limit: int = 20) -> str:
        """The summary and the first ``limit`` violations, one per line (for asserts)."""
        lines = [self.summary()]
        lines += [f"  {v.kind} on {v.lock!r}: {v.detail}" for v in self.violations[:limit]]
        if len(self.violations) > limit:
            lines.append(f"  ... and {len(self.violations) - limit} more")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _at(t: int, origin: int) -> str:
    return f"+{(t - origin) / 1e6:.3f}ms"


_T = TypeVar("_T")
_K = TypeVar("_K")


def _grouped(items: Iterable[_T], key: Callable[[_T], _K]) -> dict[_K, list[_T]]:
    """``items`` by ``key``, each group in the order of ``items``."""
    groups: dict[_K, list[_T]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return dict(groups)


def _overlapping(holds: list[Hold]) -> Iterator[tuple[Hold, Hold]]:
    """The pairs ``(a, b)`` of ``holds`` by different owners that share an instant, ``a``
    starting first."""
    group = sorted(holds, key=lambda h: h.start)
    for i, a in enumerate(group):
        # Sorted by start: only the holds starting before a's end can overlap it.
        for b in group[i + 1 :]:
            if b.start >= a.end:
                break
            if a.owner != b.owner and a.overlaps(b):
                yield a, b


def check(
    events: Iterable[Event],
    *,
    fifo_slack_ns: int = DEFAULT_FIFO_SLACK_NS,
    final_counter: int | Mapping[str, int] | None = None,
    late_writes: bool = True,
    end: int | None = None,
    permits: int | Mapping[str, int] | None = None,
    token_order: bool = False,
    late_losses: bool = False,
    loss_slack_ns: int = DEFAULT_LOSS_SLACK_NS,
) -> Report:
    """Judge a history; returns a :class:`Report`.

    Holds are derived as in :func:`derive_holds`: from an acquire's ``ok`` to
    ``min(the release invoke that brings the client's level to 0, valid_until)``; a
    nested acquire (same client, lock, mode and owner, level > 0) is a level of the same
    hold; a hold never released ends at ``valid_until``, or at the end of the history
    (``end``, default the last event's ``t``) when that is None. Holds are kept per
    lock family (:func:`family`): "x", "fair" and "rw" of one name are different locks.

    The rules, each a kind of :class:`Violation`:

    ``overlap``
        Two exclusive holds ("x", "w", "fair") of one lock family by different owners
        share an instant. Intervals that merely touch (one ends where the other starts)
        do not overlap.
    ``reader-writer``
        A "w" hold and an "r" hold of one name by different owners overlap (readers
        with readers is fine; an owner may read while it writes).
    ``fifo`` (fair locks only)
        A invoked acquire before B by more than ``fifo_slack_ns``, B invoked while A was
        still waiting (before A's ok), both succeeded, yet B's ok came before A's. The
        slack absorbs the time from an acquire's invoke to its reaching the queue on
        the masters (a round trip and scheduling): arrivals closer than that may be
        queued in either order. Re-entries and acquires that failed are not judged.
    ``stale-write``
        (1) In the resource's order (``seq`` when every write of the resource has one,
        else ``t``), an accepted write whose token is smaller than the largest token
        accepted before it. (2) With ``late_writes``, an accepted write made after its
        writer's hold ended (its invoke time when recorded, else its ``t``, later than
        the end of the writer's hold: the one with its token, else its latest before it)
        while another owner's hold with a larger token had already started: the fenced
        resource should have refused the paused holder's late write. Rule (2) assumes the
        resource learns of the newer token when it is granted; a resource that compares
        only tokens it has been sent accepts such a write until the newer holder's first
        write, so pass ``late_writes=False`` to judge that kind of resource by (1) only.
        Writes without a token or ``accepted`` are not judged.
    ``lost-update``
        Two ``incr`` oks of one counter wrote the same value, or the counter's final value
        (``final_counter``: an int for the only counter of the history, or a mapping from
        counter name to value) differs from its number of ``incr`` oks.
    ``term-order`` (elections only)
        A leadership ("lead" hold) whose term is not larger than the term of one that
        began before it: see :func:`leadership_violations`. The other rules judge
        leaderships as they judge locks: two leaders at one instant are an ``overlap``,
        and a write fenced by a term is a ``stale-write`` when the resource accepted it
        after a write with a larger term (or, with ``late_writes``, after a later leader
        had begun).
    ``token-order`` (with ``token_order``)
        The same rule as ``term-order`` for the fencing tokens of the other exclusive
        holds ("x", "w", "fair"), per lock family: see :func:`token_order_violations`.
    ``late-loss`` (with ``late_losses``)
        A loss reported (a ``lost`` ok with an ``owner``) more than ``loss_slack_ns``
        after the validity end its hold last knew (its acquire's or renewal's
        ``valid_until``): the library promises the report before the validity ends.
        Off by default: a holder paused past its lease (outside the model) is told late.
    ``gone-while-valid``
        A release that failed with ``error="LockLostError"`` before the validity end
        its hold last knew, while no loss of that hold was reported (before or after):
        the hold was gone from a quorum while it was valid, and nobody said so. See
        :func:`loss_violations`.
    """
    ordered = sorted(events, key=lambda e: e.t)
    origin = ordered[0].t if ordered else 0
    last = ordered[-1].t if ordered else 0
    end_t = last if end is None else end
    scan = _scan(ordered, end_t)
    violations: list[Violation] = []
    violations += _exclusion(scan.holds, origin)
    violations += _fifo(scan.attempts, fifo_slack_ns, origin)
    violations += _stale_writes(ordered, scan, late_writes, origin)
    violations += _lost_updates(ordered, final_counter, origin, end_t)
    violations += upgradeable_violations(scan, origin)
    violations += over_capacity(scan.holds, permits, origin)
    violations += leadership_violations(scan.holds, origin)
    if token_order:
        violations += token_order_violations(scan.holds, origin)
    violations += loss_violations(ordered, scan.holds, late_losses, loss_slack_ns, origin)
    violations.sort(key=lambda v: v.t)
    return Report(violations, scan.holds, len(ordered), origin, end_t)


def _exclusion(holds: list[Hold], origin: int) -> list[Violation]:
    found: list[Violation] = []
    for (lock, fam), group in _grouped(holds, lambda h: (h.lock, h.family)).items():
        for a, b in _overlapping(group):
            if a.mode in EXCLUSIVE_MODES and b.mode in EXCLUSIVE_MODES:
                kind = "overlap"
            elif "w" in (a.mode, b.mode):
                kind = "reader-writer"
            else:
                continue  # readers with readers
            shared = min(a.end, b.end) - b.start
            found.append(
                Violation(
                    kind,
                    lock,
                    b.start,
                    f"[{fam}] {a.describe(origin)} and {b.describe(origin)}: "
                    f"both held for {shared / 1e6:.3f}ms",
                )
            )
    return found


def _fifo(attempts: list[_Attempt], slack: int, origin: int) -> list[Violation]:
    found: list[Violation] = []
    fair = [a for a in attempts if a.mode == "fair" and a.ok_t is not None and not a.nested]
    for lock, group in _grouped(fair, lambda a: a.lock).items():
        group.sort(key=lambda a: a.invoke_t)
        for i, a in enumerate(group):
            assert a.ok_t is not None
            for b in group[i + 1 :]:
                assert b.ok_t is not None
                if b.invoke_t >= a.ok_t:
                    break  # b arrived after a was served: they never waited together
                if b.client == a.client or b.invoke_t - a.invoke_t <= slack:
                    continue
                if b.ok_t < a.ok_t:
                    found.append(
                        Violation(
                            "fifo",
                            lock,
                            b.ok_t,
                            f"{a.client} (owner {a.owner}) asked at {_at(a.invoke_t, origin)} "
                            f"and got it at {_at(a.ok_t, origin)}, but {b.client} (owner "
                            f"{b.owner}) asked later at {_at(b.invoke_t, origin)} and got it "
                            f"first at {_at(b.ok_t, origin)} (slack {slack / 1e6:.3f}ms)",
                        )
                    )
    return found


def _stale_writes(
    events: list[Event], scan: _Scan, late_writes: bool, origin: int
) -> list[Violation]:
    found: list[Violation] = []
    resources = _grouped(
        (
            e
            for e in events
            if e.op == "write" and e.phase == "ok" and e.accepted is True and e.token is not None
        ),
        lambda e: e.lock,
    )
    stale: set[int] = set()
    for lock, writes in resources.items():
        if all(w.seq is not None for w in writes):
            writes = sorted(writes, key=lambda w: (w.seq or 0, w.t))
        top: Event | None = None
        for w in writes:
            assert w.token is not None
            if top is not None and top.token is not None and w.token < top.token:
                stale.add(id(w))
                found.append(
                    Violation(
                        "stale-write",
                        lock,
                        w.t,
                        f"{w.client} (owner {w.who}) wrote with token {w.token} at "
                        f"{_at(w.t, origin)}{_seq(w)} and it was accepted after {top.client} "
                        f"(owner {top.who}) wrote with token {top.token} at "
                        f"{_at(top.t, origin)}{_seq(top)}",
                    )
                )
            elif top is None or top.token is None or w.token > top.token:
                top = w
    if not late_writes:
        return found
    for lock, writes in resources.items():
        for w in writes:
            if id(w) in stale:
                continue  # one report per write
            late = _late_write(w, scan, origin)
            if late is not None:
                found.append(Violation("stale-write", lock, w.t, late))
    return found


def _late_write(w: Event, scan: _Scan, origin: int) -> str | None:
    """Why accepted write ``w`` came too late, or None if it did not."""
    assert w.token is not None
    at = scan.write_invokes.get(id(w), w.t)
    mine = [
        h
        for h in scan.holds
        if h.client == w.client and h.lock == w.lock and h.family == family(w.mode)
    ]
    own = [h for h in mine if h.token == w.token] or [h for h in mine if h.start <= at]
    if not own:
        return None  # no hold to judge it by
    hold = own[-1]
    if at <= hold.end:
        return None
    newer = [
        h
        for h in scan.holds
        if h.lock == w.lock
        and h.family == hold.family
        and h.owner != hold.owner
        and h.token is not None
        and h.token > w.token
        and h.start < at
    ]
    if not newer:
        return None
    other = newer[0]
    return (
        f"{w.client} (owner {w.who}) wrote with token {w.token} at {_at(at, origin)}, "
        f"after its hold ended at {_at(hold.end, origin)} ({hold.ended_by}), and it was "
        f"accepted though {other.describe(origin)} had started"
    )


def _seq(e: Event) -> str:
    return "" if e.seq is None else f" (seq {e.seq})"


def _lost_updates(
    events: list[Event],
    final: int | Mapping[str, int] | None,
    origin: int,
    end: int,
) -> list[Violation]:
    found: list[Violation] = []
    counters = _grouped((e for e in events if e.op == "incr" and e.phase == "ok"), lambda e: e.lock)
    for lock, incrs in counters.items():
        by_value = _grouped((e for e in incrs if e.value is not None), lambda e: e.value or 0)
        for value, writers in sorted(by_value.items()):
            if len(writers) > 1:
                who = ", ".join(f"{e.client} at {_at(e.t, origin)}" for e in writers)
                found.append(
                    Violation(
                        "lost-update",
                        lock,
                        writers[1].t,
                        f"value {value} written {len(writers)} times: {who}",
                    )
                )
    if final is None:
        return found
    if isinstance(final, int):
        if len(counters) > 1:
            raise ValueError(
                f"final_counter={final} is ambiguous: the history has counters "
                f"{sorted(counters)}; pass a mapping"
            )
        finals: Mapping[str, int] = {next(iter(counters), ""): final}
    else:
        finals = final
    for lock, value in finals.items():
        count = len(counters.get(lock, []))
        if value != count:
            found.append(
                Violation(
                    "lost-update",
                    lock,
                    end,
                    f"final value {value} after {count} successful increments "
                    f"({count - value} lost)",
                )
            )
    return found


# -- the upgradeable reader -------------------------------------------------------------
#
# Mode "u" is the upgradeable side of a read/write lock: it shares with "r", and the
# "reader-writer" rule of :func:`check` already judges it against other owners' "w"
# holds. An upgrade is recorded as what it is, an acquire of "w" by an owner that holds
# "u" (its downgrade as the release of "w"): the write phase is a "w" hold of that owner.


def upgradeable_violations(scan: _Scan, origin: int) -> list[Violation]:
    """The upgradeable reader's rules (part of :func:`check`):

    ``overlap``
        Two "u" holds of one name by different owners share an instant (one
        upgradeable reader at a time).
    ``upgrade-gap``
        An upgrade (an acquire of "w" invoked while its owner held "u") that succeeded
        after the owner's "u" hold had ended, so the write phase does not follow the
        upgradeable phase; or another owner's "w" hold overlapping the upgrade's wait
        and grant (from its invoke to its ok): a writer came in between.
    """
    found: list[Violation] = []
    ups = _grouped((h for h in scan.holds if h.mode == "u"), lambda h: h.lock)
    for lock, group in ups.items():
        for a, b in _overlapping(group):
            found.append(
                Violation(
                    "overlap",
                    lock,
                    b.start,
                    f"[rw] two upgradeable holds: {a.describe(origin)} and {b.describe(origin)}",
                )
            )
    for at in scan.attempts:
        if at.mode != "w" or at.ok_t is None or at.nested:
            continue
        mine = [
            h
            for h in ups.get(at.lock, [])
            if h.owner == at.owner and h.start <= at.invoke_t < h.end
        ]
        if not mine:
            continue  # not an upgrade: a plain writer
        up = mine[0]
        if up.end < at.ok_t:
            found.append(
                Violation(
                    "upgrade-gap",
                    at.lock,
                    at.ok_t,
                    f"{at.client} (owner {at.owner}) upgraded at {_at(at.ok_t, origin)}, "
                    f"after its upgradeable hold ended: {up.describe(origin)}",
                )
            )
        for h in scan.holds:
            if (
                h.lock == at.lock
                and h.mode == "w"
                and h.owner != at.owner
                and h.start < at.ok_t
                and at.invoke_t < h.end
            ):
                found.append(
                    Violation(
                        "upgrade-gap",
                        at.lock,
                        max(h.start, at.invoke_t),
                        f"{h.describe(origin)} while {at.client} (owner {at.owner}) was "
                        f"upgrading [{_at(at.invoke_t, origin)}, {_at(at.ok_t, origin)}]",
                    )
                )
    return found


# -- the semaphore ----------------------------------------------------------------------


def over_capacity(
    holds: list[Hold], permits: int | Mapping[str, int] | None, origin: int
) -> list[Violation]:
    """The semaphore's rule (part of :func:`check`): ``over-capacity``, more than ``P``
    owners hold a permit ("sem" holds) of one name at one instant, ``P`` being
    ``permits`` (an int for every name, or per name; a name without one is not
    judged). Holds that merely touch (one ends where the next starts) do not count
    together."""
    found: list[Violation] = []
    for lock, group in _grouped((h for h in holds if h.mode == "sem"), lambda h: h.lock).items():
        p = permits if isinstance(permits, int) or permits is None else permits.get(lock)
        if p is None:
            continue
        # Sweep the holds' ends before their starts at one instant (they only touch).
        points = sorted(
            [(h.start, 1, h) for h in group] + [(h.end, 0, h) for h in group],
            key=lambda point: (point[0], point[1]),
        )
        inside: list[Hold] = []
        for t, starts, h in points:
            if not starts:
                inside.remove(h)
                continue
            inside.append(h)
            owners = {x.owner for x in inside}
            if len(owners) > p:
                found.append(
                    Violation(
                        "over-capacity",
                        lock,
                        t,
                        f"{len(owners)} owners hold one of {p} permits at {_at(t, origin)}: "
                        + ", ".join(x.describe(origin) for x in inside),
                    )
                )
    return found


# -- leader election ----------------------------------------------------------------------
#
# Mode "lead" is the leadership of an election: a hold like an exclusive lock's (from the
# campaign's ok to the resignation's invoke, the loss, or the validity the library
# reported, whichever comes first), whose token is its term. Exclusion ("overlap") and
# fenced writes ("stale-write") are judged by the lock rules; the terms' order here.


def leadership_violations(holds: list[Hold], origin: int) -> list[Violation]:
    """The election's own rule (part of :func:`check`): ``term-order``, a leadership
    whose term is not larger than the term of a leadership of the same election (any
    process, any owner) that began before it, in the order the holds began.

    Judged as the later one: only a leadership that held for a while (its hold is not
    empty). A grant recorded after its validity had run out (the process was paused
    between the grant and its record) has an empty hold, and when it really was granted
    is not known: it is still judged as the earlier one, since it was granted before it
    was recorded. Where exclusion holds, the order the non-empty holds began in is the
    order the masters granted them in, so their terms must grow in it. A leader elected
    again after it resigned is a new leadership, with a new term; a campaign by the
    leader (which only proclaims) is no grant, and is not recorded as an acquire.
    """
    return _order(holds, ("lead",), "term-order", "term", origin)


def token_order_violations(holds: list[Hold], origin: int) -> list[Violation]:
    """The fencing tokens' rule (part of :func:`check` with ``token_order``):
    ``token-order``, an exclusive hold ("x", "w", "fair") whose token is not larger than
    the token of a hold of the same lock family (any process, any owner) that began
    before it, in the order the holds began. Judged as :func:`leadership_violations`
    judges terms (an empty hold only as the earlier one); a re-entry keeps its hold's
    token, and a multi-lock's holds (recorded as "x" holds of each of its names, with
    each name's token) are judged with the plain lock's."""
    return _order(holds, ("x", "w", "fair"), "token-order", "token", origin)


def _order(
    holds: list[Hold], modes: tuple[str, ...], kind: str, label: str, origin: int
) -> list[Violation]:
    """Tokens (terms) of the holds in ``modes`` that do not grow in the order the holds
    began, per lock and family (see :func:`leadership_violations`)."""
    found: list[Violation] = []
    judged = (h for h in holds if h.mode in modes and h.token is not None)
    for (lock, fam), group in _grouped(judged, lambda h: (h.lock, h.family)).items():
        group.sort(key=lambda h: (h.start, h.end))
        for i, b in enumerate(group):
            if b.end <= b.start:
                continue
            assert b.token is not None
            earlier = [a for a in group[:i] if a.start < b.start]
            if not earlier:
                continue
            top = max(earlier, key=lambda a: a.token or 0)
            assert top.token is not None
            if top.token >= b.token:
                found.append(
                    Violation(
                        kind,
                        lock,
                        b.start,
                        f"[{fam}] {b.describe(origin)} began after {top.describe(origin)}, "
                        f"but its {label} is not larger",
                    )
                )
    return found


# -- losses ---------------------------------------------------------------------------------


def loss_violations(
    events: list[Event], holds: list[Hold], late_losses: bool, slack: int, origin: int
) -> list[Violation]:
    """The loss rules (part of :func:`check`): ``late-loss`` (with ``late_losses``) and
    ``gone-while-valid``.

    A ``lost`` report (with an ``owner``) belongs to the latest hold of that lock, mode
    and owner (and token, when the report has one) that began before it; a failed
    release to the latest hold of its client, lock, mode and owner that began before it.
    Give each hold an owner of its own (a fresh ``owner=`` object per hold) for exact
    matches: an owner that holds again may have a later hold's report matched to it.
    """
    found: list[Violation] = []
    by_owner = _grouped(holds, lambda h: (h.lock, h.mode, h.owner))
    reported: set[int] = set()  # ids of the holds whose loss was reported
    for e in events:
        if e.op != "lost" or e.phase != "ok" or e.owner is None:
            continue
        hold = _latest(by_owner.get((e.lock, e.mode, e.owner), []), e.t, e.token)
        if hold is None:
            continue
        reported.add(id(hold))
        if late_losses and hold.valid_until is not None and e.t > hold.valid_until + slack:
            found.append(
                Violation(
                    "late-loss",
                    e.lock,
                    e.t,
                    f"{e.client} was told at {_at(e.t, origin)} that {hold.describe(origin)} "
                    f"was lost, {(e.t - hold.valid_until) / 1e6:.3f}ms after its validity "
                    f"ended at {_at(hold.valid_until, origin)} (slack {slack / 1e6:.3f}ms)",
                )
            )
    for e in events:
        if e.op != "release" or e.phase != "fail" or e.error != "LockLostError":
            continue
        mine = [h for h in by_owner.get((e.lock, e.mode, e.who), []) if h.client == e.client]
        hold = _latest(mine, e.t, None)
        if hold is None or id(hold) in reported or hold.valid_until is None:
            continue
        if e.t < hold.valid_until:
            found.append(
                Violation(
                    "gone-while-valid",
                    e.lock,
                    e.t,
                    f"{e.client}'s release found {hold.describe(origin)} lost at "
                    f"{_at(e.t, origin)}, {(hold.valid_until - e.t) / 1e6:.3f}ms before its "
                    f"validity ended at {_at(hold.valid_until, origin)}, and no loss was "
                    "reported",
                    hold.start,
                )
            )
    return found


def _latest(holds: list[Hold], t: int, token: int | None) -> Hold | None:
    """The latest of ``holds`` that began by ``t`` (of ``token``, when given)."""
    began = [h for h in holds if h.start <= t and token in (None, h.token)]
    return max(began, key=lambda h: h.start) if began else None
