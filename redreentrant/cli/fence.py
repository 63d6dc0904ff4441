"""``redreentrant fence NAME --at-least TOKEN``: raise a lock's fencing counters.

For operators, after an acquire with fencing (or a campaign) failed with
``FencingError`` (the counters were lost on too many masters): the next tokens (terms)
of NAME are then larger than TOKEN.
"""

from __future__ import annotations

import argparse

from redreentrant._core.fencing import check_token

from .common import EXIT_OK, Add, Parents, UsageError, lock_name, open_manager, require_masters

__all__ = ["cmd_fence", "register"]

_KINDS = ("lock", "rw", "fair", "election")


def register(add: Add, parents: Parents) -> None:
    """Add the ``fence`` command with ``add`` (a subparsers action's ``add_parser``)."""
    fence = add(
        "fence",
        parents=parents,
        help="raise a lock's fencing counters (after a FencingError)",
        description="Raise the fencing counters of the lock NAME to at least TOKEN on "
        "every master (never lowering one), so that its next fencing tokens are larger "
        "than TOKEN. Use it when an acquire failed with FencingError because the "
        "counters were lost on too many masters: pass the largest token the protected "
        "resource accepted.",
    )
    fence.add_argument("name", metavar="NAME", help="the lock's name")
    fence.add_argument(
        "--at-least",
        metavar="TOKEN",
        type=int,
        required=True,
        help="the counters' new floor (0 to 2**63-1)",
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
        acked = lock.raise_fence(args.at_least)
    total = len(mgr.masters)
    print(
        f"raised the fencing counters of {name!r} ({args.kind}) to at least"
        f" {args.at_least} on {acked} of {total} masters"
    )
    return EXIT_OK
