"""``redreentrant top [PATTERN]``: a live view of the locks whose names match a pattern.

Every refresh takes a snapshot (:meth:`Watcher.snapshot`):

1. every master is sent a ``PING`` (:meth:`redreentrant.LockManager.ping`, its
   latency), and the names matching PATTERN (a glob, as :func:`fnmatch.fnmatchcase`
   reads it) are listed with :meth:`redreentrant.LockManager.names` (a ``SCAN`` of each
   master; a name that has nothing but fencing counters left is not a lock);
2. the first ``--limit`` names in sorted order are read with
   :meth:`redreentrant.LockManager.inspect` (every master's view, holders and waiters,
   as ``inspect`` shows it: no quorum is needed to see what each master says); the
   other names are counted, not read.

One row per holder and waiter of each lock kind under a name: its role, host, pid and
thread or task (:func:`redreentrant.parse_owner`), hold count and on how many masters.

The live view redraws in place through ``rich`` (the ``cli`` extra). ``--once`` prints
one plain snapshot, ``--json`` one JSON document; neither needs ``rich``, and neither
does the plain snapshot printed every interval when stdout is not a terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redreentrant import (
    LockManager,
    LockView,
    MasterView,
    OwnerInfo,
    QuorumUnavailableError,
    parse_owner,
)

from .common import (
    EXIT_FAILED,
    EXIT_OK,
    PROG,
    SIDE,
    Add,
    CliError,
    first_line,
    masters,
    number,
    open_manager,
    owner_json,
    positive_int,
    require_masters,
    table,
    until_ctrl_c,
    warn,
)
from .ensemble import local_masters

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = ["LockRow", "MasterState", "Snapshot", "Watcher", "cmd_top", "register"]

#: the extra that brings ``rich``, for the live view
EXTRA = "cli"
DEFAULT_LIMIT = 50
DEFAULT_INTERVAL = 1.0
MIN_INTERVAL = 0.1
#: seconds a master has to answer a PING, a SCAN page or an inspect
MASTER_TIMEOUT = 1.0


def register(add: Add) -> None:
    """Add the ``top`` command with ``add`` (a subparsers action's ``add_parser``)."""
    top = add(
        "top",
        help="a live view of the locks matching a pattern, and of the masters",
        description="Show the locks whose names match PATTERN (a glob; default '*'), "
        "refreshed in place: for each lock kind under a name, its mode, state and TTL, "
        "and every holder and waiter (host, pid, thread or task, hold count, on how many "
        "masters); and each master's health and PING latency. Every master's view is "
        "shown, no quorum is needed. Masters: --masters, else $REDREENTRANT_MASTERS, "
        "else the local ensemble of 'redreentrant ensemble up'. The live view needs "
        f"'rich' (pip install 'redreentrant[{EXTRA}]'); --once and --json do not. "
        "Ctrl-C quits (exit 0).",
    )
    top.add_argument(
        "pattern", metavar="PATTERN", nargs="?", default="*", help="a glob of lock names"
    )
    top.add_argument(
        "--interval",
        # nan is refused too: it compares false
        type=number(
            float, "a number", lambda v: v >= MIN_INTERVAL, f"must be at least {MIN_INTERVAL:g}"
        ),
        default=DEFAULT_INTERVAL,
        metavar="S",
        help=f"seconds between refreshes (default {DEFAULT_INTERVAL:g}, at least {MIN_INTERVAL:g})",
    )
    top.add_argument(
        "--limit",
        type=positive_int,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"read at most N names per refresh, the first in sorted order (default "
        f"{DEFAULT_LIMIT}); the others are counted",
    )
    top.add_argument("--once", action="store_true", help="print one plain snapshot and exit")
    top.add_argument("--json", action="store_true", help="print one JSON snapshot and exit")
    top.set_defaults(func=cmd_top)


# -- the snapshot -----------------------------------------------------------------------


@dataclass
class MasterState:
    """One master's health in a snapshot."""

    master: str
    up: bool
    latency_ms: float | None = None
    """The PING's round trip (None when it failed)."""
    error: str | None = None
    quarantined: float = 0.0
    """Seconds before its votes count (its memory began lately; 0.0: they count)."""


@dataclass
class Owner:
    """A holder or waiter of one lock, over all masters."""

    owner: str
    """The owner id (a read/write lock's side taken off: see ``side``)."""
    on: int
    """On how many masters it holds the lock, or waits."""
    side: str | None = None
    """``"read"`` or ``"write"`` for a read/write lock's holder."""
    count: int = 0
    """The hold count (the largest any master records; 0 for a waiter)."""

    @property
    def info(self) -> OwnerInfo | None:
        return parse_owner(self.owner)


@dataclass
class PerMaster:
    """What one master says about one lock kind under a name."""

    master: str
    error: str | None = None
    view: LockView | None = None

    @property
    def waiters(self) -> list[str]:
        """Who waits (the view's queue)."""
        return [] if self.view is None else self.view.queue


@dataclass
class LockRow:
    """One lock kind under one name, as every master sees it."""

    name: str
    kind: str
    """``"lock"``, ``"rw"`` or ``"fair"``."""
    state: str
    """``held`` (by a quorum), ``partial`` (holders, none on a quorum), ``free`` (only
    waiters) or ``unknown`` (fewer than a quorum of masters answered)."""
    mode: str | None
    ttl: tuple[float, float] | None
    """The smallest and largest TTL on the masters that have the lock's key."""
    holders: list[Owner]
    waiters: list[Owner]
    masters: list[PerMaster]


@dataclass
class Snapshot:
    """One refresh: the masters' health and the locks matching the pattern."""

    pattern: str
    quorum: int
    time: float
    masters: list[MasterState]
    locks: list[LockRow]
    matched: int
    """How many names matched."""
    limit: int
    source: str | None = None
    """Where the masters came from, when not from ``--masters`` or the variable."""

    @property
    def cut(self) -> int:
        """Matching names not read (over ``limit``)."""
        return max(0, self.matched - self.limit)

    @property
    def answered(self) -> int:
        return sum(1 for m in self.masters if m.up)


class Watcher(contextlib.AbstractContextManager["Watcher"]):
    """Takes snapshots of the locks matching ``pattern`` on ``urls`` (from ``source``,
    when not from ``--masters`` or the variable); closes its manager on exit."""

    def __init__(
        self, urls: Sequence[str], pattern: str, limit: int, source: str | None = None
    ) -> None:
        self.pattern = pattern
        self.limit = limit
        self.source = source
        # A master timeout longer than a lock round's default: a slow master is shown
        # slow rather than down.
        self.manager: LockManager = open_manager(urls, master_timeout=MASTER_TIMEOUT)

    def __exit__(self, *exc: object) -> None:
        self.manager.close()

    def snapshot(self) -> Snapshot:
        """Look once: health, names, every master's views of the first ``limit``."""
        states = [
            MasterState(master, False, None, first_line(f"{type(answer).__name__}: {answer}"))
            if isinstance(answer, BaseException)
            else MasterState(master, True, answer * 1000.0)
            for master, answer in zip(self.manager.masters, self.manager.ping(), strict=True)
        ]
        for state, left in zip(states, self.manager.quarantined(), strict=True):
            state.quarantined = left
        try:
            names = self.manager.names(self.pattern)
        except QuorumUnavailableError:
            names = {}  # too few answer to tell: what they hold is not a lock
        quorum = self.manager.quorum
        locks = [
            row
            for name in list(names)[: self.limit]
            for row in _rows(name, self.manager.inspect(name), quorum, names[name])
        ]
        return Snapshot(
            pattern=self.pattern,
            quorum=quorum,
            time=time.time(),
            masters=states,
            locks=locks,
            matched=len(names),
            limit=self.limit,
            source=self.source,
        )


def _rows(
    name: str, views: Sequence[MasterView], quorum: int, families: Sequence[str]
) -> list[LockRow]:
    """The lock kinds present under ``name`` on any master, each as a row."""
    rows = []
    answered = sum(1 for v in views if v.error is None)
    for kind in families:
        per_master = [
            PerMaster(view.master, error=first_line(view.error))
            if view.error is not None
            else PerMaster(
                view.master, view=next((lv for lv in view.locks if lv.kind == kind), None)
            )
            for view in views
        ]
        if any(pm.view is not None for pm in per_master):
            rows.append(_row(name, kind, per_master, answered, quorum))
    return rows


def _row(name: str, kind: str, per_master: list[PerMaster], answered: int, quorum: int) -> LockRow:
    holders: dict[tuple[str, str | None], Owner] = {}
    waiters: dict[str, Owner] = {}
    modes: Counter[str] = Counter()
    ttls: list[float] = []
    for pm in per_master:
        if pm.view is not None:
            for key, count in pm.view.holders.items():
                found = SIDE.search(key) if kind == "rw" else None
                owner, side = (key[: found.start()], found[1]) if found else (key, None)
                holder = holders.setdefault((owner, side), Owner(owner, 0, side))
                holder.on += 1
                holder.count = max(holder.count, count)
            if pm.view.mode is not None:
                modes[pm.view.mode] += 1
            if pm.view.ttl is not None:
                ttls.append(pm.view.ttl)
        for owner in pm.waiters:
            waiters.setdefault(owner, Owner(owner, 0)).on += 1
    if answered < quorum:
        state = "unknown"
    elif any(h.on >= quorum for h in holders.values()):
        state = "held"
    elif holders:
        state = "partial"
    else:
        state = "free"
    return LockRow(
        name=name,
        kind=kind,
        state=state,
        mode=modes.most_common(1)[0][0] if modes else None,
        ttl=(min(ttls), max(ttls)) if ttls else None,
        holders=list(holders.values()),
        waiters=list(waiters.values()),
        masters=per_master,
    )


# -- output -----------------------------------------------------------------------------

MASTER_COLUMNS = ["MASTER", "STATUS", "LATENCY", "ERROR"]
LOCK_COLUMNS = ["LOCK", "KIND", "MODE", "STATE", "TTL", "ROLE", "HOST", "PID", "THREAD/TASK",
                "HOLDS", "ON"]  # fmt: skip


def _ttl(ttl: tuple[float, float] | None) -> str:
    if ttl is None:
        return "-"
    low, high = ttl
    return f"{high:.1f}s" if high - low < 0.05 else f"{low:.1f}..{high:.1f}s"


def _latency(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.2f} ms"


def _who(owner: Owner) -> tuple[str, str, str]:
    """(host, pid, thread or task) of an owner; ``?`` for an id that says not."""
    info = owner.info
    if info is None:
        return "?", "?", owner.owner
    return info.host, str(info.pid), f"{info.kind} {info.name or info.token}"


def _role(row: LockRow, owner: Owner, position: int | None) -> str:
    if position is not None:
        return f"waiter {position}" if row.kind == "fair" else "waiter"
    return _ROLES[owner.side]


#: a holder's role, by its side (a read/write lock's; None for other kinds)
_ROLES = {"read": "reader", "write": "writer", "upgradeable": "upgradeable", None: "holder"}


def master_rows(snapshot: Snapshot) -> list[list[str]]:
    """The masters' table, one row each (no header)."""
    return [
        [m.master, _health(m), _latency(m.latency_ms), m.error or "-"] for m in snapshot.masters
    ]


def _health(m: MasterState) -> str:
    if not m.up:
        return "down"
    return f"quarantined {m.quarantined:.1f}s" if m.quarantined > 0 else "up"


def lock_rows(snapshot: Snapshot) -> list[list[list[str]]]:
    """The locks' table: per lock, its rows (a holder or waiter each; the lock's own
    columns on the first only)."""
    total = len(snapshot.masters)
    out = []
    for row in snapshot.locks:
        lines = []
        first = [row.name, row.kind, row.mode or "-", row.state, _ttl(row.ttl)]
        owners: list[tuple[Owner, int | None]] = [(h, None) for h in row.holders]
        owners += [(w, i) for i, w in enumerate(row.waiters, 1)]
        for owner, position in owners:
            host, pid, who = _who(owner)
            count = str(owner.count) if position is None else "-"
            lines.append([_role(row, owner, position), host, pid, who, count,
                          f"{owner.on}/{total}"])  # fmt: skip
        out.append([first + lines[0], *(["", "", "", "", "", *line] for line in lines[1:])])
    return out


def title(snapshot: Snapshot) -> str:
    clock = time.strftime("%H:%M:%S", time.localtime(snapshot.time))
    total = len(snapshot.masters)
    locks = len(snapshot.locks)
    source = f" ({snapshot.source})" if snapshot.source else ""
    return (
        f"{PROG} top  {clock}  pattern {snapshot.pattern!r}  {total} masters{source}, "
        f"{snapshot.answered} up, quorum {snapshot.quorum}  {locks} "
        f"lock{'' if locks == 1 else 's'}"
    )


def footer(snapshot: Snapshot) -> str | None:
    """What was left out (names over the limit), or that nothing matched; else None."""
    if snapshot.cut:
        return (
            f"{snapshot.cut} more matching name(s) not shown: only the first "
            f"{snapshot.limit} in sorted order are read (--limit)"
        )
    return None if snapshot.locks else f"no locks match {snapshot.pattern!r}"


def plain(snapshot: Snapshot) -> str:
    """The snapshot as plain text (``--once``; also when stdout is not a terminal)."""
    parts = [title(snapshot), table([MASTER_COLUMNS, *master_rows(snapshot)])]
    grouped = lock_rows(snapshot)
    if grouped:
        parts.append("")
        parts.append(table([LOCK_COLUMNS, *(line for lines in grouped for line in lines)]))
    note = footer(snapshot)
    if note:
        parts.append(note)
    return "\n".join(parts)


def _owner_json(owner: Owner, hold: bool, position: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"owner": owner.owner}
    if hold:
        out.update(side=owner.side, hold_count=owner.count)
    else:
        out["position"] = position
    return {**out, "on": owner.on, "who": owner_json(owner.info)}


def to_json(snapshot: Snapshot) -> dict[str, Any]:
    """The snapshot as a JSON-ready document (``--json``)."""
    return {
        "time": snapshot.time,
        "pattern": snapshot.pattern,
        "quorum": snapshot.quorum,
        "masters": [
            {
                "master": m.master,
                "up": m.up,
                "latency_ms": None if m.latency_ms is None else round(m.latency_ms, 3),
                "error": m.error,
                "quarantined": round(m.quarantined, 3),
            }
            for m in snapshot.masters
        ],
        "matched": snapshot.matched,
        "limit": snapshot.limit,
        "cut": snapshot.cut,
        "locks": [
            {
                "name": row.name,
                "kind": row.kind,
                "state": row.state,
                "mode": row.mode,
                "ttl": None if row.ttl is None else row.ttl[1],
                "ttl_min": None if row.ttl is None else row.ttl[0],
                "holders": [_owner_json(h, True, None) for h in row.holders],
                "waiters": [_owner_json(w, False, i) for i, w in enumerate(row.waiters, 1)],
                "masters": [
                    {
                        "master": pm.master,
                        "error": pm.error,
                        "present": pm.view is not None,
                        "mode": pm.view.mode if pm.view else None,
                        "ttl": pm.view.ttl if pm.view else None,
                        "holders": dict(pm.view.holders) if pm.view else {},
                        "waiters": list(pm.waiters),
                    }
                    for pm in row.masters
                ],
            }
            for row in snapshot.locks
        ],
    }


_STATE_STYLES = {"held": "green", "partial": "yellow", "unknown": "bold red", "free": "cyan"}


def render(snapshot: Snapshot, interval: float) -> RenderableType:
    """The live view of a snapshot: a title, the masters' table, the locks' table."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def new_table() -> Table:
        # Two spaces between columns, as in the plain text.
        return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))

    health = new_table()
    for column in MASTER_COLUMNS:
        health.add_column(column, no_wrap=column != "ERROR", overflow="fold")
    for row in master_rows(snapshot):
        status = Text(row[1], style="green" if row[1] == "up" else "bold red")
        health.add_row(row[0], status, row[2], row[3])

    grouped = lock_rows(snapshot)
    lines = [line for group in grouped for line in group]
    locks = new_table()
    for i, column in enumerate(LOCK_COLUMNS):
        # On a narrow terminal the thread or task wraps first, then the name folds: a
        # pid, a host or a count is never cut (they are what an operator acts on).
        if column == "LOCK":
            locks.add_column(column, overflow="fold")
        elif column == "THREAD/TASK":
            locks.add_column(column)
        else:
            widest = max([len(column), *(len(line[i]) for line in lines)])
            locks.add_column(column, no_wrap=True, min_width=widest)
    for group in grouped:
        for index, line in enumerate(group):
            state = Text(line[3], style=_STATE_STYLES.get(line[3], ""))
            locks.add_row(*line[:3], state, *line[4:], end_section=index == len(group) - 1)

    parts: list[RenderableType] = [Text(title(snapshot), style="bold"), Text(), health]
    if snapshot.locks:
        parts += [Text(), locks]
    note = footer(snapshot)
    parts.append(Text())
    if note:
        parts.append(Text(note, style="yellow"))
    parts.append(Text(f"refresh every {interval:g} s; Ctrl-C quits", style="dim"))
    return Group(*parts)


# -- the command ------------------------------------------------------------------------


def _masters(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """The masters: --masters, $REDREENTRANT_MASTERS, else the local ensemble's."""
    if masters(args) is None:
        local = local_masters(args)
        if local is not None:
            return local, "local ensemble"
    return require_masters(args), None  # given neither: a usage error that says how


def _verdict(snapshot: Snapshot) -> int:
    """Exit status of one snapshot: 1 (with a line on stderr) without a quorum."""
    if snapshot.answered >= snapshot.quorum:
        return EXIT_OK
    down = next((m for m in snapshot.masters if not m.up), None)
    first = f" ({down.master}: {down.error})" if down else ""
    warn(
        f"masters unavailable: only {snapshot.answered} of {len(snapshot.masters)} "
        f"answered, a quorum of {snapshot.quorum} is out of reach{first}"
    )
    return EXIT_FAILED


def cmd_top(args: argparse.Namespace) -> int:
    """``top``: the live view, or one snapshot (``--once``, ``--json``)."""
    urls, source = _masters(args)
    once = args.once or args.json
    live = not once and sys.stdout.isatty()
    if live:
        try:
            import rich.live  # noqa: F401 - only checks that it is there
        except ImportError:
            raise CliError(
                f"the live view needs the 'rich' package: pip install "
                f"'redreentrant[{EXTRA}]' (or use --once or --json, which do not)"
            ) from None
    with Watcher(urls, args.pattern, args.limit, source) as watcher:
        if once:
            taken = watcher.snapshot()
            print(json.dumps(to_json(taken), indent=2) if args.json else plain(taken))
            return _verdict(taken)
        with until_ctrl_c():
            (_live if live else _batch)(watcher.snapshot, args.interval)
    return EXIT_OK


def _batch(snapshot: Callable[[], Snapshot], interval: float) -> None:
    """Not a terminal: a plain snapshot every ``interval``, a blank line between."""
    print(plain(snapshot()), flush=True)
    while True:
        time.sleep(interval)
        print("\n" + plain(snapshot()), flush=True)


def _live(snapshot: Callable[[], Snapshot], interval: float) -> None:
    """Redraw the view in place every ``interval`` until interrupted."""
    from rich.console import Console
    from rich.live import Live

    with Live(console=Console(), auto_refresh=False, redirect_stderr=False) as live:
        while True:
            live.update(render(snapshot(), interval), refresh=True)
            time.sleep(interval)
