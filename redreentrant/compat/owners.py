"""The owners of the holds the adapters take, and one registry of them per manager.

An adapter takes each hold for an owner object of its own (``mgr.lock(name,
owner=...)``), and keeps the owner, under a key of its choosing (a name and a token or
an id), while the hold may be used again: extended or released by any adapter object of
the same masters. An owner dropped from the registry, once collected, ends as an owner:
its manager forgets its holds, which lapse on the masters.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable
from typing import Any


class Owner:
    """The owner of one hold: its lock (``mgr.lock(name, owner=self)``) in ``lock``."""

    __slots__ = ("__weakref__", "lock")

    def __init__(self) -> None:
        self.lock: Any = None


class Registry:
    """One manager's owners, by key. The owners whose hold's validity ran out are
    dropped when the table doubled since it was last looked through (see :meth:`add`),
    so that holds never given back do not pile up."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._owners: dict[Hashable, Owner] = {}
        #: the table's size at which lapsed owners are looked for next
        self.limit = 256

    def __len__(self) -> int:
        return len(self._owners)

    def get(self, key: Hashable) -> Owner | None:
        return self._owners.get(key)

    def add(self, key: Hashable, owner: Owner) -> None:
        with self._guard:
            owners = self._owners
            owners[key] = owner
            if len(owners) >= self.limit:
                for lapsed in [k for k, o in owners.items() if o.lock.remaining() <= 0]:
                    del owners[lapsed]
                self.limit = max(256, 2 * len(owners))

    def pop(self, key: Hashable) -> Owner | None:
        with self._guard:
            return self._owners.pop(key, None)


_guard = threading.Lock()
_registries: weakref.WeakKeyDictionary[object, Registry] = weakref.WeakKeyDictionary()


def registry(mgr: object) -> Registry:
    """The registry of ``mgr``'s owners (made on first use, gone with the manager)."""
    with _guard:
        found = _registries.get(mgr)
        if found is None:
            found = _registries[mgr] = Registry()
        return found
