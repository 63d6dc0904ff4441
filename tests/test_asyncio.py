"""The asyncio twin against real masters: ownership by task, faults, variants, and
cancellation at every await point of acquire and release."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
from helpers import aincrement, increment, lock_keys, on_masters, registered, run

import redreentrant
from redreentrant._core.keys import lock_key
from redreentrant.asyncio import (
    LockLostError,
    LockManager,
    LockNotOwnedError,
    LockUpgradeError,
    QuorumUnavailableError,
)
from redreentrant.testing import LocalEnsemble


def test_tasks_own_what_they_acquire_and_reenter(urls: list[str]) -> None:
    async def main() -> None:
        async with LockManager(urls) as mgr:
            lock = mgr.lock("tasks")
            async with lock, lock:
                assert lock.hold_count == 2 and lock.is_owned() and await lock.locked()

                async def other() -> tuple[bool, str]:
                    try:
                        await lock.release()
                    except LockNotOwnedError:
                        outcome = "not owned"
                    return await lock.acquire(blocking=False), outcome

                assert await asyncio.create_task(other()) == (False, "not owned")
                assert lock.hold_count == 2
            assert not await lock.locked()

    run(main())


def test_an_acquire_outside_a_task_is_refused(urls: list[str]) -> None:
    mgr = LockManager(urls)
    with pytest.raises(RuntimeError, match="task"):
        mgr.lock("x").hold_count  # noqa: B018  (the property asks for the owner)


def test_bad_input_is_refused_before_anything_is_sent(
    urls: list[str], ensemble: LocalEnsemble
) -> None:
    async def main() -> None:
        async with LockManager(urls) as mgr:
            for kwargs in ({"lease": 0}, {"timeout": -2}, {"blocking": False, "timeout": 1}):
                with pytest.raises(ValueError):
                    await mgr.lock("bad").acquire(**kwargs)  # type: ignore[arg-type]
            with pytest.raises(ValueError):
                mgr.lock("")

    run(main())
    with pytest.raises(ValueError, match="given twice"):
        LockManager([urls[0], urls[0]])
    with pytest.raises(ValueError, match="at least one"):
        LockManager([])
    assert lock_keys(ensemble) == {}


def test_two_down_still_lock_and_three_down_fail_cleanly(ensemble: LocalEnsemble) -> None:
    async def main() -> None:
        async with LockManager(ensemble.urls, master_timeout=0.1) as mgr:
            ensemble[0].kill()
            ensemble[4].pause()
            async with mgr.lock("down") as lock:
                assert lock.is_owned()
            ensemble[2].kill()
            with pytest.raises(QuorumUnavailableError) as raised:
                await mgr.lock("down").acquire(timeout=2)
            assert len(raised.value.errors) == 3
            ensemble[4].resume()  # thawed while the manager is open: the undos run
            for _ in range(200):
                if not lock_keys(ensemble):
                    break
                await asyncio.sleep(0.02)

    run(main())
    assert lock_keys(ensemble) == {}


def test_the_watchdog_task_keeps_a_short_lease_alive(urls: list[str]) -> None:
    async def main() -> None:
        async with (
            LockManager(urls, lease=1.0) as mgr,
            LockManager(urls) as rival,
            mgr.lock("kept") as lock,
        ):
            for _ in range(10):
                await asyncio.sleep(0.25)
                assert not await rival.lock("kept").acquire(blocking=False)
            assert lock.is_owned()

    run(main())


def test_a_deleted_lease_is_reported_to_an_async_hook(ensemble: LocalEnsemble) -> None:
    async def main() -> None:
        seen = asyncio.Event()

        async def on_lost(lock: object) -> None:
            assert getattr(lock, "name", None) == "gone"
            seen.set()

        async with LockManager(ensemble.urls, lease=1.0, on_lost=on_lost) as mgr:
            lock = mgr.lock("gone")
            with pytest.raises(LockLostError):
                async with lock, lock:
                    on_masters(ensemble.urls, lambda r: r.delete(lock_key("gone")))
                    await asyncio.wait_for(seen.wait(), 3)
            assert lock.hold_count == 0

    run(main())


def test_a_release_hands_over_through_pub_sub(urls: list[str]) -> None:
    async def main() -> None:
        async with LockManager(urls, lease=30) as one, LockManager(urls, lease=30) as two:
            await one.lock("handoff").acquire()

            async def wait() -> bool:
                lock = two.lock("handoff")
                got = await lock.acquire(timeout=20)  # the holder's lease is 30 s
                if got:
                    await lock.release()
                return got

            waiter = asyncio.create_task(wait())
            while registered(urls[:1], "handoff") == [[]]:  # it waits
                await asyncio.sleep(0.01)
            await one.lock("handoff").release()
            assert await waiter, "woken by the release, not by the 30 s lease"

    run(main())


def test_tasks_exclude_each_other_across_managers(urls: list[str]) -> None:
    async def main() -> None:
        managers = [LockManager(urls) for _ in range(2)]
        counter = [0]

        async def work(mgr: LockManager) -> None:
            lock = mgr.lock("counter")
            for _ in range(10):
                async with lock:
                    await aincrement(counter, 0, 0.002)

        await asyncio.gather(*(work(managers[i % 2]) for i in range(4)))
        for m in managers:
            await m.close()
        assert counter[0] == 40

    run(main())


def test_sync_threads_and_async_tasks_contend_for_one_lock(urls: list[str]) -> None:
    counter = [0]

    def sync_worker() -> None:
        with redreentrant.LockManager(urls) as mgr:
            lock = mgr.lock("mixed")
            for _ in range(10):
                with lock:
                    increment(counter, 0, 0.002)

    async def async_worker(mgr: LockManager) -> None:
        lock = mgr.lock("mixed")
        for _ in range(10):
            async with lock:
                await aincrement(counter, 0, 0.002)

    async def main() -> None:
        async with LockManager(urls) as mgr:
            await asyncio.gather(async_worker(mgr), async_worker(mgr))

    threads = [threading.Thread(target=sync_worker) for _ in range(2)]
    for t in threads:
        t.start()
    run(main())
    for t in threads:
        t.join(timeout=60)
    assert counter[0] == 40


def test_read_write_semantics_with_tasks(urls: list[str]) -> None:
    async def main() -> None:
        async with LockManager(urls) as mgr, LockManager(urls) as other:
            rw, theirs = mgr.rw_lock("rw"), other.rw_lock("rw")
            held, done = asyncio.Event(), asyncio.Event()

            async def other_reader() -> None:
                assert await theirs.read.acquire(blocking=False)
                held.set()
                await done.wait()
                await theirs.read.release()

            async with rw.read:
                reader = asyncio.create_task(other_reader())
                await held.wait()
                with pytest.raises(LockUpgradeError):
                    await rw.write.acquire(timeout=10)
            done.set()
            await reader
            async with rw.write:
                await rw.read.acquire()  # a writer may read, and keeps it (downgrade)
            assert rw.read.hold_count == 1 and await rw.read.locked()
            assert not await theirs.write.acquire(blocking=False)
            await rw.read.release()

    run(main())


def test_fair_lock_serves_tasks_in_order_of_arrival(urls: list[str]) -> None:
    async def main() -> None:
        async with LockManager(urls) as mgr, LockManager(urls) as other:
            order: list[int] = []

            async def wait(i: int) -> None:
                async with other.fair_lock("fifo"):
                    order.append(i)

            async with mgr.fair_lock("fifo"):
                tasks = []
                for i in range(6):
                    tasks.append(asyncio.create_task(wait(i)))
                    await asyncio.sleep(0.1)
            await asyncio.gather(*tasks)
            assert order == list(range(6))

    run(main())


# -- cancellation at every await point --------------------------------------------------


def cancelling_at(mgr: LockManager, k: int) -> list[int]:
    """Make ``mgr`` cancel the running task when it reaches its k-th effect (counting
    until ``seen[1]`` is set)."""
    seen = [0, 0]
    driver = mgr._driver  # the test reaches into the driver to cancel at each effect
    carry_out = driver._carry_out

    async def carry(effect: object, watched: list[str]) -> object:
        if seen[1]:
            return await carry_out(effect, watched)
        seen[0] += 1
        if seen[0] == k:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
        return await carry_out(effect, watched)

    driver._carry_out = carry  # type: ignore[method-assign]
    return seen


KINDS: dict[str, Callable[[LockManager], Any]] = {
    "lock": lambda m: m.lock("cancel"),
    "write": lambda m: m.rw_lock("cancel").write,
    "fair": lambda m: m.fair_lock("cancel"),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cancelling_an_acquire_anywhere_leaves_nothing_behind(
    urls: list[str], ensemble: LocalEnsemble, kind: str
) -> None:
    make = KINDS[kind]

    async def attempt(k: int) -> tuple[bool, int]:
        """A contended acquire, cancelled at its k-th effect; (cancelled?, effects)."""
        async with LockManager(urls) as holder, LockManager(urls) as mgr:
            held = asyncio.Event()

            async def hold_a_while() -> None:
                async with make(holder):
                    held.set()
                    await asyncio.sleep(0.3)

            freeing = asyncio.create_task(hold_a_while())
            await held.wait()
            seen = cancelling_at(mgr, k)
            lock = make(mgr)
            cancelled = False
            try:
                assert await lock.acquire(timeout=5)
                seen[1] = 1  # count the acquire's await points only
                await lock.release()
            except asyncio.CancelledError:
                cancelled = True
            seen[1] = 1
            await freeing
            # Nothing of the cancelled acquire is left: the lock is free, no queue.
            for view in await mgr.inspect("cancel"):
                assert view.locks == [], (k, view)
            assert lock.hold_count == 0
            return cancelled, seen[0]

    async def main() -> None:
        _, effects = await attempt(0)  # an uncancelled run counts the await points
        assert effects >= 4  # a round, the subscription, a round, a wait, a round
        hit = 0
        for k in range(1, effects + 1):
            cancelled, seen = await attempt(k)
            # A run may take fewer steps than the first (timing): then k was not reached.
            assert cancelled or seen < k, f"cancellation at effect {k} did not propagate"
            hit += cancelled
            assert lock_keys(ensemble) == {}, k
        assert hit >= 4

    run(main())


def test_cancelling_a_release_still_frees_the_lock(urls: list[str]) -> None:
    async def main() -> None:
        async with LockManager(urls, lease=30) as mgr, LockManager(urls) as rival:
            in_round = asyncio.Event()
            driver = mgr._driver
            carry_out = driver._carry_out

            async def carry(effect: object, watched: list[str]) -> object:
                in_round.set()  # the release round is under way
                await asyncio.sleep(0.05)  # ... and still is when the caller is cancelled
                return await carry_out(effect, watched)

            async def owner() -> None:
                lock = mgr.lock("release-cancel")
                await lock.acquire()
                driver._carry_out = carry  # type: ignore[method-assign]
                await lock.release()

            task = asyncio.create_task(owner())
            await in_round.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The release went on under the shield: free now, not in 30 s.
            assert await rival.lock("release-cancel").acquire(timeout=2)
            await rival.lock("release-cancel").release()

    run(main())


def test_close_stops_the_watchdog_and_readers(urls: list[str]) -> None:
    async def main() -> None:
        mgr = LockManager(urls, lease=1.0)
        async with mgr.lock("closing"):
            pass
        waiter_mgr = LockManager(urls)
        async with mgr.lock("closing"):

            async def wait_briefly() -> bool:
                return await waiter_mgr.lock("closing").acquire(timeout=0.3)

            assert not await asyncio.create_task(wait_briefly())
        await mgr.close()
        await waiter_mgr.close()
        leftover = [
            t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()
        ]
        await asyncio.sleep(0)  # let cancelled unsubscribe tasks finish
        assert all(t.done() for t in leftover) or not leftover

    run(main())


Wrapped = Callable[[], Awaitable[None]]


def test_flushed_scripts_and_a_restarted_master_are_handled(ensemble: LocalEnsemble) -> None:
    async def main() -> None:
        async with LockManager(ensemble.urls, master_timeout=0.2) as mgr:
            lock = mgr.lock("reload")
            async with lock:
                pass
            on_masters(ensemble.urls, lambda r: r.script_flush())
            ensemble[1].restart()  # its kept connections are dead now
            async with lock:
                assert lock.is_owned()
            ensemble[2].pause()  # one round waits out the master timeout, then goes on
            async with lock:
                assert lock.is_owned()
            ensemble[2].resume()

    run(main())
    assert lock_keys(ensemble) == {}


def test_a_local_release_wakes_local_waiting_tasks_without_pubsub(
    ensemble: LocalEnsemble,
) -> None:
    # Every pub/sub connection is cut before the release: only the in-process wake-up
    # (and not the 60 s lease) can hand the lock to the waiting tasks.
    def waiting() -> int:
        return min(len(r) for r in registered(ensemble.urls, "local"))

    async def main() -> list[int]:
        order: list[int] = []
        async with LockManager(ensemble.urls, lease=60.0) as mgr:
            lock = mgr.lock("local")
            await lock.acquire()

            async def wait(i: int) -> None:
                if await lock.acquire(timeout=20):
                    order.append(i)
                    await lock.release()

            tasks = [asyncio.create_task(wait(i)) for i in range(3)]
            while waiting() < 3:
                await asyncio.sleep(0.01)
            on_masters(ensemble.urls, lambda r: r.client_kill_filter(_type="pubsub"))
            await lock.release()
            await asyncio.gather(*tasks)
        return order

    assert sorted(run(main())) == [0, 1, 2]


@pytest.mark.parametrize("masters", [1, 3])
def test_acquires_cancelled_mid_send_give_their_connections_back(
    urls: list[str], monkeypatch: pytest.MonkeyPatch, masters: int
) -> None:
    """A send waits when the socket's buffer is full; an acquire cancelled then (a
    caller's time-out) must not keep the connection it was sending on: with a
    bounded pool, a few such cancellations would leave no connection to make a round
    with."""
    stalling = asyncio.Event()
    stalled = asyncio.Event()
    send = redis.asyncio.Connection.send_packed_command

    async def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
        if stalling.is_set():  # this send only: the acquire's clean-up is sent as usual
            stalling.clear()
            stalled.set()
            try:
                await asyncio.Event().wait()  # the buffer stays full
            except BaseException:
                await self.disconnect(nowait=True)  # as redis-py does when interrupted
                raise
        await send(self, command, check_health)

    monkeypatch.setattr(redis.asyncio.Connection, "send_packed_command", send_packed_command)

    async def main() -> None:
        clients = [redis.asyncio.Redis.from_url(u, max_connections=2) for u in urls[:masters]]
        try:
            async with LockManager(clients, lease=30) as mgr:
                lock = mgr.lock("cancel-mid-send")
                assert await lock.acquire()  # connected: later rounds take idle ones
                await lock.release()

                async def take() -> None:
                    async with lock:
                        pass

                for _ in range(4):
                    stalling.set()
                    stalled.clear()
                    task = asyncio.create_task(take())
                    sending = asyncio.ensure_future(stalled.wait())
                    await asyncio.wait({task, sending}, return_when=asyncio.FIRST_COMPLETED)
                    sending.cancel()
                    assert not task.done(), task.exception()  # in its send, not failed
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                    assert lock.hold_count == 0
                # Two connections per master at most: none may have been kept.
                assert await lock.acquire(timeout=5)
                await lock.release()
                for view in await mgr.inspect("cancel-mid-send"):
                    assert view.locks == []
        finally:
            for client in clients:
                await client.aclose()

    run(main())
