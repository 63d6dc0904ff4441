"""redreentrant.compat.pottery: pottery's Redlock, AIORedlock and synchronize on
redreentrant, checked through what a program can observe (against real masters), and
pottery's own lock tests run against the adapter."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from helpers import heal, in_threads, library_source, lock_keys, run, run_library_tests, wait_until

import redreentrant
from redreentrant.compat import managers
from redreentrant.compat.pottery import (
    AIORedlock,
    ExtendUnlockedLock,
    PotteryError,
    PrimitiveError,
    QuorumIsImpossible,
    QuorumNotAchieved,
    Redlock,
    ReleaseUnlockedLock,
    TooManyExtensions,
    synchronize,
)
from redreentrant.testing import LocalEnsemble

SHIMS = Path(__file__).resolve().parent / "compat_shims" / "pottery"


def clients(ensemble: LocalEnsemble, n: int = 5, db: int = 0) -> set[redis.Redis]:
    return {redis.Redis.from_url(f"{url.rsplit('/', 1)[0]}/{db}") for url in ensemble.urls[:n]}


def aio_clients(ensemble: LocalEnsemble, n: int = 5) -> set[Any]:
    return {redis.asyncio.Redis.from_url(url) for url in ensemble.urls[:n]}


def no_keys_left(ensemble: LocalEnsemble) -> None:
    wait_until(lambda: not lock_keys(ensemble), "every lock key gone")


# -- Redlock ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 5])
def test_acquire_locked_release(ensemble: LocalEnsemble, n: int) -> None:
    masters = clients(ensemble, n)
    lock = Redlock(key="printer", masters=masters, auto_release_time=5)
    other = Redlock(key="printer", masters=masters, auto_release_time=5)
    assert repr(lock) == "<Redlock key=redlock:printer>"
    assert lock.key == "redlock:printer"
    assert lock.masters == frozenset(masters)
    assert lock.locked() == 0
    assert lock.acquire() is True
    assert 4 < lock.locked() <= 5  # seconds left on this object's hold
    assert other.locked() == 0  # the other object holds nothing
    assert other.acquire(blocking=False) is False
    assert other.acquire(timeout=0.05) is False
    assert lock_keys(ensemble)
    assert lock.release() is None
    assert lock.locked() == 0
    no_keys_left(ensemble)
    assert other.acquire(blocking=False) is True
    other.release()


def test_mutual_exclusion_threads(ensemble: LocalEnsemble) -> None:
    masters = clients(ensemble)
    counter = [0]
    rounds, workers = 10, 4

    def work() -> None:
        lock = Redlock(key="counter", masters=masters, auto_release_time=5)
        for _ in range(rounds):
            with lock:
                seen = counter[0]
                time.sleep(0.002)
                counter[0] = seen + 1

    in_threads(work, [()] * workers)
    assert counter[0] == rounds * workers


def test_synchronize(ensemble: LocalEnsemble) -> None:
    masters = clients(ensemble)
    counter = [0]

    @synchronize(key="sync-func", masters=masters, auto_release_time=5)
    def bump(by: int) -> int:
        seen = counter[0]
        time.sleep(0.002)
        counter[0] = seen + by
        return counter[0]

    assert bump.__name__ == "bump"
    in_threads(lambda: [bump(1) for _ in range(5)], [()] * 4)
    assert counter[0] == 20
    assert bump(2) == 22

    holder = Redlock(key="sync-func", masters=masters, auto_release_time=5)
    holder.acquire()

    @synchronize(key="sync-func", masters=masters, blocking=False)
    def refused() -> None:
        raise AssertionError("ran without the lock")

    @synchronize(key="sync-func", masters=masters, timeout=0.05)
    def timed_out() -> None:
        raise AssertionError("ran without the lock")

    with pytest.raises(QuorumNotAchieved):
        refused()
    with pytest.raises(QuorumNotAchieved):
        timed_out()
    holder.release()

    @synchronize(key="sync-func", masters=masters, blocking=False, timeout=1)
    def bad() -> None: ...

    with pytest.raises(ValueError):
        bad()


def test_not_reentrant(ensemble: LocalEnsemble) -> None:
    masters = clients(ensemble)
    lock = Redlock(key="once", masters=masters, auto_release_time=0.5)
    other = Redlock(key="once", masters=masters, auto_release_time=5)
    assert lock.acquire()
    # A second acquire by the holder fails as under contention, and the object no
    # longer owns its first hold, which runs out with its lease.
    assert lock.acquire(blocking=False) is False
    assert lock.locked() == 0
    with pytest.raises(ReleaseUnlockedLock):
        lock.release()
    with pytest.raises(ExtendUnlockedLock):
        lock.extend()
    assert other.acquire(blocking=False) is False  # the first hold still stands
    assert other.acquire(timeout=10)  # ... until its lease runs out
    other.release()
    # A blocking acquire by the holder waits for its own lease to run out, as pottery's.
    assert lock.acquire()
    assert lock.acquire()
    assert lock.locked() > 0
    lock.release()
    no_keys_left(ensemble)


def test_errors_and_return_values(ensemble: LocalEnsemble) -> None:
    masters = clients(ensemble)
    lock = Redlock(key="err", masters=masters, auto_release_time=5, num_extensions=2)
    with pytest.raises(ReleaseUnlockedLock) as released:
        lock.release()
    assert released.value.key == "redlock:err"
    assert released.value.masters == frozenset(masters)
    assert released.value.redis_errors == []
    with pytest.raises(ExtendUnlockedLock):
        lock.extend()
    with pytest.raises(ValueError, match="non-blocking"):
        lock.acquire(blocking=False, timeout=1)
    with pytest.raises(ValueError, match="non-blocking"):
        Redlock(
            key="err", masters=masters, context_manager_blocking=False, context_manager_timeout=1
        )
    # pottery's blocking loop runs while the time waited is below the timeout: a
    # timeout of 0 returns False without trying, even on a free lock.
    assert lock.acquire(timeout=0) is False
    assert not lock_keys(ensemble)

    assert lock.acquire()
    assert lock.extend() is None
    lock.extend()
    with pytest.raises(TooManyExtensions) as many:
        lock.extend()
    assert many.value.key == "redlock:err"
    lock.release()
    with pytest.raises(ReleaseUnlockedLock):
        lock.release()

    # The context manager: QuorumNotAchieved when not acquired, ReleaseUnlockedLock
    # at the exit of a block whose lock was released (or ran out) meanwhile.
    with lock:
        refused = Redlock(
            key="err", masters=masters, context_manager_blocking=False, auto_release_time=1
        )
        with pytest.raises(QuorumNotAchieved), refused:
            raise AssertionError("entered without the lock")
        waited = Redlock(key="err", masters=masters, context_manager_timeout=0.05)
        with pytest.raises(QuorumNotAchieved), waited:
            raise AssertionError("entered without the lock")
    with pytest.raises(ReleaseUnlockedLock), lock:
        lock.release()
    assert lock.acquire()
    assert lock.__exit__(None, None, None) is False
    no_keys_left(ensemble)

    # pottery's hierarchy: lock errors are PrimitiveErrors and RuntimeErrors, not
    # PotteryErrors (those are its containers').
    for cls in (
        QuorumNotAchieved,
        TooManyExtensions,
        ExtendUnlockedLock,
        ReleaseUnlockedLock,
        QuorumIsImpossible,
    ):
        assert issubclass(cls, PrimitiveError)
        assert issubclass(cls, RuntimeError)
        assert not issubclass(cls, PotteryError)
    assert repr(TooManyExtensions("redlock:x", frozenset())) == (
        "TooManyExtensions(key='redlock:x', masters=frozenset(), redis_errors=())"
    )
    with pytest.raises(AttributeError):
        lock.__dict__  # noqa: B018 - pottery's Redlock has __slots__


def test_extend_sets_the_lease_from_now(ensemble: LocalEnsemble) -> None:
    lock = Redlock(key="ext", masters=clients(ensemble), auto_release_time=0.6)
    assert lock.acquire()
    wait_until(lambda: lock.locked() < 0.3, "the lease half gone")
    lock.extend()
    assert lock.locked() > 0.45
    lock.release()


@pytest.mark.parametrize("lease", [0.01, 0.1])
def test_short_lease(ensemble: LocalEnsemble, lease: float) -> None:
    masters = clients(ensemble)
    lock = Redlock(key="short", masters=masters, auto_release_time=lease)
    other = Redlock(key="short", masters=masters, auto_release_time=5)
    assert lock.acquire(timeout=10)
    assert 0 <= lock.locked() < lease
    wait_until(lambda: lock.locked() == 0, "the short lease over")
    assert other.acquire(timeout=10)
    with pytest.raises(ReleaseUnlockedLock):
        lock.release()
    other.release()
    no_keys_left(ensemble)


def test_lease_shorter_than_honoured(ensemble: LocalEnsemble) -> None:
    """pottery grants no lease its drift allowance eats; the adapter grants none
    shorter than the shortest it honours (about 4 ms)."""
    lock = Redlock(key="tiny", masters=clients(ensemble), auto_release_time=0.001)
    assert lock.acquire(blocking=False) is False
    assert lock.acquire(timeout=0.02) is False
    with pytest.raises(ValueError, match="shortest lease"):
        lock.acquire()
    lock.context_manager_blocking = False
    with pytest.raises(QuorumNotAchieved), lock:
        raise AssertionError("entered without the lock")
    assert not lock_keys(ensemble)


def test_quorum_is_impossible(ensemble: LocalEnsemble) -> None:
    masters = clients(ensemble)
    held = Redlock(key="held", masters=masters, auto_release_time=2)
    held2 = Redlock(key="held2", masters=masters, auto_release_time=2)
    assert held.acquire() and held2.acquire()
    for server in ensemble.servers[:3]:
        server.kill()
    try:
        lock = Redlock(key="down", masters=masters, auto_release_time=2)
        assert lock.acquire(blocking=False) is False
        assert lock.acquire(timeout=0.3) is False  # tried again until the timeout
        with pytest.raises(QuorumIsImpossible) as impossible:
            lock.acquire(raise_on_redis_errors=True)
        assert impossible.value.key == "redlock:down"
        assert len(list(impossible.value.redis_errors)) >= 3
        strict = Redlock(key="down", masters=masters, raise_on_redis_errors=True)
        with pytest.raises(QuorumIsImpossible):
            strict.acquire(blocking=False)
        with pytest.raises(QuorumNotAchieved):
            Redlock(key="down", masters=masters, context_manager_blocking=False).__enter__()

        with pytest.raises(ExtendUnlockedLock) as extend:
            held.extend()
        assert list(extend.value.redis_errors)
        with pytest.raises(QuorumIsImpossible):
            held.extend(raise_on_redis_errors=True)
        with pytest.raises(ReleaseUnlockedLock) as release:
            held.release()
        assert list(release.value.redis_errors)
        with pytest.raises(QuorumIsImpossible):
            held2.release(raise_on_redis_errors=True)
    finally:
        heal(ensemble)
    # The masters back: the shared manager takes locks again.
    again = Redlock(key="down", masters=masters, auto_release_time=2)
    wait_until(lambda: again.acquire(blocking=False), "an acquire granted again")
    again.release()
    no_keys_left(ensemble)


def test_masters_share_one_manager(
    ensemble: LocalEnsemble, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[redreentrant.LockManager] = []

    class Counted(redreentrant.LockManager):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(redreentrant, "LockManager", Counted)
    # Database 3 of each master: a set of masters no test made a manager for before.
    first = Redlock(key="shared", masters=clients(ensemble, db=3), auto_release_time=5)
    second = Redlock(key="shared", masters=clients(ensemble, db=3), auto_release_time=5)
    holders = []
    for lock in (first, second):
        assert lock.acquire(timeout=10)
        views = made[0].inspect("shared")
        holders += [
            owner for view in views for lock_view in view.locks for owner in lock_view.holders
        ]
        lock.release()

    @synchronize(key="shared", masters=clients(ensemble, db=3), auto_release_time=5)
    def inside() -> int:
        return len(made)

    assert inside() == 1
    assert len(made) == 1
    assert holders and all(owner.startswith(made[0].id + ":") for owner in holders)
    assert len(set(holders)) == 2  # two owners (the two objects), one manager


def test_lapsed_holds_are_forgotten(ensemble: LocalEnsemble) -> None:
    """Holds left behind (released by nobody) stay until their lease ends, and the
    object goes on taking and releasing the lock."""
    masters = clients(ensemble)
    lock = Redlock(key="left", masters=masters, auto_release_time=0.1)
    for _ in range(3):
        assert lock.acquire(timeout=10)
        assert lock.acquire(blocking=False) is False
    wait_until(lambda: not lock_keys(ensemble), "the left holds' leases over")
    lock.auto_release_time = 5
    assert lock.acquire(blocking=False)
    lock.release()
    no_keys_left(ensemble)


# -- AIORedlock -------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 5])
def test_aio_acquire_locked_release(ensemble: LocalEnsemble, n: int) -> None:
    async def main() -> None:
        masters = aio_clients(ensemble, n)
        lock = AIORedlock(key="shower", masters=masters, auto_release_time=1)
        other = AIORedlock(key="shower", masters=masters, auto_release_time=5)
        assert repr(lock) == "<AIORedlock key=redlock:shower>"
        assert await lock.locked() == 0
        assert await lock.acquire() is True
        assert 0.5 < await lock.locked() <= 1
        assert await other.locked() == 0
        assert await other.acquire(blocking=False) is False
        assert await other.acquire(timeout=0.05) is False
        assert await lock.acquire(blocking=False) is False  # not reentrant
        with pytest.raises(ReleaseUnlockedLock):
            await lock.release()
        assert await other.acquire(timeout=10)
        # The owner is the object: another task releases what this one took.
        await asyncio.create_task(other.release())
        with pytest.raises(ValueError, match="non-blocking"):
            await lock.acquire(blocking=False, timeout=1)
        assert await lock.acquire(timeout=0) is False

        async with lock:
            assert await lock.locked() > 0
            refused = AIORedlock(key="shower", masters=masters, context_manager_blocking=False)
            with pytest.raises(QuorumNotAchieved):
                async with refused:
                    raise AssertionError("entered without the lock")
            for _ in range(3):
                await lock.extend()
            with pytest.raises(TooManyExtensions):
                await lock.extend()
        with pytest.raises(ReleaseUnlockedLock):
            async with lock:
                await lock.release()
        with pytest.raises(ExtendUnlockedLock):
            await lock.extend()

    run(main())
    no_keys_left(ensemble)


def test_aio_mutual_exclusion_tasks(ensemble: LocalEnsemble) -> None:
    counter = [0]
    rounds, workers = 10, 4

    async def work(masters: set[Any]) -> None:
        lock = AIORedlock(key="counter", masters=masters, auto_release_time=5)
        for _ in range(rounds):
            async with lock:
                seen = counter[0]
                await asyncio.sleep(0.002)
                counter[0] = seen + 1

    async def main() -> None:
        masters = aio_clients(ensemble)
        await asyncio.gather(*(work(masters) for _ in range(workers)))

    run(main())
    assert counter[0] == rounds * workers


def test_aio_short_lease_and_shared_manager(ensemble: LocalEnsemble) -> None:
    async def main() -> None:
        lock = AIORedlock(key="short", masters=aio_clients(ensemble), auto_release_time=0.01)
        other = AIORedlock(key="short", masters=aio_clients(ensemble), auto_release_time=5)
        assert await lock.acquire(timeout=10)
        await asyncio.wait_for(_until_zero(lock), 10)
        assert await other.acquire(timeout=10)
        with pytest.raises(ReleaseUnlockedLock):
            await lock.release()
        await other.release()
        tiny = AIORedlock(key="tiny", masters=aio_clients(ensemble), auto_release_time=0.001)
        assert await tiny.acquire(blocking=False) is False
        # One manager on this loop (a new one) for the three objects' clients.
        assert len(managers._async[asyncio.get_running_loop()]) == 1

    run(main())
    no_keys_left(ensemble)


async def _until_zero(lock: AIORedlock) -> None:
    while await lock.locked():
        await asyncio.sleep(0.005)


def test_aio_quorum_is_impossible(ensemble: LocalEnsemble) -> None:
    async def main() -> None:
        masters = aio_clients(ensemble)
        lock = AIORedlock(key="down", masters=masters, auto_release_time=2)
        for server in ensemble.servers[:3]:
            server.kill()
        try:
            assert await lock.acquire(blocking=False) is False
            assert await lock.acquire(timeout=0.3) is False
            with pytest.raises(QuorumIsImpossible):
                await lock.acquire(blocking=False, raise_on_redis_errors=True)
        finally:
            heal(ensemble)
        for _ in range(200):
            if await lock.acquire(blocking=False):
                break
            await asyncio.sleep(0.05)
        await lock.release()

    run(main())
    no_keys_left(ensemble)


# -- pottery's own tests ----------------------------------------------------------------

_RAW = "reads pottery's raw key redlock:<key> on the master, which the adapter never writes"
_PATCHED = (
    "makes masters fail by patching redis-py's {}, which the adapter never calls (its"
    " rounds send its own scripts on its own connections); the adapter's QuorumIsImpossible"
    " and errors are tested in test_compat_pottery.py against masters that are down"
)

#: pottery's lock tests that fail against the adapter, and why (all others must pass)
EXPECTED_FAILURES = {
    "tests.test_redlock.TestRedlock::test_acquire_fails_within_auto_release_time": (
        "calls the private Redlock._acquire_masters()"
    ),
    "tests.test_redlock.TestRedlock::test_acquire_and_time_out": _RAW,
    "tests.test_redlock.TestRedlock::test_acquire_same_lock_twice_blocking_without_timeout": (
        _RAW + "; also counts pottery's logger.info calls"
    ),
    "tests.test_redlock.TestRedlock::test_acquire_same_lock_twice_non_blocking_without_timeout": (
        _RAW
    ),
    "tests.test_redlock.TestRedlock::test_acquire_same_lock_twice_non_blocking_with_timeout": (
        _RAW
    ),
    "tests.test_redlock.TestRedlock::test_acquired": _RAW,
    "tests.test_redlock.TestRedlock::test_acquire_then_release": _RAW,
    "tests.test_redlock.TestRedlock::test_releaseunlockedlock_repr": (
        "expects the repr of a client of localhost:6379 in redis-py 4's format; the masters"
        " here are on free ports (and redis-py 5+ prints more)"
    ),
    "tests.test_redlock.TestRedlock::test_context_manager": _RAW,
    "tests.test_redlock.TestRedlock::test_context_manager_time_out_before_exit": _RAW,
    "tests.test_redlock.TestRedlock::test_context_manager_acquired": _RAW,
    "tests.test_redlock.TestRedlock::test_context_manager_acquired_time_out_before_exit": _RAW,
    "tests.test_redlock.TestRedlock::test_context_manager_release_before_exit": _RAW,
    "tests.test_redlock.TestRedlock::test_acquire_rediserror": _PATCHED.format("Redis.set"),
    "tests.test_redlock.TestRedlock::test_acquire_quorumisimpossible": _PATCHED.format("Redis.set"),
    "tests.test_redlock.TestRedlock::test_locked_rediserror": _PATCHED.format("Script.__call__"),
    "tests.test_redlock.TestRedlock::test_locked_quorumisimpossible": _PATCHED.format(
        "Script.__call__"
    ),
    "tests.test_redlock.TestRedlock::test_extend_rediserror": _PATCHED.format("Script.__call__"),
    "tests.test_redlock.TestRedlock::test_extend_quorumisimpossible": _PATCHED.format(
        "Script.__call__"
    ),
    "tests.test_redlock.TestRedlock::test_release_rediserror": _PATCHED.format("Script.__call__"),
    "tests.test_redlock.TestRedlock::test_release_quorumisimpossible": _PATCHED.format(
        "Script.__call__"
    ),
    "tests.test_aioredlock::test_acquire_rediserror": _PATCHED.format("asyncio Redis.set"),
    "tests.test_aioredlock::test_locked_rediserror": _PATCHED.format("AsyncScript.__call__"),
    "tests.test_aioredlock::test_extend_rediserror": _PATCHED.format("AsyncScript.__call__"),
    "tests.test_aioredlock::test_release_rediserror": _PATCHED.format("AsyncScript.__call__"),
}


@pytest.fixture
def pottery_source(redis_binary: str) -> Iterator[Path]:
    pytest.importorskip("pottery", reason="pottery's own tests import it: pip install pottery")
    yield library_source("pottery")


@pytest.mark.library_suite
def test_pottery_own_lock_tests(pottery_source: Path, redis_binary: str) -> None:
    outcomes = run_library_tests(
        pottery_source,
        ["tests/test_redlock.py", "tests/test_aioredlock.py"],
        SHIMS,
        "-p",
        "pottery_shim",
        "-c",
        str(SHIMS / "pytest.ini"),
        env={"REDIS_SERVER": redis_binary},
    )
    assert len(outcomes) == 69, sorted(outcomes)
    unexpected = {
        test: outcome
        for test, outcome in outcomes.items()
        if outcome != "passed" and test not in EXPECTED_FAILURES
    }
    assert not unexpected, unexpected
    assert {test: outcomes.get(test) for test in EXPECTED_FAILURES} == dict.fromkeys(
        EXPECTED_FAILURES, "failed"
    )
