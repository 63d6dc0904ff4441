"""Lock kinds: what makes one kind of lock differ from another, a module per family.

A kind supplies the script calls for its operations, the channels its waiters listen
on, its rules for a first hold beside the owner's other holds, and, for a kind that
names a family (:class:`FamilyKind`), how to read a name's lock of that family. The
rounds themselves (fan-out, validity, undo, retry, wake-ups, renewal) are the same for
every kind and live in :mod:`redreentrant._core.rounds`. Kinds are stateless
singletons (a semaphore's and a multi-lock's, one per size or set of names).

Keys: each family has keys of its own under the lock's hash tag, so ``lock("x")``,
``rw_lock("x")`` and ``fair_lock("x")`` are three independent locks.

Adding a kind is a module here, its script in ``lua/``, and a :func:`register` call
for a family kind (see the architecture page).
"""

from __future__ import annotations

from .. import keys
from .base import (
    EXCLUSIVE,
    FamilyKind,
    LockKind,
    PlainKind,
    Renewal,
    Try,
    count_of,
    hold_value,
    tag_of,
)
from .election import ELECTION, ElectionKind
from .fair import FAIR, FairKind
from .multi import MultiKind, multi_kind, multi_names
from .rw import READ, UPGRADE, UPGRADEABLE, WRITE, ReadKind, UpgradeableKind, UpgradeKind, WriteKind
from .semaphore import SEMAPHORES, SemaphoreKind, semaphore_kind

__all__ = [
    "ELECTION", "EXCLUSIVE", "FAIR", "FAMILIES", "READ", "SEMAPHORES", "UPGRADE", "UPGRADEABLE",
    "WRITE", "ElectionKind", "FairKind", "FamilyKind", "LockKind", "MultiKind", "PlainKind",
    "ReadKind", "Renewal", "SemaphoreKind", "Try", "UpgradeKind", "UpgradeableKind", "WriteKind",
    "count_of", "hold_value", "multi_kind", "multi_names", "name_and_family", "register",
    "semaphore_kind", "tag_of",
]  # fmt: skip

#: the registry: one kind per family, in the order ``names()`` and ``inspect`` list
#: them; what ``inspect``, ``locked()`` and ``force_unlock`` of a name go through
FAMILIES: list[FamilyKind] = []


def register(kind: FamilyKind) -> FamilyKind:
    """Add the family of ``kind`` to :data:`FAMILIES` (once per family)."""
    if any(k.family == kind.family for k in FAMILIES):
        raise ValueError(f"a kind of family {kind.family!r} is registered already")
    FAMILIES.append(kind)
    return kind


for _kind in (EXCLUSIVE, READ, FAIR, SEMAPHORES, ELECTION):
    register(_kind)


def name_and_family(key: str) -> tuple[str, str] | None:
    """The name and the family of the lock a key on a master belongs to; None for a key
    that is not ours, or for a fencing counter (which outlives its lock on purpose)."""
    try:
        name = keys.name_of(key)
    except ValueError:
        return None
    if any(key == kind.fence_key(name) for kind in FAMILIES):
        return None
    stem = key[len(keys.tag(name)) :].removeprefix(":").split(":")[0]
    return next(((name, k.family) for k in FAMILIES if stem in k.stems), None)
