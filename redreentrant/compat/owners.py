"""The owners of the holds the adapters take, and the registries that keep them.

An adapter takes each hold for an owner object of its own (``mgr.lock(name,
owner=...)``), and keeps the owner, under a key of its choosing (a name and a token or
an id), while the hold may be used again: extended or released by any adapter object of
the same masters. An owner dropped from the registry, once collected, ends as an owner:
its manager forgets its holds, which lapse on the masters. A weak registry keeps an
owner only while something else refers to it (python-redis-lock's ``Lock`` objects of
one id: the last one collected ends their holds).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable, MutableMapping
from typing import Any, Generic, TypeVar

OwnerT = TypeVar("OwnerT")


class Owner:
    """The owner of one hold: its lock (``mgr.lock(name, owner=self)``) in ``lock``."""

    __slots__ = ("__weakref__", "lock")

    def __init__(self) -> None:
        self.lock: Any = None


class Registry(Generic[OwnerT]):
    """Owners by key. Given ``lapsed``, the registry keeps an owner until it is popped
    or ``lapsed(owner)`` (its hold's validity ran out): the lapsed ones are dropped when
    the table doubled since it was last looked through (see :meth:`add`), so that holds
    never given back do not pile up. Without, it is weak: it keeps an owner while it is
    referred to elsewhere."""

    def __init__(self, lapsed: Callable[[OwnerT], bool] | None = None) -> None:
        self._guard = threading.Lock()
        self._lapsed = lapsed
        self._owners: MutableMapping[Hashable, OwnerT] = (
            weakref.WeakValueDictionary() if lapsed is None else {}
        )
        #: the table's size at which lapsed owners are looked for next
        self.limit = 256

    def __len__(self) -> int:
        return len(self._owners)

    def get(self, key: Hashable) -> OwnerT | None:
        return self._owners.get(key)

    def values(self) -> list[OwnerT]:
        with self._guard:
            return list(self._owners.values())

    def add(self, key: Hashable, owner: OwnerT) -> None:
        with self._guard:
            self._add(key, owner)

    def setdefault(self, key: Hashable, make: Callable[[], OwnerT]) -> OwnerT:
        """The owner under ``key``, made by ``make()`` and added if there is none."""
        with self._guard:
            owner = self._owners.get(key)
            if owner is None:
                owner = make()
                self._add(key, owner)
            return owner

    def _add(self, key: Hashable, owner: OwnerT) -> None:
        owners = self._owners
        owners[key] = owner
        lapsed = self._lapsed
        if lapsed is not None and len(owners) >= self.limit:
            for gone in [k for k, o in owners.items() if lapsed(o)]:
                del owners[gone]
            self.limit = max(256, 2 * len(owners))

    def pop(self, key: Hashable) -> OwnerT | None:
        with self._guard:
            return self._owners.pop(key, None)

    def forked(self) -> None:
        """In a forked child: a new guard (another thread may have held the old one)."""
        self._guard = threading.Lock()


def _lapsed(owner: Owner) -> bool:
    return bool(owner.lock.remaining() <= 0)


_guard = threading.Lock()
_registries: weakref.WeakKeyDictionary[object, Registry[Owner]] = weakref.WeakKeyDictionary()


def registry(mgr: object) -> Registry[Owner]:
    """The registry of ``mgr``'s owners (made on first use, gone with the manager)."""
    with _guard:
        found = _registries.get(mgr)
        if found is None:
            found = _registries[mgr] = Registry(_lapsed)
        return found
