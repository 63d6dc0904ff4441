"""redreentrant.compat.redis_py: redis-py's ``Lock`` and ``AsyncLock`` on one master.

What a program sees through the adapter (exclusion, no reentrancy, redis-py's return
values and errors, tokens per thread or per lock object, short leases, one shared
manager), then redis-py's own lock tests run against it where the extracted suite is the
installed redis-py's (``bash .ci/suites`` extracts the release of the main venv; the
matrix's venvs with another redis-py run the tests above only).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.lock
import redis.lock
from helpers import (
    IN_CI,
    SOURCES,
    aincrement,
    aw,
    in_threads,
    increment,
    library_source,
    lock_keys,
    run,
    run_library_tests,
    wait_until,
)
from redis.exceptions import LockError, LockNotOwnedError, ResponseError

import redreentrant
import redreentrant.compat.managers as managers
import redreentrant.compat.owners as owners
from redreentrant import parse_owner
from redreentrant._core.keys import lock_key
from redreentrant.compat import redis_py
from redreentrant.compat.redis_py import AsyncLock, Lock

pytestmark = pytest.mark.integration

#: redis-py's constructor has raise_on_release_error (from 6.0; not in 5.0.1)
RAISE_ON_RELEASE = "raise_on_release_error" in inspect.signature(redis.lock.Lock).parameters


@pytest.fixture
def url(ensemble: Any) -> str:
    return str(ensemble.urls[0])


@pytest.fixture
def r(url: str) -> redis.Redis:
    # Not closed: the shared manager may keep the first client of this server.
    return redis.Redis.from_url(url)


# -- the API: redis-py's names and signatures ---------------------------------------------


def shape(fn: Any) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [(Lock, redis.lock.Lock), (AsyncLock, redis.asyncio.lock.Lock)],
    ids=["sync", "asyncio"],
)
def test_signatures_are_the_installed_redis_pys(ours: type, theirs: type) -> None:
    for method in (
        "__init__", "acquire", "release", "extend", "reacquire", "locked", "owned",
    ):  # fmt: skip
        assert shape(getattr(ours, method)) == shape(getattr(theirs, method)), method
    assert redis_py.LockError is redis.exceptions.LockError
    assert redis_py.LockNotOwnedError is redis.exceptions.LockNotOwnedError


def test_made_by_redis_lock_with_its_attributes(r: redis.Redis) -> None:
    lock = r.lock("a", timeout=5, sleep=0.2, blocking_timeout=3, lock_class=Lock)
    assert isinstance(lock, Lock)
    assert (lock.name, lock.timeout, lock.sleep, lock.blocking, lock.blocking_timeout) == (
        "a", 5, 0.2, True, 3,
    )  # fmt: skip
    assert lock.redis is r and lock.thread_local and lock.local.token is None
    direct = Lock(r, "a", thread_local=False)
    assert not direct.thread_local and direct.local.token is None


# -- exclusion, reentrancy, owners ----------------------------------------------------------


def test_mutual_exclusion_across_threads_objects_and_clients(
    ensemble: Any, url: str, r: redis.Redis
) -> None:
    counter = {"n": 0}
    r2 = redis.Redis.from_url(url)  # another client of the same server: the same manager
    shared = r.lock("counter", lock_class=Lock)  # one object, a token per thread
    makers: list[Callable[[], Any]] = [
        lambda: shared,
        lambda: r.lock("counter", lock_class=Lock),
        lambda: Lock(r2, "counter", timeout=10),
    ]

    def worker(make: Callable[[], Any]) -> None:
        for _ in range(20):
            with make():
                increment(counter, "n", 0.0005)

    in_threads(worker, [(makers[i % 3],) for i in range(9)], timeout=None)
    assert counter["n"] == 9 * 20
    assert lock_keys(ensemble) == {}


def test_not_reentrant(r: redis.Redis) -> None:
    lock = r.lock("a", blocking_timeout=0.1, lock_class=Lock)
    assert lock.acquire() is True
    first = lock.local.token
    assert lock.acquire(blocking=False) is False  # its own hold: contended
    assert lock.acquire() is False  # waited blocking_timeout for itself, as redis-py
    assert lock.local.token == first and lock.owned()
    lock.release()
    assert lock.locked() is False


def test_the_wait_ends_at_redis_pys_last_try(r: redis.Redis) -> None:
    holder = Lock(r, "a")
    assert holder.acquire()
    start = time.monotonic()
    # redis-py tries every 60 s: no try fits in 10 s after the first, so it gives up
    assert Lock(r, "a", sleep=60, blocking_timeout=10).acquire() is False
    assert time.monotonic() - start < 5  # a generous bound: one try
    waiter = Lock(r, "a", thread_local=False, sleep=0.5, blocking_timeout=10)
    thread = threading.Thread(target=waiter.acquire)
    thread.start()
    holder.release()  # the waiter is woken (it does not poll) and takes it
    thread.join(10)
    assert waiter.owned()
    waiter.release()


def test_an_acquire_with_a_token_that_holds_waits_for_it(r: redis.Redis) -> None:
    a, b = Lock(r, "a"), Lock(r, "a", thread_local=False)
    assert a.acquire(token="t")
    assert b.acquire(token="t", blocking=False) is False
    assert b.acquire(token="t", blocking_timeout=0.05) is False
    got = threading.Event()
    waiter = threading.Thread(target=lambda: b.acquire(token="t") and got.set())
    waiter.start()
    assert not got.wait(0.05)
    a.release()  # wakes the waiter, which takes the lock with the same token
    waiter.join(10)
    assert got.is_set() and b.owned() and not a.owned()
    b.release()


def test_thread_local_tokens(r: redis.Redis) -> None:
    lock = r.lock("a", lock_class=Lock)
    seen: dict[str, Any] = {}

    def other() -> None:
        seen["owned"] = lock.owned()
        try:
            lock.release()
        except LockError as error:
            seen["error"] = error

    assert lock.acquire()
    in_threads(other, timeout=None)
    assert seen["owned"] is False and type(seen["error"]) is LockError
    assert lock.owned() and lock.locked()
    lock.release()


def test_thread_local_false_lets_any_thread_release(r: redis.Redis) -> None:
    lock = r.lock("a", thread_local=False, lock_class=Lock)
    assert lock.acquire()
    in_threads(lock.release, timeout=None)
    assert lock.local.token is None and not lock.locked()


def test_a_hold_outlives_the_thread_and_its_token_releases_it(r: redis.Redis) -> None:
    lock = r.lock("a", lock_class=Lock)
    tokens: list[bytes] = []

    def take() -> None:
        assert lock.acquire()
        tokens.append(lock.local.token)

    in_threads(take, timeout=None)
    assert lock.locked() and not lock.owned()  # held, as redis-py's key, by no thread
    assert Lock(r, "a").acquire(blocking=False) is False
    lock.local.token = tokens[0]  # the token names the owner: this thread may release
    assert lock.owned()
    lock.release()
    assert not lock.locked()


def test_the_token_names_the_owner(r: redis.Redis) -> None:
    a, b = Lock(r, "a"), Lock(r, "a", thread_local=False)
    assert a.acquire(token="shared")
    assert a.local.token == b"shared"
    b.local.token = b"shared"
    assert b.owned()
    b.release()
    assert not a.owned() and not a.locked()
    with pytest.raises(LockNotOwnedError):
        a.release()
    assert a.local.token is None


# -- errors and return values ---------------------------------------------------------------


def test_errors_where_redis_py_raises_them(r: redis.Redis) -> None:
    lock = Lock(r, "a", timeout=10)
    for call in (lock.release, lambda: lock.extend(1), lock.reacquire):
        with pytest.raises(LockError) as raised:
            call()
        assert type(raised.value) is LockError  # unlocked: not LockNotOwnedError
    assert isinstance(raised.value, ValueError)  # redis-py's LockError is one

    forever = Lock(r, "b")
    assert forever.acquire()
    for call in (lambda: forever.extend(1), forever.reacquire):
        with pytest.raises(LockError) as raised:
            call()
        assert type(raised.value) is LockError and "no timeout" in str(raised.value)
    assert forever.owned()

    with pytest.raises(LockError) as raised, Lock(r, "b", blocking_timeout=0.05):
        pass
    assert type(raised.value) is LockError
    assert getattr(raised.value, "lock_name", "b") == "b"
    with pytest.raises(LockError), Lock(r, "b", blocking=False):
        pass
    forever.release()

    with pytest.raises(ResponseError):  # redis-py sends PX 0: the server refuses it
        Lock(r, "c", timeout=0.0005).acquire()
    assert not Lock(r, "c").locked()


def test_timeout_zero_never_expires_as_redis_pys(r: redis.Redis) -> None:
    lock = Lock(r, "a", timeout=0)
    assert lock.acquire()
    with pytest.raises(LockNotOwnedError):  # redis-py: the key has no TTL to extend
        lock.extend(1)
    assert lock.owned()
    lock.release()


def test_no_timeout_is_a_lease_renewed_not_a_key_forever(url: str, r: redis.Redis) -> None:
    lock = Lock(r, "a")
    assert lock.acquire()
    with redis.Redis.from_url(url) as raw:
        ttl = raw.pttl(lock_key("a"))
    assert 0 < ttl <= managers.sync_manager([r]).lease * 1000
    lock.release()


# -- leases ---------------------------------------------------------------------------------


def test_a_short_lease_is_honoured(r: redis.Redis) -> None:
    lock = Lock(r, "a", timeout=0.1)
    assert lock.acquire(blocking=False)
    other = Lock(r, "a", blocking_timeout=10)
    assert other.acquire()  # woken when the 0.1 s lease ended
    assert not lock.owned()
    for call in (lambda: lock.extend(1), lock.reacquire, lock.release):
        with pytest.raises(LockNotOwnedError):
            call()
    other.release()


def test_a_lease_shorter_than_the_shortest_is_raised_to_it(r: redis.Redis) -> None:
    tiny = Lock(r, "a", timeout=0.002)
    assert tiny.acquire()
    wait_until(lambda: not tiny.owned(), "the tiny lease ended")
    with pytest.raises(LockNotOwnedError):
        tiny.release()


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_server_that_answers_late_is_waited_for(
    ensemble: Any, r: redis.Redis, url: str, flavour: str
) -> None:
    """A server busy for half a second delays a try, as with redis-py, instead of failing
    it (the adapters' managers wait up to MASTER_TIMEOUT, not the core's 0.25 s)."""

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(url) if flavour == "asyncio" else r
        lock = (AsyncLock if flavour == "asyncio" else Lock)(client, "slow", timeout=10)
        assert await aw(lock.acquire(blocking=False))  # the manager made, its connection open
        await aw(lock.release())
        ensemble[0].pause()
        resume = threading.Timer(0.5, ensemble[0].resume)
        resume.start()
        try:
            assert await aw(lock.acquire(blocking=False))
        finally:
            resume.join()
        await aw(lock.release())
        if flavour == "asyncio":
            await client.aclose()

    run(main())


def test_extend_and_reacquire(r: redis.Redis) -> None:
    lock = Lock(r, "a", timeout=0.2)
    other = Lock(r, "a")
    assert lock.acquire()
    assert lock.extend(10) is True
    assert other.acquire(blocking_timeout=0.4) is False  # 0.2 s + 10 s
    assert lock.reacquire() is True  # 0.2 s from now again
    assert other.acquire(blocking_timeout=10) is True
    with pytest.raises(LockNotOwnedError):
        lock.extend(1, replace_ttl=True)
    other.release()


def test_raise_on_release_error(r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    if RAISE_ON_RELEASE:
        with (
            caplog.at_level(logging.WARNING, logger="redis.lock"),
            Lock(r, "a", timeout=0.05, raise_on_release_error=False) as lock,
        ):
            wait_until(lambda: not lock.owned(), "the lease ended")
        assert "no longer owned" in caplog.text
    else:  # redis-py 5: not an argument
        with pytest.raises(TypeError):
            Lock(r, "a", raise_on_release_error=False)
    with pytest.raises(LockNotOwnedError), Lock(r, "a", timeout=0.05) as lock:  # the default
        wait_until(lambda: not lock.owned(), "the lease ended")


def test_lapsed_holds_never_released_are_swept(r: redis.Redis) -> None:
    registry = owners.registry(managers.sync_manager([r]))
    before = len(registry)
    locks = [Lock(r, f"n{i}", timeout=0.005) for i in range(registry.limit - before - 1)]
    for lock in locks:
        assert lock.acquire()
    wait_until(lambda: not any(lock.owned() for lock in locks), "every lease ended")
    assert len(registry) == registry.limit - 1
    last = Lock(r, "last", timeout=10)
    assert last.acquire()  # the table is full: the lapsed holds are swept and released
    assert len(registry) <= before + 1 and last.owned()
    with pytest.raises(LockNotOwnedError):
        locks[0].release()
    last.release()


# -- one manager per server -------------------------------------------------------------------


def test_adapters_share_one_manager(
    url: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[object] = []
    original = redreentrant.LockManager

    class Counting(original):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(redreentrant, "LockManager", Counting)
    clients = [r, redis.Redis.from_url(url), redis.Redis.from_url(url, decode_responses=True)]
    threads_before = None
    locks = []
    for i in range(30):
        lock = Lock(clients[i % 3], f"k{i}")
        assert lock.acquire()
        locks.append(lock)
        if threads_before is None:  # the manager and its watchdog are running now
            threads_before = threading.active_count()
    assert threads_before is not None and threading.active_count() <= threads_before + 2
    assert len(made) <= 1  # made at most once (or before this test)
    mgr = managers.sync_manager([r])
    assert all(managers.sync_manager([c]) is mgr for c in clients)
    with redis.Redis.from_url(url) as raw:
        for i in range(30):
            (owner,) = raw.hkeys(lock_key(f"k{i}"))
            assert owner.decode().startswith(mgr.id + ":")
            info = parse_owner(owner.decode())  # an object of the adapter's, per token
            assert (info.kind, info.name) == ("object", "RedisPyToken")
    for lock in locks:
        lock.release()


# -- asyncio ----------------------------------------------------------------------------------


def test_async_mutual_exclusion_and_errors(ensemble: Any, url: str) -> None:
    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(url)
        ar2 = redis.asyncio.Redis.from_url(url)
        counter = {"n": 0}

        async def worker(i: int) -> None:
            for _ in range(20):
                client = ar if i % 2 else ar2
                async with client.lock(
                    "counter", lock_class=AsyncLock, timeout=None if i % 3 else 10
                ):
                    await aincrement(counter, "n", 0.0005)

        await asyncio.gather(*(worker(i) for i in range(8)))
        assert counter["n"] == 8 * 20

        lock = ar.lock("a", lock_class=AsyncLock, blocking_timeout=0.05)
        assert await lock.acquire() is True
        assert await lock.acquire(blocking=False) is False  # not reentrant
        assert await lock.acquire() is False
        assert await lock.owned() and await lock.locked()
        with pytest.raises(LockError) as raised:
            lock.extend(1)  # raised when called, as redis-py's
        assert type(raised.value) is LockError
        with pytest.raises(LockError):
            async with ar.lock("a", lock_class=AsyncLock, blocking_timeout=0.05):
                pass
        await lock.release()
        with pytest.raises(LockError) as raised:
            await lock.release()
        assert type(raised.value) is LockError

        short = AsyncLock(ar, "b", timeout=0.1)
        assert await short.acquire()
        assert await short.extend(0.1) is True
        assert await AsyncLock(ar, "b").acquire(blocking_timeout=0.05) is False
        other = AsyncLock(ar, "b")
        assert await other.acquire(blocking_timeout=10)  # woken when the lease ended
        with pytest.raises(LockNotOwnedError):
            await short.release()
        await other.release()
        assert await other.locked() is False
        assert lock_keys(ensemble) == {}
        await ar.aclose()
        await ar2.aclose()

    run(main())


def test_async_tokens_are_per_thread_so_tasks_share_them(url: str) -> None:
    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(url)
        lock = AsyncLock(ar, "a")
        assert await lock.acquire()

        async def other_task() -> None:
            assert await lock.owned()  # redis-py's threading.local: one thread, one token
            await lock.release()

        await asyncio.create_task(other_task())
        assert not await lock.locked()

        same = AsyncLock(ar, "a")
        assert await same.acquire(token="t")
        assert await AsyncLock(ar, "a").acquire(token="t", blocking=False) is False
        await same.release()
        await ar.aclose()

    run(main())


def test_async_release_cancelled(url: str) -> None:
    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(url)
        lock = AsyncLock(ar, "a")
        assert await lock.acquire()
        token = lock.local.token
        task = asyncio.create_task(lock.release())
        task.cancel()  # before it began: nothing done, the token kept for a retry
        with pytest.raises(asyncio.CancelledError):
            await task
        assert lock.local.token == token and await lock.owned()

        task = asyncio.create_task(lock.release())
        await asyncio.sleep(0)  # under way: it runs to its end
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert lock.local.token is None and not await lock.locked()
        await ar.aclose()

    run(main())


def test_async_adapters_share_one_manager_per_loop(url: str) -> None:
    async def main() -> object:
        clients = [redis.asyncio.Redis.from_url(url) for _ in range(2)]
        mgr = managers.async_manager([clients[0]])
        assert managers.async_manager([clients[1]]) is mgr
        locks = [AsyncLock(clients[i % 2], f"k{i}") for i in range(10)]
        for lock in locks:
            assert await lock.acquire()
        for lock in locks:
            await lock.release()
        for client in clients:
            await client.aclose()
        return mgr

    assert run(main()) is not run(main())  # one per event loop


# -- redis-py's own lock tests --------------------------------------------------------------

SHIMS = Path(__file__).with_name("compat_shims") / "redis_py"

#: redis-py's tests expected to fail against the adapter, and why: they read or write
#: the raw key ``foo`` (the adapter's keys are redreentrant's) or patch the module's
#: clock to count the sleeps of its polling loop (the adapter does not poll)
RAW = "reads or writes redis-py's raw key 'foo' (GET, TTL, PTTL, SET, PEXPIRE)"
CLOCK = "patches the lock module's clock to count its polling sleeps (the adapter waits, woken)"
SYNC_FAILING = {
    "test_lock": RAW,
    "test_lock_token": RAW,
    "test_lock_token_thread_local_false": RAW,
    "test_timeout": RAW,
    "test_float_timeout": RAW,
    "test_blocking_timeout": CLOCK,
    "test_context_manager": RAW,
    "test_context_manager_blocking_timeout": CLOCK,
    "test_context_manager_raises_when_locked_not_acquired": RAW,
    "test_releasing_lock_no_longer_owned_raises_error": RAW,
    "test_extend_lock": RAW,
    "test_extend_lock_replace_ttl": RAW,
    "test_extend_lock_float": RAW,
    "test_extending_lock_no_longer_owned_raises_error": RAW,
    "test_reacquire_lock": RAW,
    "test_reacquiring_lock_no_longer_owned_raises_error": RAW,
    "test_context_manager_reacquiring_lock_no_longer_owned_raises_error": RAW,
    "test_lock_error_gives_correct_lock_name": RAW,
}
ASYNC_FAILING = {
    f"{test}[{client}]": reason
    for test, reason in SYNC_FAILING.items()
    if test
    not in (
        "test_context_manager_blocking_timeout",
        "test_context_manager_reacquiring_lock_no_longer_owned_raises_error",
        "test_lock_error_gives_correct_lock_name",
    )
    for client in ("single", "pool")
}
EXPECTED_FAILING = {
    **{f"tests.test_lock.TestLock::{t}": why for t, why in SYNC_FAILING.items()},
    **{f"tests.test_asyncio.test_lock.TestLock::{t}": why for t, why in ASYNC_FAILING.items()},
}


def _suite_is_the_installed_release() -> bool:
    version = SOURCES / "redis" / ".version"
    return not version.is_file() or version.read_text().strip() == f"redis=={redis.__version__}"


@pytest.fixture(scope="module")
def redis_py_outcomes() -> dict[str, str]:
    source = library_source("redis")
    if importlib.util.find_spec("pytest_asyncio") is None:
        message = "redis-py's asyncio lock tests need pytest-asyncio (its conftest imports it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return run_library_tests(
        source,
        ["tests/test_lock.py", "tests/test_asyncio/test_lock.py"],
        SHIMS,
        "-p",
        "redis_py_shim",
    )


if _suite_is_the_installed_release():

    @pytest.mark.library_suite
    def test_redis_pys_own_lock_tests(redis_py_outcomes: dict[str, str]) -> None:
        outcomes = redis_py_outcomes
        assert len(outcomes) >= 80, outcomes  # both files ran (92 in redis-py 8.1)
        failing = {test for test, outcome in outcomes.items() if outcome != "passed"}
        assert failing == set(EXPECTED_FAILING), {
            "newly failing": sorted(failing - set(EXPECTED_FAILING)),
            "now passing": sorted(set(EXPECTED_FAILING) - failing),
        }
        assert {outcomes[test] for test in failing} == {"failed"}
