"""``redreentrant inspect NAME [--json]``: what every master holds under a lock name.

A read-only look: for every lock kind present under NAME on each master, the mode, the
holders and their hold counts, the TTL and the queue; a one-line verdict of what a quorum
agrees on; and, for every holder and waiter, the host, pid and thread or task its owner
id names (:func:`redreentrant.parse_owner`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from redreentrant import MasterView, OwnerInfo, parse_owner

from .common import (
    EXIT_FAILED,
    EXIT_OK,
    SIDE,
    Add,
    first_line,
    lock_name,
    open_manager,
    owner_json,
    require_masters,
    table,
    warn,
)

__all__ = ["cmd_inspect", "register"]


def register(add: Add) -> None:
    """Add the ``inspect`` command with ``add`` (a subparsers action's ``add_parser``)."""
    inspect = add(
        "inspect",
        help="show what every master holds for a lock name",
        description="Ask every master what it holds under NAME, of every lock kind: "
        "the kind, the mode (read/write locks), the holders with their hold counts, "
        "the TTL, and who waits; then, for every holder and waiter, its "
        "host, pid and thread or task. A read-only look; exit 1 if fewer than a "
        "quorum of masters answered.",
    )
    inspect.add_argument("name", metavar="NAME", help="the lock's name")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    inspect.set_defaults(func=cmd_inspect)


def _summary(views: Sequence[MasterView], quorum: int) -> tuple[str, str]:
    """(state, sentence): what a quorum of masters agrees on for the name."""
    answered = [v for v in views if v.error is None]
    if len(answered) < quorum:
        failed = next((v for v in views if v.error is not None), None)
        first = f" ({failed.master}: {first_line(failed.error or '')})" if failed else ""
        return "unknown", (
            f"masters unavailable: only {len(answered)} of {len(views)} answered, a "
            f"quorum of {quorum} is out of reach{first}"
        )
    seen: dict[tuple[str, str | None, str], list[int]] = {}
    for view in answered:
        for lv in view.locks:
            for owner, count in lv.holders.items():
                seen.setdefault((lv.kind, lv.mode, owner), []).append(count)
    held = [(key, counts) for key, counts in seen.items() if len(counts) >= quorum]
    if held:
        parts = [
            f"{kind}{'/' + mode if mode else ''} by {_who(owner)} (hold count {max(counts)}, "
            f"on {len(counts)} of {len(views)} masters)"
            for (kind, mode, owner), counts in held
        ]
        return "held", "held: " + "; ".join(parts)
    partial = sum(1 for v in answered if v.locks)
    if partial:
        return "partial", (
            f"not held on a quorum of {quorum}: leftovers on {partial} master(s) "
            "(an acquire under way, or keys that expire with their TTL)"
        )
    return "free", "free"


def _parse(holder: str) -> OwnerInfo | None:
    """What a holder or waiter entry of a view says about its owner."""
    return parse_owner(SIDE.sub("", holder))


def _who(owner: str) -> str:
    """``host H pid P thread T`` for an owner id, or the id itself if it says nothing."""
    info = _parse(owner)
    return owner if info is None else info.describe()


def _owner_rows(views: Sequence[MasterView]) -> list[list[str]]:
    """The owners table: every holder and waiter (first seen first), its host, pid and
    thread or task, each in a column of its own (never cut: the pid is what an operator
    acts on), and on how many masters it holds, and waits in a queue."""
    seen: dict[str, tuple[set[int], set[int]]] = {}  # the masters: (holds on, waits on)
    for index, view in enumerate(views):
        for lv in [] if view.error is not None else view.locks:
            for place, owners in enumerate((lv.holders, lv.queue)):
                for owner in owners:
                    seen.setdefault(SIDE.sub("", owner), (set(), set()))[place].add(index)
    rows = [["OWNER", "HOST", "PID", "THREAD/TASK", "HOLDS ON", "QUEUED ON"]]
    for owner, places in seen.items():
        info = _parse(owner)
        if info is None:
            host = pid = who = "?"
        else:
            host, pid = info.host, str(info.pid)
            who = f"{info.kind} {info.name if info.name is not None else info.token}"
        on = [f"{len(where)} of {len(views)}" if where else "-" for where in places]
        rows.append([owner, host, pid, who, *on])
    return rows


def _quarantine(view: MasterView) -> str:
    """How long a quarantined master's votes do not count, and why."""
    if view.memory is None:
        return f"{view.quarantined:.1f}s from the next try (no memory record yet)"
    why = "a failover" if view.failover else "a restart without its data, a flush or first use"
    return f"{view.quarantined:.1f}s (its memory began {view.memory:.1f}s ago: {why})"


def cmd_inspect(args: argparse.Namespace) -> int:
    """``inspect``: each master's view of a name (table or JSON)."""
    name = lock_name(args.name)
    with open_manager(require_masters(args)) as mgr:
        views = mgr.inspect(name)
        quorum = mgr.quorum
    state, sentence = _summary(views, quorum)
    if args.json:
        document = {
            "name": name,
            "quorum": quorum,
            "state": state,
            "summary": sentence,
            "masters": [
                {
                    "master": v.master,
                    "error": v.error,
                    # Seconds before its votes count (its memory began lately), its
                    # memory's age (null: none kept, or none yet) and whether it began
                    # with a failover.
                    "quarantined": round(v.quarantined, 3),
                    "memory": None if v.memory is None else round(v.memory, 3),
                    "failover": v.failover,
                    "locks": [
                        {
                            "kind": lv.kind,
                            "mode": lv.mode,
                            "ttl": lv.ttl,
                            "holders": dict(lv.holders),
                            "queue": list(lv.queue),
                            # A semaphore's: each holder's permit slot.
                            **({"slots": dict(lv.slots)} if lv.kind == "semaphore" else {}),
                            # Who each holder and waiter is (null: an id that says not).
                            "owners": {
                                owner: owner_json(_parse(owner))
                                for owner in [*lv.holders, *lv.queue]
                            },
                        }
                        for lv in v.locks
                    ],
                }
                for v in views
            ],
        }
        print(json.dumps(document, indent=2))
    else:
        print(f"lock {name!r} on {len(views)} masters, quorum {quorum}: {sentence}")
        rows = [["MASTER", "KIND", "MODE", "TTL", "HOLDERS (hold count)", "QUEUE"]]
        for v in views:
            if v.error is not None:
                rows.append([v.master, "error", "", "", first_line(v.error), ""])
            elif not v.locks:
                rows.append([v.master, "-", "-", "-", "(free)", "-"])
            for lv in [] if v.error is not None else v.locks:
                holders = (
                    ", ".join(
                        f"{o} x{c}" + (f" (slot {lv.slots[o]})" if o in lv.slots else "")
                        for o, c in lv.holders.items()
                    )
                    or "(none)"
                )
                ttl = "-" if lv.ttl is None else f"{lv.ttl:.1f}s"
                queue = ", ".join(lv.queue) or "-"
                rows.append([v.master, lv.kind, lv.mode or "-", ttl, holders, queue])
        print(table(rows))
        for v in views:
            if v.quarantined > 0:
                print(f"{v.master}: quarantined, its votes count in {_quarantine(v)}")
        owners = _owner_rows(views)
        if len(owners) > 1:
            print()
            print(table(owners))
    if state == "unknown":
        warn(sentence)
        return EXIT_FAILED
    return EXIT_OK
