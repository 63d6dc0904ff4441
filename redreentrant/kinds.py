"""Lock kinds: what makes one kind of lock differ from another.

A kind supplies the script calls for its operations and the channel its waiters listen
on. The rounds themselves (fan-out, validity, undo, retry, wake-ups, renewal) are the
same for every kind and live in :mod:`redreentrant.steps`.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import keys, scripts
from .quorum import Call


class LockKind:
    """An exclusive, reentrant lock: a hash ``owner -> hold count`` under one key."""

    #: short name shown by ``inspect`` and used to tell kinds apart in the registry
    label = "lock"

    def key(self, name: str) -> str:
        """The key whose type and TTL describe the lock (for errors and ``locked()``)."""
        return keys.lock_key(name)

    def wake_channel(self, name: str, owner: str) -> str:
        """Where ``owner`` waits for a release of ``name``."""
        return keys.wake_channel(name)

    def acquire(self, name: str, owner: str, lease_ms: int, count: int) -> Call:
        """Take (count 1) or re-enter (count > 1); replies ``{1, n}`` or ``{0, pttl}``."""
        return Call(scripts.ACQUIRE, (keys.lock_key(name),), (owner, lease_ms, count))

    def release(self, name: str, owner: str, count_left: int, release_id: str) -> Call:
        """Set the owner's count to ``count_left`` (0 frees); replies 1, 0, or -1.

        ``release_id`` is the payload of the wake-up published when the lock is freed."""
        return Call(
            scripts.RELEASE,
            (keys.lock_key(name),),
            (owner, count_left, keys.wake_channel(name), release_id),
        )

    def abandon(self, name: str, owner: str) -> Call | None:
        """Undo whatever waiting left behind when an acquire gives up (none here)."""
        return None

    def renew(self, entries: Sequence[tuple[str, str]], lease_ms: int) -> Call:
        """Renew many ``(name, owner)`` holds of this kind in one call."""
        return Call(
            scripts.RENEW,
            tuple(keys.lock_key(name) for name, _ in entries),
            (lease_ms, *(owner for _, owner in entries)),
        )

    def force_unlock(self, name: str, release_id: str) -> Call:
        return Call(
            scripts.FORCE_UNLOCK, (keys.lock_key(name),), (keys.wake_channel(name), release_id)
        )

    def probe(self, name: str) -> Call:
        return Call(scripts.PROBE, (keys.lock_key(name),), ())


EXCLUSIVE = LockKind()
