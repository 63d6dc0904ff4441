"""The multi-lock against real masters: all names or none, reentrant as a whole, one
hold, fencing per name, crossing orders that never deadlock, and nothing left taken
when an acquire fails."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
from helpers import aw, cross, entered, in_threads, lock_keys, on_masters, run, wait_until

import redreentrant.asyncio as ra
from redreentrant import (
    FencingError,
    LockLostError,
    LockManager,
    LockNotOwnedError,
    LockUpgradeError,
    MultiLock,
)
from redreentrant._core.keys import lock_key
from redreentrant.testing import LocalEnsemble


def holders(urls: list[str], name: str) -> list[set[bytes]]:
    return on_masters(urls, lambda r: set(r.hkeys(lock_key(name))))


def test_every_name_is_taken_together_and_excludes_its_plain_lock(
    mgr: LockManager, masters: list[str]
) -> None:
    both = mgr.multi_lock(["from", "to"])
    assert set(both.names) == {"from", "to"}
    with both:
        owner = mgr.owner_id().encode()
        quorum = len(masters) // 2 + 1
        wait_until(lambda: holders(masters, "to").count({owner}) >= quorum, "held on a quorum")
        assert holders(masters, "from") == holders(masters, "to")  # every name, or none
        # A plain lock of one of the names is the same lock: held, by another owner here.
        refused: list[bool] = []
        in_threads(lambda: refused.append(mgr.lock("to").acquire(blocking=False)), timeout=None)
        assert refused == [False]
    wait_until(lambda: holders(masters, "to") == [set()] * len(masters), "released everywhere")
    assert holders(masters, "from") == [set()] * len(masters)


def test_a_grant_is_kept_on_every_master_that_granted_it(
    mgr: LockManager, masters: list[str]
) -> None:
    # As a lock's: the masters the acquire did not wait for keep their grant (a hold on
    # a bare quorum would be lost with one more master).
    with mgr.multi_lock(["x", "y", "z"]):
        owner = {mgr.owner_id().encode()}
        every = [owner] * len(masters)
        wait_until(lambda: all(holders(masters, n) == every for n in "xyz"), "held everywhere")
        time.sleep(0.2)
        assert all(holders(masters, n) == every for n in "xyz")


def test_an_acquire_that_cannot_take_every_name_takes_none(
    mgr: LockManager, masters: list[str], ensemble: LocalEnsemble
) -> None:
    with LockManager(masters, lease=5.0) as other, other.lock("b"):
        many = mgr.multi_lock(["a", "b", "c"])
        assert not many.acquire(blocking=False)
        assert not many.acquire(timeout=0.3)
        assert holders(masters, "a") == holders(masters, "c") == [set()] * len(masters)
    assert many.acquire(blocking=False)
    many.release()


def test_a_multi_lock_is_one_reentrant_owned_hold(mgr: LockManager) -> None:
    many = mgr.multi_lock(["x", "y"])
    with many, many:
        assert many.hold_count == 2 and many.is_owned()
        assert len(mgr._engine.holds._table) == 1  # one hold: one watchdog entry
        signal = many.lost
        errors: list[BaseException] = []

        def other() -> None:
            try:
                many.release()
            except BaseException as error:  # reported below
                errors.append(error)

        in_threads(other, timeout=None)
        assert len(errors) == 1 and isinstance(errors[0], LockNotOwnedError)
        assert not signal.is_set()
    assert not many.is_owned()
    with pytest.raises(ValueError, match="at least one name"):
        mgr.multi_lock([])
    with pytest.raises(TypeError):
        mgr.multi_lock("ab")  # a str is one name, not a list of names


def test_crossing_orders_never_deadlock_and_exclude_each_other(masters: list[str]) -> None:
    # Four threads take overlapping sets named in crossing orders.
    sets = [["a", "b"], ["b", "a"], ["b", "c", "d"], ["d", "c", "a"]]
    managers = [LockManager(masters, lease=5.0) for _ in sets]
    try:
        counters = cross(managers, sets, rounds=8, pause=0.002)
    finally:
        for m in managers:
            m.close()
    assert counters == {"a": 24, "b": 24, "c": 16, "d": 16}


def test_a_waiter_is_woken_by_a_plain_release_of_any_of_its_names(
    ensemble: LocalEnsemble,
) -> None:
    urls = ensemble.urls[:3]
    with LockManager(urls, lease=30.0) as a, LockManager(urls, lease=30.0) as b:
        held = a.lock("q")
        held.acquire()
        got: list[float] = []

        def wait() -> None:
            started = time.monotonic()
            with b.multi_lock(["p", "q"]):
                got.append(time.monotonic() - started)

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.3)  # it registered as a waiter of both names
        held.release()
        t.join(30)
    assert got and got[0] < 10  # woken by the release, not by the 30 s lease


def test_fencing_gives_each_name_a_token_that_grows(
    mgr: LockManager, ensemble: LocalEnsemble
) -> None:
    many = mgr.multi_lock(["f1", "f2"], fencing=True)
    with many:
        first = many.tokens
        assert set(first) == {"f1", "f2"}
    with mgr.lock("f2", fencing=True) as single:
        alone = single.token
    assert alone > first["f2"]  # the name's own counter: shared with its plain lock
    with many:
        assert many.tokens["f1"] > first["f1"] and many.tokens["f2"] > alone
        with pytest.raises(FencingError, match="a token per name"):
            _ = many.token
    ensemble.flushall()  # the counters outlive their locks on purpose


def test_the_watchdog_renews_a_multi_lock_and_reports_its_loss(ensemble: LocalEnsemble) -> None:
    urls = ensemble.urls[:3]
    lost: list[object] = []
    with LockManager(urls, lease=1.0, on_lost=lost.append) as m:
        many = m.multi_lock(["r1", "r2"])
        many.acquire()
        time.sleep(2.5)  # more than two leases
        many.ensure_held()
        signal = many.lost
        for url in urls[:2]:  # one of its names vanishes from a quorum
            with redis.Redis.from_url(url) as r:
                r.delete(lock_key("r2"))
        assert signal.wait(5)
        wait_until(lambda: lost, "on_lost called")
        assert isinstance(lost[0], MultiLock) and set(lost[0].names) == {"r1", "r2"}
        with pytest.raises(LockLostError):
            many.release()
    ensemble.flushall()


def test_asyncio_multi_lock(masters: list[str]) -> None:
    async def main() -> int:
        most = inside = 0
        async with ra.LockManager(masters, lease=5.0) as m:

            async def work(names: list[str]) -> None:
                nonlocal inside, most
                for _ in range(3):
                    async with m.multi_lock(names):
                        inside += 1
                        most = max(most, inside)
                        await asyncio.sleep(0.01)
                        inside -= 1

            await asyncio.gather(work(["a", "b"]), work(["b", "a"]), work(["b", "c"]))
        return most

    assert run(main()) == 1


@pytest.mark.parametrize("manager", [LockManager, ra.LockManager], ids=["sync", "asyncio"])
def test_an_owner_cannot_hold_a_name_alone_and_in_a_multi_lock(
    masters: list[str], manager: Any
) -> None:
    # The masters keep one hold count per name and owner: held both ways, the release
    # of one would free the other's name while its holder believes it holds it.
    async def main() -> None:
        async with entered(manager(masters, lease=5.0)) as mgr:
            owner = {mgr.owner_id().encode()}
            plain = mgr.lock("a")
            async with entered(plain), entered(plain):
                with pytest.raises(LockUpgradeError, match="'a' is held by this owner already"):
                    await aw(mgr.multi_lock(["a", "b"]).acquire(blocking=False))
                assert holders(masters, "b") == [set()] * len(masters)  # nothing taken
                assert plain.hold_count == 2
            async with entered(mgr.multi_lock(["a", "b"])) as both:
                with pytest.raises(LockUpgradeError, match="'a' is held by this owner in a multi"):
                    await aw(plain.acquire(timeout=1))
                with pytest.raises(LockUpgradeError):
                    await aw(mgr.multi_lock(["b", "c"]).acquire(timeout=1))
                assert both.hold_count == 1 and plain.hold_count == 0
                assert holders(masters, "a") == [owner] * len(masters)
            # Each way on its own still works.
            async with entered(plain):
                pass
            async with entered(mgr.multi_lock(["b", "c"])):
                pass

    run(main())
    freed = [set()] * len(masters)
    wait_until(lambda: holders(masters, "a") == holders(masters, "b") == freed, "freed")


def test_keys_are_gone_after_use(mgr: LockManager, ensemble: LocalEnsemble) -> None:
    with mgr.multi_lock(["k1", "k2", "k3"]):
        pass
    wait_until(lambda: not any(lock_keys(ensemble).values()), "nothing left")


@pytest.mark.parametrize("manager", [LockManager, ra.LockManager], ids=["sync", "asyncio"])
def test_a_name_given_twice_is_taken_once(
    masters: list[str], ensemble: LocalEnsemble, manager: Any
) -> None:
    # transfer(x, x) of docs/multi-lock.md: the multi-lock of ["a", "a"] is that of ["a"].
    async def main() -> None:
        async with entered(manager(masters, lease=5.0, fencing=True)) as mgr:
            twice = mgr.multi_lock(["a", "a"])
            assert twice.names == ("a",)
            async with entered(twice):
                tokens = twice.tokens
                assert set(tokens) == {"a"}
                with pytest.raises(FencingError, match="a token per name"):
                    _ = twice.token
                owner = mgr.owner_id().encode()
                wait_until(lambda: holders(masters, "a") == [{owner}] * len(masters), "held")
            async with entered(mgr.lock("a")) as single:  # the name's own counter
                assert single.token > tokens["a"]

    run(main())
    assert holders(masters, "a") == [set()] * len(masters)
    ensemble.flushall()  # the counters outlive their locks on purpose


def test_fence_floor_is_the_largest_of_the_names_and_raises_them_all(
    masters: list[str], ensemble: LocalEnsemble
) -> None:
    with LockManager(masters, lease=5.0, fencing=True) as m:
        many = m.multi_lock(["g1", "g2"])
        with many:
            first = many.tokens
        floor = many.fence_floor()
        assert floor == max(first.values())  # every counter kept: the largest of them
        assert many.raise_fence(floor) == len(masters)
        with many:
            assert many.tokens == {"g1": floor + 1, "g2": floor + 1}

    async def main() -> tuple[int, int]:
        async with ra.LockManager(masters, lease=5.0) as a:
            return await a.multi_lock(["g1", "g2"]).fence_floor(), await a.lock("g1").fence_floor()

    assert run(main()) == (floor + 1, floor + 1)
    ensemble.flushall()  # the counters outlive their locks on purpose
