"""A bad master costs the other rounds nothing: rounds end once decided, a master that
stopped answering is suspect (not waited for, probed), and rejoins once it answers.

Real servers, sync and asyncio. Time bounds are an order of magnitude wide: before
this behaviour, every round waited the master timeout for a frozen master.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
from helpers import FLAVOURS, entered, lock_keys, run, wait_until

import redreentrant.asyncio as ra
from redreentrant import LockManager
from redreentrant._core.keys import lock_key
from redreentrant.testing import LocalEnsemble

CYCLES = 10
TIMEOUT = 1.0  # master_timeout: each round that waited for a frozen master costs this


def has_key(ensemble: LocalEnsemble, i: int, name: str) -> bool:
    with redis.Redis.from_url(ensemble[i].url) as r:
        return bool(r.exists(lock_key(name)))


@pytest.mark.parametrize("api", FLAVOURS)
def test_a_frozen_master_is_waited_for_once_not_every_round(
    ensemble: LocalEnsemble, api: Any
) -> None:
    async def main() -> float:
        mgr = api.LockManager(ensemble.urls, lease=30.0, master_timeout=TIMEOUT)
        async with entered(mgr):
            async with entered(mgr.lock("warm")):
                pass  # connections open, scripts loaded
            ensemble[0].pause()
            started = time.monotonic()
            for _ in range(CYCLES):
                async with entered(mgr.lock("frozen-one")):
                    pass
            elapsed = time.monotonic() - started
            ensemble[0].resume()
            for _ in range(200):  # it rejoins once it answers
                async with entered(mgr.lock("rejoined")):
                    if has_key(ensemble, 0, "rejoined"):
                        break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the thawed master never rejoined")
            return elapsed

    elapsed = run(main())
    # 2 * CYCLES rounds; waiting in each would take 20 s. Not waiting: about one
    # master timeout (the round that found the master frozen), if even that.
    assert elapsed < 5 * TIMEOUT, elapsed
    wait_until(lambda: not lock_keys(ensemble), "freed everywhere")


def test_the_frozen_masters_queued_calls_run_in_order_when_it_thaws(
    ensemble: LocalEnsemble,
) -> None:
    with LockManager(ensemble.urls, lease=30.0, master_timeout=TIMEOUT) as mgr:
        with mgr.lock("warm"):
            pass
        ensemble[0].pause()
        for _ in range(CYCLES):
            with mgr.lock("queued"):
                pass
        ensemble[0].resume()
        # Each acquire sent to the frozen master was followed by its release on the
        # same connection: once it thawed, nothing of them remains.
        wait_until(lambda: not lock_keys(ensemble), "freed everywhere")
        # It rejoins: a new hold reaches it again.
        wait_until(lambda: _held_on(mgr, ensemble, 0, "rejoined"), "rejoined: the thawed master")
    assert lock_keys(ensemble) == {}


def _held_on(mgr: LockManager, ensemble: LocalEnsemble, i: int, name: str) -> bool:
    with mgr.lock(name):
        return has_key(ensemble, i, name)


def test_a_killed_master_rejoins_after_its_restart(ensemble: LocalEnsemble) -> None:
    with LockManager(ensemble.urls, lease=3.0, master_timeout=0.2) as mgr:
        with mgr.lock("before"):
            assert has_key(ensemble, 2, "before")
        ensemble[2].pause()
        for _ in range(3):
            with mgr.lock("during") as lock:
                assert lock.locked()  # a probe round: the suspect fails at once
        ensemble[2].kill()
        ensemble[2].start()
        # Probed at least every min(lease / 3, 1 s): it takes locks again soon.
        wait_until(lambda: _held_on(mgr, ensemble, 2, "after"), "rejoined: the restarted master")
    assert lock_keys(ensemble) == {}


def test_a_round_ends_once_decided_while_a_master_is_slow(ensemble: LocalEnsemble) -> None:
    # A master frozen mid-way: a round that already has its quorum does not wait.
    with LockManager(ensemble.urls, lease=30.0, master_timeout=TIMEOUT) as mgr:
        lock = mgr.lock("decided")
        lock.acquire()
        ensemble[4].pause()
        started = time.monotonic()
        lock.release()
        assert lock.acquire(blocking=False)
        lock.release()
        assert time.monotonic() - started < TIMEOUT, "a decided round waited"
        ensemble[4].resume()
    wait_until(lambda: not lock_keys(ensemble), "freed everywhere")


def test_asyncio_late_replies_are_caught_up_under_one_timer_not_one_per_reply(
    ensemble: LocalEnsemble, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On 5 masters a round ends once 3 granted: the other replies are read later, at a
    # catch-up. Reading a reply that has come costs about what a timer does, so a
    # catch-up of many replies runs under one timer, not one per reply.
    import redis.asyncio.connection as connection

    import redreentrant._async.transport as transport

    catch_ups: list[float] = []
    per_read: list[float] = []
    timeout_at, async_timeout = transport.timeout_at, connection.async_timeout

    def counted_timeout_at(when: float) -> Any:
        if when <= asyncio.get_running_loop().time():  # a catch-up: it must not wait
            catch_ups.append(when)
        return timeout_at(when)

    def counted_async_timeout(delay: float) -> Any:
        if delay == 0:  # a read that must not wait (a connect has its own time-out)
            per_read.append(delay)
        return async_timeout(delay)

    monkeypatch.setattr(transport, "timeout_at", counted_timeout_at)
    monkeypatch.setattr(connection, "async_timeout", counted_async_timeout)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        async with ra.LockManager(ensemble.urls, lease=30.0) as mgr:
            lock = mgr.lock("late")
            cycles = 0
            end = loop.time() + 1.0
            while loop.time() < end:
                async with lock:
                    pass
                cycles += 1
        return cycles

    cycles = asyncio.run(main())
    assert catch_ups, "no round left a reply to read later: the test saw nothing"
    assert per_read == []
    assert len(catch_ups) < cycles
    wait_until(lambda: not lock_keys(ensemble), "freed everywhere")


def test_a_blackholed_master_is_waited_for_once_and_rejoins(ensemble: LocalEnsemble) -> None:
    from redreentrant.testing.proxy import TcpProxy

    with TcpProxy(ensemble[1].port) as proxy:
        urls = list(ensemble.urls)
        urls[1] = proxy.url()
        with LockManager(urls, lease=30.0, master_timeout=TIMEOUT) as mgr:
            with mgr.lock("warm"):
                pass
            proxy.blackhole()  # accepted, read, never answered: a silent network
            started = time.monotonic()
            for _ in range(CYCLES):
                with mgr.lock("blackholed"):
                    pass
            assert time.monotonic() - started < 5 * TIMEOUT
            proxy.pass_through()
            # The old connection's bytes are gone; a probe on a fresh one finds the
            # master answering, and it takes locks again.
            wait_until(lambda: _held_on(mgr, ensemble, 1, "back"), "rejoined: the master")
    wait_until(lambda: not lock_keys(ensemble), "freed everywhere")
