"""``redreentrant elect NAME [--value V] -- CMD ARGS...``: run a command while leading.

A hot standby: wait in line to lead the election NAME, run CMD while leading (the term
handed to it in ``$REDREENTRANT_FENCE``), and resign when CMD ends, so that the next
candidate leads. Everything else is ``run``'s (:func:`.run.run_under`): the wait, the
signals, the command that dies with us, the stop when leadership is lost, the exit
statuses.
"""

from __future__ import annotations

import argparse
import os

from redreentrant import LockTimeoutError
from redreentrant.checks import check_lease

from . import run
from .common import PROG, Add, lock_name, open_manager, require_masters

__all__ = ["cmd_elect", "register"]


def _lease(text: str) -> float:
    """An argument type: a lease in seconds (> 0, at most the library's longest)."""
    try:
        return check_lease("--lease", float(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


_ELECT_HELP = f"""\
Wait to lead the election NAME (candidates lead in order of arrival), run CMD while
leading, and resign when CMD ends, so that the next candidate leads; exit with CMD's
exit status (128+N if CMD was killed by signal N; 127 if CMD was not found, 126 if it
could not be executed). A hot standby: start the same command on several hosts, and
one runs CMD at a time.

CMD finds the term of this leadership in ${run.FENCE_ENV} (a decimal integer, larger
than every earlier leader's): a fencing token to hand to what CMD writes to. --value V
is what the leader proclaims ('{PROG} leader NAME' shows it; default: empty).

Leadership is renewed by the watchdog while CMD runs (lease {run.RUN_LEASE:g} s, or --lease S;
renewed every third of it): a leader whose process dies, SIGKILL included, or whose
host goes away, is followed by the next candidate within about one lease.

As with 'run': SIGINT, SIGTERM and SIGHUP are forwarded to CMD, CMD dies with
redreentrant (Linux), and if leadership is lost while CMD runs (renewal failed on a
quorum, or 'unlock --force NAME'), CMD is stopped with SIGTERM
(SIGKILL after {run.RUN_KILL_GRACE:g} s) and the exit status is 1. If leadership is not obtained
within --timeout, or the masters are unavailable, nothing is run: exit 1, or N with
--conflict-exit-code N; --wait-masters waits out an outage of the masters.
"""


def register(add: Add) -> None:
    """Add the ``elect`` command with ``add`` (a subparsers action's ``add_parser``)."""
    elect = add(
        "elect",
        usage=f"{PROG} elect [-h] [--masters URL,...] [--value V] [--timeout S] "
        "[--lease S] [-E N] [--wait-masters] NAME -- CMD [ARGS...]",
        help="run a command while leading an election (a hot standby)",
        description=_ELECT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    elect.add_argument("name", metavar="NAME", help="the election's name")
    elect.add_argument(
        "--value",
        default="",
        metavar="V",
        help="the value to proclaim while leading, e.g. this host's address (default: empty)",
    )
    elect.add_argument(
        "--lease",
        type=_lease,
        metavar="S",
        help="the leadership's lease, renewed every S/3 s while CMD runs: how long a "
        f"leader that died holds up the next one (default {run.RUN_LEASE:g})",
    )
    run.add_waiting_options(elect, "leadership")
    elect.set_defaults(func=cmd_elect)


def cmd_elect(args: argparse.Namespace) -> int:
    """``elect``: lead while a command runs, pass its exit status through."""
    command = run.command_of(args, "elect NAME")
    name = lock_name(args.name)
    # The bytes given: an argument that is not valid UTF-8 comes back as it was.
    value = os.fsencode(args.value)
    lease = run.RUN_LEASE if args.lease is None else args.lease
    child = run.Child()
    with open_manager(
        require_masters(args), lease=lease, on_lost=child.on_lost, quarantine=args.quarantine
    ) as mgr:
        election = mgr.election(name)

        def take(timeout: float | None) -> bool:
            """One campaign, with ``value`` proclaimed (see :attr:`.run.Holding.take`)."""
            try:
                election.campaign(value, timeout=-1 if timeout is None else timeout)
            except LockTimeoutError:
                return False
            return True

        holding = run.Holding(election, f"leadership of {name!r}", take, fenced=True)
        return run.run_under(holding, command, child, args)
