"""``redreentrant leader NAME [--json] [--watch]``: who leads an election.

A read-only look at an election (``redreentrant elect``, ``mgr.election(NAME)``): who
leads as a quorum of masters sees it (owner id, host, pid, thread or task name), its
value, term and the lease left, or that nobody leads; ``--watch`` then prints each
change until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from redreentrant import Election, LeaderView, QuorumUnavailableError

from . import run
from .common import (
    EXIT_OK,
    Add,
    lock_name,
    open_manager,
    owner_json,
    quorum_message,
    require_masters,
    until_ctrl_c,
    warn,
)

__all__ = ["EXIT_NOBODY", "cmd_leader", "leader_json", "leader_line", "register", "value_text"]

EXIT_NOBODY = 3
"""``leader``'s exit status when nobody leads (as ``systemctl is-active`` says inactive)."""


def register(add: Add) -> None:
    """Add the ``leader`` command with ``add`` (a subparsers action's ``add_parser``)."""
    leader = add(
        "leader",
        help="show who leads an election",
        description="Show who leads the election NAME as a quorum of masters sees it: "
        "its owner id, host, pid and thread or task name, the value it proclaimed, its "
        "term and the seconds left of its lease; or that nobody leads. Exit 0 when "
        f"someone leads, {EXIT_NOBODY} when nobody does, 1 when fewer than a quorum of "
        "masters answered. With --watch, print the state, then one line per change "
        "(a new leader, a new value, nobody), until Ctrl-C, which exits 0.",
    )
    leader.add_argument("name", metavar="NAME", help="the election's name")
    leader.add_argument(
        "--json",
        action="store_true",
        help="print a JSON object (with --watch: one per line); the value as text, an "
        "undecodable byte as \\xNN",
    )
    leader.add_argument(
        "--watch", action="store_true", help="print each change until Ctrl-C (exit 0)"
    )
    leader.set_defaults(func=cmd_leader)


def value_text(value: bytes) -> str:
    """A value as text: UTF-8, each byte that is not shown as ``\\xNN``."""
    return value.decode("utf-8", "backslashreplace")


# Control characters (a newline among them) would break a line: shown as \xNN too.
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F]}


def leader_line(name: str, view: LeaderView | None) -> str:
    """One line for people: who leads ``name`` (or nobody), the value, term and lease."""
    if view is None:
        return f"election {name!r}: nobody leads"
    who = view.owner if view.info is None else view.info.describe()
    shown = value_text(view.value).translate(_CONTROLS)
    return (
        f'election {name!r}: led by {who}, term {view.term}, value "{shown}", '
        f"{view.validity:.1f} s of lease left (owner {view.owner})"
    )


def leader_json(name: str, view: LeaderView | None) -> dict[str, object]:
    """The JSON object of ``name``'s state: ``leader`` is null when nobody leads."""
    leader = None
    if view is not None:
        leader = {
            "owner": view.owner,
            "who": owner_json(view.info),
            "value": value_text(view.value),
            "term": view.term,
            "validity": round(view.validity, 3),
        }
    return {"name": name, "time": round(time.time(), 3), "leader": leader}


def cmd_leader(args: argparse.Namespace) -> int:
    """``leader``: who leads an election, once or (``--watch``) at every change."""
    name = lock_name(args.name)

    def show(view: LeaderView | None, stamp: bool) -> None:
        if args.json:
            print(json.dumps(leader_json(name, view), indent=None if stamp else 2), flush=True)
        else:
            prefix = time.strftime("%H:%M:%S ") if stamp else ""
            print(prefix + leader_line(name, view), flush=True)

    with open_manager(require_masters(args)) as mgr:
        election = mgr.election(name)
        if not args.watch:
            view = election.leader()
            show(view, False)
            return EXIT_OK if view is not None else EXIT_NOBODY
        with until_ctrl_c():
            _watch(election, lambda view: show(view, True))
    return EXIT_OK


def _same(a: LeaderView | None, b: LeaderView | None) -> bool:
    return b is None if a is None else a.same(b)


def _watch(election: Election, show: Callable[[LeaderView | None], None]) -> None:
    """Show the state, then each change, until interrupted. Masters that become
    unavailable are said once on stderr and waited out (retrying, as ``run
    --wait-masters`` does); the state is shown again only if it changed meanwhile. The
    first read failing raises QuorumUnavailableError (exit 1)."""
    shown: list[LeaderView | None] = []
    first, longest = run.RUN_MASTERS_RETRY
    pause = first
    told = False
    while True:
        try:
            for view in election.observe():
                if told:
                    warn("the masters answer again: watching")
                if not shown or not _same(view, shown[-1]):
                    show(view)
                    shown[:] = [view]
                pause, told = first, False
        except QuorumUnavailableError as error:
            if not shown:
                raise
            if not told:
                told = True
                warn(f"{quorum_message(error)}: still watching, retrying")
        time.sleep(pause)
        pause = min(2 * pause, longest)
