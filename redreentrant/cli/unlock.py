"""``redreentrant unlock --force NAME``: delete a lock, whoever holds it.

For recovering from a stuck holder; refused without ``--force``.
"""

from __future__ import annotations

import argparse

from .common import EXIT_OK, PROG, Add, UsageError, lock_name, open_manager, require_masters

__all__ = ["cmd_unlock", "register"]


def register(add: Add) -> None:
    """Add the ``unlock`` command with ``add`` (a subparsers action's ``add_parser``)."""
    unlock = add(
        "unlock",
        help="delete a lock whoever holds it (needs --force)",
        description="Delete every kind of lock named NAME on every master, whoever holds "
        "it, and wake its waiters. For recovering from a stuck holder: the holder is not "
        "told until its next renewal, re-entry or release fails, so it may still be "
        "working as if it held the lock. Refused (exit 2) without --force.",
    )
    unlock.add_argument("name", metavar="NAME", help="the lock's name")
    unlock.add_argument("--force", action="store_true", help="really delete the lock")
    unlock.set_defaults(func=cmd_unlock)


def cmd_unlock(args: argparse.Namespace) -> int:
    """``unlock --force``: delete every kind of lock under a name."""
    name = lock_name(args.name)
    if not args.force:
        raise UsageError(
            f"refusing to unlock {name!r} without --force: it deletes the lock whoever "
            f"holds it (see '{PROG} inspect {name}' first)"
        )
    with open_manager(require_masters(args)) as mgr:
        deleted = mgr.force_unlock(name)
    if deleted:
        print(f"unlocked {name!r}: its keys were deleted; its waiters are woken in turn")
    else:
        print(f"{name!r} was not locked: nothing was deleted")
    return EXIT_OK
