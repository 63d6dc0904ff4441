"""Locks owned by an object (``owner=``) against real masters: any thread or task may
take, re-enter and release the object's holds, reentrancy counts per owner, and a
collected owner's holds are released and reported as a dead thread's are; for every
kind, sync and asyncio."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from helpers import FLAVOURS, aw, drop_counters, entered, in_threads, lock_keys, run, wait_until

import redreentrant.asyncio as ra
from redreentrant import LockManager, LockNotOwnedError, OwnerInfo, parse_owner
from redreentrant.testing import LocalEnsemble


class Request:
    """An application's object that owns locks."""


def test_an_objects_hold_is_taken_in_one_thread_and_released_in_another(
    mgr: LockManager,
) -> None:
    request = Request()
    lock = mgr.lock("job", owner=request)
    assert lock.acquire()
    assert lock.acquire()  # re-entered by the same owner, from any thread
    counts: list[int] = []
    in_threads(lambda: (lock.release(), counts.append(lock.hold_count)), timeout=10)
    assert counts == [1] and lock.is_owned()
    # The calling thread is another owner: it waits like anyone else.
    assert not mgr.lock("job").acquire(blocking=False)
    # Another object is another owner too; a view made anew of the same owner is not.
    assert not mgr.lock("job", owner=Request()).acquire(blocking=False)
    assert mgr.lock("job", owner=request).hold_count == 1
    in_threads(lock.release, timeout=10)
    assert not lock.is_owned()
    with pytest.raises(LockNotOwnedError):
        lock.release()


def test_the_owner_id_names_an_object(mgr: LockManager) -> None:
    request = Request()
    with mgr.lock("named", owner=request):
        [holder] = next(v for v in mgr.inspect("named") if v.locks).locks[0].holders
        info = parse_owner(holder)
        assert isinstance(info, OwnerInfo) and info.kind == "object"
        assert info.name == "Request" and info.token.startswith("o")


def test_every_kind_takes_an_owner(mgr: LockManager, ensemble: LocalEnsemble) -> None:
    request = Request()
    rw = mgr.rw_lock("rw", owner=request)
    locks = [
        mgr.fair_lock("fair", owner=request),
        mgr.semaphore("sem", permits=1, owner=request),
        mgr.multi_lock(["m1", "m2"], owner=request),
        mgr.election("elected", owner=request),
        rw.write,
    ]
    for lock in locks:
        assert lock.acquire(timeout=5)
    in_threads(lambda: [lock.release() for lock in locks], timeout=10)
    assert not any(lock.is_owned() for lock in locks)
    with rw.upgradeable:  # the upgradeable reader, of the same owner, from this thread
        pass
    drop_counters(ensemble)  # the election's terms


@pytest.mark.parametrize("api", FLAVOURS)
def test_a_collected_owners_holds_are_released_and_reported(
    ensemble: LocalEnsemble, api: Any
) -> None:
    lost: list[object] = []

    async def main() -> None:
        urls = ensemble.urls[:3]
        async with entered(api.LockManager(urls, lease=5.0, on_lost=lost.append)) as m:
            request = Request()
            await aw(m.lock("orphan", owner=request).acquire())
            await aw(m.semaphore("orphans", permits=2, owner=request).acquire())
            del request
            gc.collect()
            # Waited for in a thread: the asyncio manager's loop goes on meanwhile.
            await asyncio.to_thread(wait_until, lambda: len(lost) == 2, "both holds reported")
            await asyncio.to_thread(
                wait_until, lambda: not lock_keys(ensemble), "released on every master"
            )
            assert await aw(m.lock("orphan").acquire(blocking=False))  # before the lease ends
            await aw(m.lock("orphan").release())

    run(main())


def test_an_owner_must_be_weakly_referable(mgr: LockManager) -> None:
    with pytest.raises(TypeError, match="weakly referenced"):
        mgr.lock("x", owner="a string")


def test_asyncio_an_objects_hold_moves_between_tasks(masters: list[str]) -> None:
    async def main() -> None:
        async with ra.LockManager(masters, lease=5.0) as m:
            request = Request()
            lock = m.lock("aio-job", owner=request)
            # A task of its own may take it: the object, not the task, owns it.
            assert await asyncio.create_task(lock.acquire())
            assert not await m.lock("aio-job").acquire(blocking=False)
            await asyncio.create_task(lock.release())
            assert not lock.is_owned()
            async with m.lock("aio-job"):
                assert not await lock.acquire(blocking=False)

    run(main())


def test_a_collected_owners_fixed_lease_hold_is_forgotten_and_lapses(
    ensemble: LocalEnsemble,
) -> None:
    # Nobody can release it: it lapses on the masters, and the manager forgets it.
    urls = ensemble.urls[:3]
    with LockManager(urls, lease=5.0) as m:
        request = Request()
        m.lock("brief", owner=request).acquire(lease=0.2)
        assert m.shortest_lease < 0.2
        del request
        gc.collect()
        wait_until(lambda: not m._engine.holds.all(), "the hold forgotten")
        wait_until(lambda: not lock_keys(ensemble), "lapsed on the masters")


def test_asyncio_a_release_cancelled_mid_round_frees_the_lock_and_is_cancelled(
    masters: list[str],
) -> None:
    async def main() -> None:
        async with ra.LockManager(masters, lease=5.0) as m:
            request = Request()
            lock = m.lock("cancelled-release", owner=request)
            for _ in range(5):
                assert await lock.acquire()
                releasing = asyncio.create_task(lock.release())
                await asyncio.sleep(0)  # the release's round is under way
                releasing.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await releasing
                assert not lock.is_owned()
                assert await m.lock("cancelled-release").acquire(blocking=False)
                await m.lock("cancelled-release").release()

    run(main())
