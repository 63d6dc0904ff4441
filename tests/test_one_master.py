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
from helpers import FLAVOURS, aw, entered, lock_keys, run

import redreentrant._core.fanout as fanout
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


@pytest.mark.parametrize("api", FLAVOURS)
def test_the_usual_round_on_one_master_makes_no_full_round(
    ensemble: LocalEnsemble, rounds: list[int], api: Any
) -> None:
    async def main() -> None:
        async with entered(api.LockManager([ensemble[0].url], lease=5.0)) as mgr:
            lock = mgr.lock("lone")
            async with entered(lock):  # the first round connects: a full round
                pass
            before = len(rounds)
            for _ in range(20):
                async with entered(lock), entered(lock):  # a hold, a re-entry, 2 releases
                    assert lock.hold_count == 2
            assert len(rounds) == before

    run(main())
    # Several masters: full rounds.
    with LockManager(ensemble.urls[:3], lease=5.0) as mgr, mgr.lock("lone"):
        pass
    assert rounds[-1] == 3
    assert lock_keys(ensemble) == {}


@pytest.mark.parametrize("api", FLAVOURS)
def test_scripts_the_one_master_forgot_are_loaded_again(ensemble: LocalEnsemble, api: Any) -> None:
    async def main() -> None:
        async with entered(api.LockManager([ensemble[0].url], lease=5.0)) as mgr:
            lock = mgr.lock("forgot")
            async with entered(lock):
                pass
            flush_scripts(ensemble)  # the acquire's call is answered NOSCRIPT: not run
            async with entered(lock):
                assert lock.is_owned()
                flush_scripts(ensemble)  # and the release's
            assert not lock.is_owned()

    run(main())
    assert lock_keys(ensemble) == {}


@pytest.mark.parametrize("api", FLAVOURS)
def test_a_frozen_single_master_is_waited_for_once_then_rejoins(
    ensemble: LocalEnsemble, api: Any
) -> None:
    async def taken(lock: Any) -> bool:
        try:
            return bool(await aw(lock.acquire(blocking=False)))
        except QuorumUnavailableError:
            return False

    async def take_and_release(lock: Any, why: str) -> None:
        end = time.monotonic() + 10
        while not await taken(lock):
            assert time.monotonic() < end, why
            await asyncio.sleep(0.05)
        await aw(lock.release())

    async def main() -> None:
        mgr = api.LockManager([ensemble[0].url], lease=5.0, master_timeout=TIMEOUT)
        async with entered(mgr):
            lock = mgr.lock("frozen")
            async with entered(lock):
                pass
            ensemble[0].pause()
            started = time.monotonic()
            with pytest.raises(QuorumUnavailableError):
                await aw(lock.acquire(blocking=False))
            assert time.monotonic() - started >= TIMEOUT * 0.9  # the one round that waited
            started = time.monotonic()
            # Suspect: the next tries fail without waiting for it (five waits would take
            # 5 * TIMEOUT; the bound leaves a hundred times what five failing tries take).
            for _ in range(5):
                with pytest.raises(QuorumUnavailableError):
                    await aw(lock.acquire(blocking=False))
            assert time.monotonic() - started < 2 * TIMEOUT
            ensemble[0].resume()
            await take_and_release(lock, "the master did not rejoin")
            ensemble[0].restart()  # the kept connection is dead now: a round reconnects
            await take_and_release(lock, "the restarted master was not reconnected to")

    run(main())
    assert lock_keys(ensemble) == {}


def kill_clients(ensemble: LocalEnsemble) -> None:
    """The master closes every connection but this one's (as an idle time-out would)."""
    with redis.Redis.from_url(ensemble[0].url) as r:
        r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")


@pytest.mark.parametrize("api", FLAVOURS)
def test_a_connection_the_master_closed_while_idle_costs_no_try(
    ensemble: LocalEnsemble, api: Any
) -> None:
    async def main() -> None:
        async with entered(api.LockManager([ensemble[0].url], master_timeout=TIMEOUT)) as mgr:
            lock = mgr.lock("idle")
            async with entered(lock):
                pass
            kill_clients(ensemble)
            await asyncio.sleep(IDLE_CHECK * 1.2)
            assert await aw(lock.acquire(blocking=False))  # not QuorumUnavailableError
            await aw(lock.release())

    run(main())
    assert lock_keys(ensemble) == {}
