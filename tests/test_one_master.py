"""The usual round on one master (one call, a healthy master with an idle connection)
is sent and read without a round's bookkeeping (``fanout.lone_calls``); everything else
about it behaves as a full round's: a script the master forgot is loaded again, a
frozen master is waited for once and then fails fast until it answers, a restarted one
is reconnected to.

Real servers, sync and asyncio. Time bounds are an order of magnitude wide.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from helpers import lock_keys, wait_until

import redreentrant._core.fanout as fanout
import redreentrant.asyncio as ra
from redreentrant import LockManager, QuorumUnavailableError
from redreentrant._core.fanout import FanoutRound
from redreentrant._core.health import IDLE_CHECK
from redreentrant.testing import LocalEnsemble

TIMEOUT = 0.3  # master_timeout


def flush_scripts(ensemble: LocalEnsemble) -> None:
    with redis.Redis.from_url(ensemble[0].url) as r:
        r.script_flush()


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many full rounds (:class:`FanoutRound`) the transports made, by master count."""
    made: list[int] = []

    class Counted(FanoutRound):
        def __init__(self, calls: Any, *args: Any, **kwargs: Any) -> None:
            made.append(len(calls))
            super().__init__(calls, *args, **kwargs)

    monkeypatch.setattr(fanout, "FanoutRound", Counted)
    yield made


def test_the_usual_round_on_one_master_makes_no_full_round(
    ensemble: LocalEnsemble, rounds: list[int]
) -> None:
    with LockManager([ensemble[0].url], lease=5.0) as mgr:
        lock = mgr.lock("lone")
        with lock:  # the first round connects: a full round
            pass
        before = len(rounds)
        for _ in range(20):
            with lock, lock:  # a first hold, a re-entry and two releases
                assert lock.hold_count == 2
        assert len(rounds) == before
    # Several masters: full rounds.
    with LockManager(ensemble.urls[:3], lease=5.0) as mgr, mgr.lock("lone"):
        pass
    assert rounds[-1] == 3
    assert lock_keys(ensemble) == {}


def test_asyncio_the_usual_round_on_one_master_makes_no_full_round(
    ensemble: LocalEnsemble, rounds: list[int]
) -> None:
    async def main() -> None:
        async with ra.LockManager([ensemble[0].url], lease=5.0) as mgr:
            lock = mgr.lock("lone")
            async with lock:
                pass
            before = len(rounds)
            for _ in range(20):
                async with lock, lock:
                    assert lock.hold_count == 2
            assert len(rounds) == before

    asyncio.run(main())
    assert lock_keys(ensemble) == {}


def test_scripts_the_one_master_forgot_are_loaded_again(ensemble: LocalEnsemble) -> None:
    with LockManager([ensemble[0].url], lease=5.0) as mgr:
        lock = mgr.lock("forgot")
        with lock:
            pass
        flush_scripts(ensemble)  # the acquire's call is answered NOSCRIPT: not run
        with lock:
            assert lock.is_owned()
            flush_scripts(ensemble)  # and the release's
        assert not lock.is_owned()
    assert lock_keys(ensemble) == {}


def test_asyncio_scripts_the_one_master_forgot_are_loaded_again(ensemble: LocalEnsemble) -> None:
    async def main() -> None:
        async with ra.LockManager([ensemble[0].url], lease=5.0) as mgr:
            lock = mgr.lock("forgot")
            async with lock:
                pass
            flush_scripts(ensemble)
            async with lock:
                assert lock.is_owned()
                flush_scripts(ensemble)
            assert not lock.is_owned()

    asyncio.run(main())
    assert lock_keys(ensemble) == {}


def test_a_frozen_single_master_is_waited_for_once_then_rejoins(ensemble: LocalEnsemble) -> None:
    with LockManager([ensemble[0].url], lease=5.0, master_timeout=TIMEOUT) as mgr:
        lock = mgr.lock("frozen")
        with lock:
            pass
        ensemble[0].pause()
        started = time.monotonic()
        with pytest.raises(QuorumUnavailableError):
            lock.acquire(blocking=False)
        waited = time.monotonic() - started
        assert waited >= TIMEOUT * 0.9  # the one round that waited for it
        started = time.monotonic()
        # Suspect: the next tries fail without waiting for it (five waits would take
        # 5 * TIMEOUT; the bound leaves a hundred times what five failing tries take).
        for _ in range(5):
            with pytest.raises(QuorumUnavailableError):
                lock.acquire(blocking=False)
        assert time.monotonic() - started < 2 * TIMEOUT
        ensemble[0].resume()

        def taken() -> bool:
            try:
                return lock.acquire(blocking=False)
            except QuorumUnavailableError:
                return False

        wait_until(taken, "taken once the master answers again")
        lock.release()
        restarted = ensemble[0]
        restarted.restart()  # the kept connection is dead now: a round reconnects
        wait_until(taken, "taken on the restarted master")
        lock.release()
    assert lock_keys(ensemble) == {}


def test_asyncio_a_frozen_single_master_is_waited_for_once_then_rejoins(
    ensemble: LocalEnsemble,
) -> None:
    async def taken(lock: ra.Lock) -> bool:
        try:
            return await lock.acquire(blocking=False)
        except QuorumUnavailableError:
            return False

    async def take_and_release(lock: ra.Lock, why: str) -> None:
        end = asyncio.get_running_loop().time() + 10
        while not await taken(lock):
            assert asyncio.get_running_loop().time() < end, why
            await asyncio.sleep(0.05)
        await lock.release()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with ra.LockManager([ensemble[0].url], lease=5.0, master_timeout=TIMEOUT) as mgr:
            lock = mgr.lock("frozen")
            async with lock:
                pass
            ensemble[0].pause()
            started = loop.time()
            with pytest.raises(QuorumUnavailableError):
                await lock.acquire(blocking=False)
            assert loop.time() - started >= TIMEOUT * 0.9
            started = loop.time()
            for _ in range(5):
                with pytest.raises(QuorumUnavailableError):
                    await lock.acquire(blocking=False)
            assert loop.time() - started < 2 * TIMEOUT
            ensemble[0].resume()
            await take_and_release(lock, "the master did not rejoin")
            ensemble[0].restart()
            await take_and_release(lock, "the restarted master was not reconnected to")

    asyncio.run(main())
    assert lock_keys(ensemble) == {}


def kill_clients(ensemble: LocalEnsemble) -> None:
    """The master closes every connection but this one's (as an idle time-out would)."""
    with redis.Redis.from_url(ensemble[0].url) as r:
        r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")


def test_a_connection_the_master_closed_while_idle_costs_no_try(ensemble: LocalEnsemble) -> None:
    with LockManager([ensemble[0].url], master_timeout=TIMEOUT) as mgr:
        lock = mgr.lock("idle")
        with lock:
            pass
        kill_clients(ensemble)
        time.sleep(IDLE_CHECK * 1.2)
        assert lock.acquire(blocking=False)  # not QuorumUnavailableError
        lock.release()
    assert lock_keys(ensemble) == {}


def test_asyncio_a_connection_the_master_closed_while_idle_costs_no_try(
    ensemble: LocalEnsemble,
) -> None:
    async def main() -> None:
        async with ra.LockManager([ensemble[0].url], master_timeout=TIMEOUT) as mgr:
            lock = mgr.lock("idle")
            async with lock:
                pass
            kill_clients(ensemble)
            await asyncio.sleep(IDLE_CHECK * 1.2)
            assert await lock.acquire(blocking=False)
            await lock.release()

    asyncio.run(main())
    assert lock_keys(ensemble) == {}
