"""``redreentrant fence NAME [--at-least TOKEN]``: raise a lock's fencing counters.

For operators, after an acquire with fencing (or a campaign) failed with
``FencingError`` (the counters were lost on too many masters): the next tokens (terms)
of NAME are then larger than TOKEN or, without it, than every token handed out.
"""

from __future__ import annotations

import argparse

from redreentrant.checks import check_token

from .common import EXIT_OK, Add, UsageError, lock_name, open_manager, require_masters

__all__ = ["cmd_fence", "register"]

_KINDS = ("lock", "rw", "fair", "election")


def register(add: Add) -> None:
    """Add the ``fence`` command with ``add`` (a subparsers action's ``add_parser``)."""
    fence = add(
        "fence",
        help="raise a lock's fencing counters (after a FencingError)",
        description="Raise the fencing counters of the lock NAME on every master (never "
        "lowering one), so that its next fencing tokens are larger than every token "
        "handed out. Use it when an acquire failed with FencingError because the "
        "counters were lost on too many masters. With --at-least TOKEN, pass the "
        "largest token the protected resource accepted: the counters are raised to "
        "TOKEN. Without it, they are raised to the largest counter a master kept and, "
        "for a master that has none, its clock in microseconds, as the tokens of a "
        "name no master knows start.",
    )
    fence.add_argument("name", metavar="NAME", help="the lock's name")
    fence.add_argument(
        "--at-least",
        metavar="TOKEN",
        type=int,
        help="the counters' new floor (0 to 2**63-1); default: the largest counter or "
        "clock the masters have",
    )
    fence.add_argument(
        "--kind",
        choices=_KINDS,
        default="lock",
        help="which lock of NAME: the plain lock (default), the rw lock's write side, "
        "the fair lock, or the election (its terms)",
    )
    fence.set_defaults(func=cmd_fence)


def cmd_fence(args: argparse.Namespace) -> int:
    """``fence``: raise one lock's fencing counters everywhere."""
    name = lock_name(args.name)
    if args.at_least is not None:
        try:
            check_token(args.at_least, "--at-least")
        except ValueError as error:
            raise UsageError(str(error)) from None
    with open_manager(require_masters(args)) as mgr:
        if args.kind == "rw":
            lock = mgr.rw_lock(name).write
        elif args.kind == "fair":
            lock = mgr.fair_lock(name)
        elif args.kind == "election":
            lock = mgr.election(name)
        else:
            lock = mgr.lock(name)
        at_least = lock.fence_floor() if args.at_least is None else args.at_least
        acked = lock.raise_fence(at_least)
    total = len(mgr.masters)
    print(
        f"raised the fencing counters of {name!r} ({args.kind}) to at least"
        f" {at_least} on {acked} of {total} masters"
    )
    return EXIT_OK
