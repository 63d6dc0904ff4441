"""Leader election: a fair lock with a leader record (see ``lua/fairlock.lua`` and
:mod:`redreentrant._core.election`)."""

from __future__ import annotations

from collections.abc import Sequence

from .. import keys, scripts
from ..effects import Call
from .base import Renewal
from .fair import FairKind


class ElectionKind(FairKind):
    """Leader election: a fair lock of keys of its own, always fenced (the term is the
    grant's fencing token), with a leader record beside it (``lua/fairlock.lua``): the
    leader's term, value and thread or task name, living as long as its hold; a
    change of it is published on the record's own name (:meth:`changes`)."""

    label = "election"
    family = "election"
    stems = ("election",)
    noun = "election"
    hands_off = False

    def _keys(self, name: str) -> tuple[str, ...]:
        return (*super()._keys(name), self.changes(name))

    def changes(self, name: str) -> str:
        """The channel a change of the leader record is published on."""
        return keys.aux_key(name, "election:leader")

    def proclaim(self, name: str, owner: str, term: int, part: str, tag: int) -> Call:
        """Where ``owner`` holds the lock (its hold of ``tag``), make its record
        (``term``, and ``part``, its own part: see :mod:`.election`) the leader record;
        replies 1 (written) or 0 (not held there)."""
        args = ("proclaim", owner, term, part, tag)
        return Call(scripts.FAIRLOCK, self._keys(name), args)

    def renew(self, entries: Sequence[Renewal], lease_ms: int) -> Call:
        # The lock and its leader record, renewed together.
        return Call(
            scripts.FAIRLOCK,
            tuple(k for name, _, _ in entries for k in (self.key(name), self.changes(name))),
            ("renew", lease_ms, *(x for _, owner, hold in entries for x in (owner, hold))),
        )


ELECTION = ElectionKind()
