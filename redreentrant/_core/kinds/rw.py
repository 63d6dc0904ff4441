"""The read/write lock's sides: read, write, upgradeable read, and the upgrade (see
``lua/rwlock.lua``)."""

from __future__ import annotations

from collections.abc import Sequence

from .. import keys, scripts
from ..effects import Call
from ..errors import LockUpgradeError
from ..replies import probe, ttl_of
from ..views import LockView
from .base import FamilyKind, LockKind, OwnHolds, Renewal, Try, count_of


class _ReadWriteKind(FamilyKind):
    """One side of the read/write lock (see ``lua/rwlock.lua``): ``r`` (read), ``w``
    (write) or ``u`` (upgradeable read)."""

    family = "rw"
    stems = ("rw",)
    side = ""
    targeted = False
    hands_over = False
    hands_off = False

    def _keys(self, name: str) -> tuple[str, str, str]:
        return (
            keys.aux_key(name, "rw"),
            keys.aux_key(name, "rw:leases"),
            keys.aux_key(name, "rw:writers"),
        )

    def key(self, name: str) -> str:
        return keys.aux_key(name, "rw")

    def fence_key(self, name: str) -> str:
        return keys.aux_key(name, "rw:fence")

    def _channels(self, name: str) -> tuple[str, str, str]:
        """Where readers (and upgradeable readers), writers and an upgrade wait."""
        return (
            keys.aux_key(name, "rw:wake:r"),
            keys.aux_key(name, "rw:wake:w"),
            keys.aux_key(name, "rw:wake:u"),
        )

    def wake_channel(self, name: str, owner: str) -> str:
        readers, writers, _ = self._channels(name)
        return writers if self.side == "w" else readers

    def notify_channels(self, name: str) -> tuple[str, ...]:
        return self._channels(name)

    def first_hold(self, holds: OwnHolds, name: str, owner: str) -> LockKind:
        # The write or the upgradeable side, by a holder of the read side, and the
        # upgradeable side, by a writer: they would wait for the owner itself, or for
        # an upgrade that waits for it.
        for side in (READ, WRITE):
            if side is not self and holds.get(side, name, owner) is not None:
                have, want = side.label[3:], self.label[3:]
                raise LockUpgradeError(
                    f"lock {name!r}: a holder of the {have} lock cannot take the {want}"
                    f" lock (release the {have} lock first)"
                )
        return self

    def acquire(self, t: Try) -> Call:
        # Never polite: a read/write lock takes no turns (it does not hand over). No
        # place either: its waiting writers are woken by broadcast, not in order.
        args = ("acquire", self.side, *t[1:5])
        return Call(scripts.RWLOCK, self._keys(t.name), args, None, (4,))

    def abandon(self, name: str, owner: str, release_id: str, tag: int) -> Call | None:
        return None  # readers keep no place as waiters

    def _ends(self, name: str, owner: str, left: str, rid: str, end: str, *more: str | int) -> Call:
        readers, writers, upgrade = self._channels(name)
        args = ("release", self.side, owner, left, readers, writers, rid, end, upgrade)
        return Call(scripts.RWLOCK, self._keys(name), args)

    def extend(self, name: str, owner: str, ms: int, add: bool, tag: int) -> Call:
        args = ("extend", self.side, owner, ms, "add" if add else "set", tag)
        return Call(scripts.RWLOCK, self._keys(name), args)

    def renew(self, entries: Sequence[Renewal], lease_ms: int) -> Call:
        return Call(
            scripts.RWLOCK,
            tuple(k for name, _, _ in entries for k in self._keys(name)),
            ("renew", lease_ms, *(x for _, o, hold in entries for x in (self.side, o, hold))),
        )

    def force_unlock(self, name: str, release_id: str) -> Call:
        readers, writers, upgrade = self._channels(name)
        args = ("force", readers, writers, release_id, upgrade)
        return Call(scripts.RWLOCK, self._keys(name), args)

    def probe(self, name: str) -> Call:
        return Call(scripts.RWLOCK, self._keys(name), ("probe",))

    def view(self, reply: object) -> LockView | None:
        seen = probe(reply)
        holders = {
            f"{owner[2:]} ({_SIDES[owner[:2]]})": count_of(hold)
            for owner, hold in seen.fields.items()
            if owner[:2] in _SIDES
        }
        if not holders and not seen.waiting:
            return None
        mode = seen.fields.get("mode") if holders else None
        return LockView(self.family, mode, ttl_of(seen.pttl), holders, seen.waiting)

    def is_locked(self, view: LockView | None) -> bool:
        wanted = "read" if self.side == "r" else "write"
        return view is not None and view.mode == wanted


#: how a view names each side of a hold (``inspect``: ``"<owner id> (read)"``)
_SIDES = {"r:": "read", "w:": "write", "u:": "upgradeable"}


class ReadKind(_ReadWriteKind):
    """The read side: shared with other readers, excluded by a writer."""

    label = "rw:read"
    side = "r"
    broadcast = True
    fenced = False  # readers share: a token orders exclusive holds only

    def first_hold(self, holds: OwnHolds, name: str, owner: str) -> LockKind:
        return self  # a writer or an upgradeable reader may read besides


class WriteKind(_ReadWriteKind):
    """The write side: exclusive; a waiting writer stops new readers."""

    label = "rw:write"
    side = "w"
    queued = True
    looks_around = True

    def first_hold(self, holds: OwnHolds, name: str, owner: str) -> LockKind:
        # By the holder of the upgradeable side: its upgrade, the same hold.
        if holds.get(UPGRADEABLE, name, owner) is not None:
            return UPGRADE
        return super().first_hold(holds, name, owner)

    def holder_field(self, owner: str) -> str:
        return f"w:{owner}"

    def abandon(self, name: str, owner: str, release_id: str, tag: int) -> Call | None:
        # A waiting writer leaves no hold behind (a try that was granted is undone).
        readers = self._channels(name)[0]
        return Call(scripts.RWLOCK, self._keys(name), ("abandon", owner, readers, release_id))


READ = ReadKind()
WRITE = WriteKind()


class UpgradeableKind(_ReadWriteKind):
    """The upgradeable read side: shared with readers, excluded by a writer and by
    another upgradeable reader (one at a time, so two upgrades never wait for each
    other). Its holder may take the write side: that is its upgrade (:data:`UPGRADE`).
    The last release of this side also frees the owner's write hold (see
    ``lua/rwlock.lua``). A holder of the read side cannot take it (an upgrade in
    progress would wait for that reader, and the reader for the upgrade), nor can a
    writer (see :meth:`first_hold`)."""

    label = "rw:upgradeable"
    side = "u"
    broadcast = True  # it waits where readers wait, woken with them
    fenced = False  # it shares with readers: its upgrade's write hold gets the token
    looks_around = True

    ends_too = WRITE

    def release(
        self, name: str, owner: str, left: str, release_id: str, handover: str = "0", ends: int = 0
    ) -> Call:
        call = super().release(name, owner, left, release_id, handover)
        # The upgrade's tag: a master that refused this hold may have granted the
        # upgrade as a plain write, which only that tag names there.
        return call._replace(args=(*call.args, ends)) if ends else call

    def is_locked(self, view: LockView | None) -> bool:
        return view is not None and any(h.endswith(" (upgradeable)") for h in view.holders)


class UpgradeKind(WriteKind):
    """The write side as the holder of the upgradeable side takes it: its upgrade. The
    masters grant it once every hold but the owner's own has ended, and refuse new
    readers meanwhile (the owner waits as a writer). The same hold as the write side's
    (the same label, calls and fencing counter), waiting on a channel of its own, which
    the release that leaves only the owner's holds publishes on."""

    broadcast = True

    def seen_as(self) -> LockKind:
        return WRITE  # the write side's lock object

    def wake_channel(self, name: str, owner: str) -> str:
        return self._channels(name)[2]


UPGRADEABLE = UpgradeableKind()
UPGRADE = UpgradeKind()
