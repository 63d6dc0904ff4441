"""Explicit lease control (extend, valid_until, max_hold) and the lost signal of a hold
(lock.lost, ensure_held, asyncio's cancel_on_loss), against real masters."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from helpers import delete_everywhere, on_masters

import redreentrant.asyncio as aio
from redreentrant import LockLostError, LockManager, LockNotOwnedError, LostSignal
from redreentrant._core.keys import aux_key, lock_key
from redreentrant.testing import LocalEnsemble


def pttls(urls: list[str], key: str) -> list[int]:
    return on_masters(urls, lambda r: int(r.pttl(key)))


# -- extend and valid_until ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lock", "fair", "write", "read"])
def test_extend_adds_or_sets_the_lease_on_a_quorum(urls: list[str], kind: str) -> None:
    with LockManager(urls) as mgr:
        lock = {
            "lock": lambda: mgr.lock("ext"),
            "fair": lambda: mgr.fair_lock("ext"),
            "write": lambda: mgr.rw_lock("ext").write,
            "read": lambda: mgr.rw_lock("ext").read,
        }[kind]()
        assert lock.valid_until == 0.0  # not held
        assert lock.acquire(lease=2)
        first = lock.valid_until
        assert 1.5 < first - time.monotonic() <= 2
        lock.extend(3)  # adds: about 5 s from the acquire
        assert 4.5 < lock.valid_until - time.monotonic() <= 5
        assert lock.valid_until > first
        key = lock.kind.key("ext")
        assert all(4000 < t <= 5000 for t in pttls(urls, key))
        lock.extend(1, replace=True)  # sets: about 1 s from now
        assert 0.5 < lock.valid_until - time.monotonic() <= 1
        assert all(0 < t <= 1000 for t in pttls(urls, key))
        lock.release()
        with pytest.raises(LockNotOwnedError):
            lock.extend(1)


def test_extend_refuses_a_managed_hold_and_bad_values_changing_nothing(
    manager: LockManager,
) -> None:
    lock = manager.lock("managed")
    with lock:
        before = lock.valid_until
        with pytest.raises(ValueError, match="watchdog"):
            lock.extend(5)
        assert lock.valid_until == before and lock.is_owned()
    fixed = manager.lock("fixed")
    assert fixed.acquire(lease=5)
    before = fixed.valid_until
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError):
            fixed.extend(bad)
    with pytest.raises(TypeError):
        fixed.extend("1")  # type: ignore[arg-type]
    assert fixed.valid_until == before and fixed.is_owned()
    fixed.release()


def test_extend_never_recreates_an_expired_key_nor_touches_a_new_owner(urls: list[str]) -> None:
    with LockManager(urls, master_timeout=0.02) as a, LockManager(urls) as b:
        old = a.lock("expired")
        assert old.acquire(lease=0.3)
        time.sleep(0.4)  # the lease ran out: the key is gone everywhere
        with pytest.raises(LockLostError):
            old.extend(5)
        assert pttls(urls, lock_key("expired")) == [-2] * 5  # not made again
        new = b.lock("expired")
        assert new.acquire(lease=5)
        with pytest.raises(LockLostError):
            old.extend(5)
        with pytest.raises(LockLostError):
            old.release()
        assert new.locked() and all(4000 < t <= 5000 for t in pttls(urls, lock_key("expired")))
        new.release()


def test_extend_reports_a_hold_deleted_from_a_quorum_as_lost(urls: list[str]) -> None:
    with LockManager(urls) as mgr:
        lock = mgr.lock("gone")
        assert lock.acquire(lease=5)
        delete_everywhere(urls[:3], lock_key("gone"))
        with pytest.raises(LockLostError, match="no hold on a quorum"):
            lock.extend(1)
        assert lock.lost.is_set() and not lock.is_owned()
        with pytest.raises(LockLostError):
            lock.release()
    delete_everywhere(urls, lock_key("gone"))


# -- max_hold ------------------------------------------------------------------------------


def test_max_hold_stops_renewals_and_reports_the_loss_before_validity_ends(
    urls: list[str],
) -> None:
    reported = threading.Event()
    with LockManager(urls, lease=1.5, on_lost=lambda lock: reported.set()) as mgr:
        lock = mgr.lock("runaway")
        assert lock.acquire(max_hold=1.0)
        started = time.monotonic()
        assert lock.lost.wait(5), "max_hold was not enforced"
        held_for = time.monotonic() - started
        # Renewed until max_hold (the lease is 1.5 s), then reported before its end.
        assert 1.0 < held_for < 1.0 + 1.5
        assert reported.wait(2)
        with pytest.raises(LockLostError, match="max_hold"):
            lock.ensure_held()
        with pytest.raises(LockLostError):
            lock.release()


def test_max_hold_of_the_manager_and_its_checks(urls: list[str]) -> None:
    with LockManager(urls, lease=1.5, max_hold=0.8) as mgr:
        lock = mgr.lock("capped")
        with pytest.raises(LockLostError, match="max_hold"), lock:  # raised by the exit
            assert lock.lost.wait(5)
        with pytest.raises(ValueError, match="fixed lease"):
            mgr.lock("x").acquire(lease=2, max_hold=1)
        with mgr.lock("y") as y, pytest.raises(ValueError, match="re-entry"):
            y.acquire(max_hold=1)
    for bad in (0, -1):
        with pytest.raises(ValueError):
            LockManager(urls, max_hold=bad)


# -- the lost signal and ensure_held -------------------------------------------------------


def test_lost_is_set_when_the_watchdog_finds_the_hold_gone(urls: list[str]) -> None:
    with LockManager(urls, lease=1.5) as mgr:
        lock = mgr.lock("watched")
        with pytest.raises(LockNotOwnedError):
            _ = lock.lost
        assert lock.acquire()
        signal = lock.lost
        assert isinstance(signal, LostSignal) and signal is lock.lost
        assert not signal.is_set() and not signal.wait(0.05)
        lock.ensure_held()  # held: nothing raised
        delete_everywhere(urls, lock_key("watched"))
        assert signal.wait(3)  # the next renewal finds it gone
        with pytest.raises(LockLostError):
            lock.ensure_held()
        with pytest.raises(LockLostError):
            lock.release()


def test_a_fixed_lease_that_ran_out_counts_as_lost(urls: list[str]) -> None:
    with LockManager(urls, master_timeout=0.02) as mgr:
        lock = mgr.lock("fixed-out")
        assert lock.acquire(lease=0.3)
        started = time.monotonic()
        assert lock.lost.wait(2)  # no watchdog: the validity's end sets it
        assert time.monotonic() - started < 1
        with pytest.raises(LockLostError, match="fixed lease ran out"):
            lock.ensure_held()
        # The validity ends a drift allowance before the keys do: the release then
        # finds the keys gone.
        time.sleep(0.05)
        with pytest.raises(LockLostError):
            lock.release()


def test_a_normal_release_is_not_a_loss(manager: LockManager) -> None:
    lock = manager.lock("normal")
    with lock:
        signal = lock.lost
    assert not signal.is_set()
    with pytest.raises(LockNotOwnedError):
        lock.ensure_held()


# -- asyncio -------------------------------------------------------------------------------


def test_asyncio_extend_lost_and_ensure_held(urls: list[str]) -> None:
    async def main() -> None:
        async with aio.LockManager(urls, lease=1.5) as mgr:
            lock = mgr.lock("a-ext")
            assert await lock.acquire(lease=1)
            await lock.extend(2)
            assert 2.5 < lock.valid_until - time.monotonic() <= 3
            assert isinstance(lock.lost, aio.LostSignal) and not lock.lost.is_set()
            lock.ensure_held()
            await lock.release()
            watched = mgr.lock("a-watched")
            assert await watched.acquire()
            delete_everywhere(urls, lock_key("a-watched"))
            assert await watched.lost.wait(3)
            with pytest.raises(LockLostError):
                watched.ensure_held()
            with pytest.raises(LockLostError):
                await watched.release()

    asyncio.run(main())


def test_cancel_on_loss_stops_the_work_and_raises_lock_lost(urls: list[str]) -> None:
    steps: list[str] = []

    async def main() -> None:
        async with aio.LockManager(urls, lease=1.5) as mgr:
            try:
                async with mgr.lock("c", cancel_on_loss=True):
                    steps.append("held")
                    delete_everywhere(urls, lock_key("c"))
                    await asyncio.sleep(10)  # cancelled once the loss is found
                    steps.append("ran on unprotected")
            except LockLostError as error:
                steps.append("lost")
                assert isinstance(error.__cause__, asyncio.CancelledError)
            await asyncio.sleep(0)  # the task goes on: the cancellation was taken back
            steps.append("after")

    started = time.monotonic()
    asyncio.run(main())
    assert steps == ["held", "lost", "after"]
    assert time.monotonic() - started < 5


def test_cancel_on_loss_with_a_fixed_lease(urls: list[str]) -> None:
    async def main() -> str:
        async with aio.LockManager(urls, master_timeout=0.02) as mgr:
            lock = mgr.fair_lock("cfx", cancel_on_loss=True)
            try:
                assert await lock.acquire(lease=0.3)
                await asyncio.sleep(10)  # cancelled when the fixed lease runs out
            except asyncio.CancelledError:
                with pytest.raises(LockLostError):
                    await lock.release()
                return "cancelled"
            return "ran on unprotected"

    started = time.monotonic()
    assert asyncio.run(main()) == "cancelled"
    assert time.monotonic() - started < 3
    delete_everywhere(urls, aux_key("cfx", "fair"))


def test_cancel_on_loss_checks_its_argument(ensemble: LocalEnsemble) -> None:
    async def main() -> None:
        async with aio.LockManager(ensemble.urls) as mgr:
            with pytest.raises(TypeError):
                mgr.lock("x", cancel_on_loss=1)  # type: ignore[arg-type]

    asyncio.run(main())
