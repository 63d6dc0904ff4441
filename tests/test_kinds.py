"""A lock kind added as the architecture page says (a kind, one registration) is served
by the rounds, the watchdog, inspection, ``names()`` and loss reports, on real masters."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from helpers import wait_until

from redreentrant import LockManager
from redreentrant._core import keys, kinds
from redreentrant._sync.lock import Lock
from redreentrant.testing import LocalEnsemble


class DemoKind(kinds.PlainKind):
    """The plain lock's scripts over keys of a family of its own (stem ``demo``)."""

    label = family = noun = "demo"
    stems = ("demo",)

    def _keys(self, name: str) -> tuple[str, ...]:
        return tuple(keys.aux_key(name, s) for s in ("demo", "demo:waiters", "demo:reserved"))

    def key(self, name: str) -> str:
        return keys.aux_key(name, "demo")

    def fence_key(self, name: str) -> str:
        return keys.aux_key(name, "demo:fence")


DEMO = DemoKind()


@pytest.fixture
def demo() -> Iterator[DemoKind]:
    kinds.register(DEMO)
    yield DEMO
    kinds.FAMILIES.remove(DEMO)


def test_a_kind_added_through_its_steps_is_served_like_the_others(
    ensemble: LocalEnsemble, demo: DemoKind
) -> None:
    urls = ensemble.urls[:3]
    lost: list[object] = []
    with LockManager(urls, lease=3.0, on_lost=lost.append) as mgr, LockManager(urls) as other:
        mine = Lock(mgr._engine, mgr._driver, "job", kind=demo)
        theirs = Lock(other._engine, other._driver, "job", kind=demo)
        assert mine.acquire(timeout=1)
        with pytest.raises(ValueError, match="registered already"):
            kinds.register(DemoKind())
        # Its own keys: the plain lock of the name is another lock.
        plain = other.lock("job")
        assert plain.acquire(blocking=False)
        assert not theirs.acquire(blocking=False)
        assert mine.locked() and mine.hold_count == 1
        assert mgr.names() == {"job": ("lock", "demo")}
        assert [v.locks[-1].kind for v in mgr.inspect("job")] == ["demo"] * 3
        # The watchdog renews it (every second): unrenewed, 1.5 s of its 3 s would be left.
        time.sleep(1.6)
        assert mine.is_owned() and mine.remaining() > 2.0
        # Forced open: the holder is told (a lock object of its kind) at its next renewal.
        assert theirs.force_unlock()
        wait_until(lambda: lost, "the loss reported", 5)
        assert isinstance(lost[0], Lock) and lost[0].kind is demo and lost[0].name == "job"
        assert theirs.acquire(timeout=1)
        theirs.release()
        plain.release()
