"""redreentrant.compat.aioredlock, aioredlock's ``Aioredlock``: what a program sees
through it, on real masters.

aioredlock's own tests are not in its source distribution; they run by hand against the
adapter through tests/compat_shims/aioredlock (see aioredlock_shim.py there).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio
from helpers import aincrement, lock_keys, registered, run, wait_until

from redreentrant.compat import managers
from redreentrant.compat.aioredlock import (
    Aioredlock,
    AioredlockError,
    Lock,
    LockAcquiringError,
    LockError,
    LockRuntimeError,
    Sentinel,
)
from redreentrant.testing import LocalEnsemble


def in_loop(masters: list[str], test: Callable[[], Awaitable[None]]) -> None:
    """Run ``test`` in an event loop of its own, and close the loop's shared manager."""

    async def main() -> None:
        try:
            await test()
        finally:
            await managers.async_manager(masters).close()

    run(main())


async def waiting(condition: Callable[[], bool], what: str) -> None:
    """:func:`wait_until` from a coroutine, in a thread (the loop runs on)."""
    await asyncio.to_thread(wait_until, condition, what)


def test_lock_and_unlock(masters: list[str], ensemble: LocalEnsemble) -> None:
    async def test() -> None:
        lm = Aioredlock(masters)
        assert await lm.is_locked("pants") is False
        lock = await lm.lock("pants")
        assert isinstance(lock, Lock)
        assert (lock.resource, lock.lock_timeout, lock.valid) == ("pants", None, True)
        assert isinstance(lock.id, str)
        assert lock.lock_manager is lm
        assert await lm.is_locked("pants") is True
        assert await lm.is_locked(lock) is True
        assert await lock.is_locked() is True
        assert set(lock_keys(ensemble)) == set(masters)  # under redreentrant's keys
        await lm.extend(lock)
        assert lock.valid is True
        await lm.unlock(lock)
        assert lock.valid is False
        assert await lm.is_locked("pants") is False
        await lm.destroy()

    in_loop(masters, test)
    assert lock_keys(ensemble) == {}


def test_not_reentrant(masters: list[str]) -> None:
    async def test() -> None:
        lm = Aioredlock(masters, retry_count=2, retry_delay_min=0.01, retry_delay_max=0.05)
        lock = await lm.lock("pants")
        started = time.monotonic()
        with pytest.raises(LockAcquiringError):
            await lm.lock("pants")
        assert time.monotonic() - started < 5  # bounded by its retries
        with pytest.raises(LockError):
            await Aioredlock(masters, retry_count=1).lock("pants", 10)
        assert await lm.is_locked("pants")
        await lm.unlock(lock)
        again = await lm.lock("pants", 10)
        await again.release()

    in_loop(masters, test)


def test_the_same_identifier_sets_the_lock_again(masters: list[str]) -> None:
    async def test() -> None:
        lm = Aioredlock(masters, retry_count=1)
        first = await lm.lock("pants", 5, lock_identifier="me")
        second = await lm.lock("pants", 30, lock_identifier="me")  # not refused
        assert (second.id, second.valid) == ("me", True)
        assert (await lm.get_lock("pants", "me")).lock_timeout > 5  # 30 s from now
        with pytest.raises(LockAcquiringError):
            await lm.lock("pants", 5, lock_identifier="other")
        await lm.unlock(first)  # not counted: one unlock frees it
        assert not await lm.is_locked("pants")
        await lm.unlock(second)  # no longer held: ignored
        with pytest.raises(LockAcquiringError):
            await lm.get_lock("pants", "me")

    in_loop(masters, test)


def test_waiter_woken_by_the_release(masters: list[str]) -> None:
    async def test() -> None:
        lm = Aioredlock(masters)
        lock = await lm.lock("woken")
        slow = Aioredlock(masters, retry_count=2, retry_delay_min=60, retry_delay_max=60)
        started = time.monotonic()
        waiter = asyncio.ensure_future(slow.lock("woken"))
        await waiting(lambda: all(registered(masters, "woken")), "the waiter registered")
        await lm.unlock(lock)
        got = await asyncio.wait_for(waiter, 30)
        assert got.valid
        assert time.monotonic() - started < 30  # woken by the release, not its bound
        await got.release()

    in_loop(masters, test)


def test_short_fixed_lease(masters: list[str], ensemble: LocalEnsemble) -> None:
    async def test() -> None:
        lm = Aioredlock(masters, retry_count=3, retry_delay_min=0.01, retry_delay_max=0.02)
        lock = await lm.lock("short", 0.01)
        assert (lock.valid, lock.lock_timeout) == (True, 0.01)
        while await lm.is_locked("short"):
            pass  # its 10 ms lease ends: nothing renews it
        other = await lm.lock("short", 30)  # free again, though never unlocked
        with pytest.raises(LockAcquiringError):
            await lm.extend(lock)  # another holds it now: not extended, and unlocked
        assert lock.valid is False
        with pytest.raises(LockAcquiringError):
            await lm.unlock(lock)  # as aioredlock: the resource is another's
        assert await lm.is_locked("short")
        await other.release()
        with pytest.raises(LockError, match="Lock timeout"):
            await lm.lock("short", 0.003)  # shorter than the shortest lease honoured

    in_loop(masters, test)
    assert lock_keys(ensemble) == {}


def test_extend(masters: list[str]) -> None:
    async def test() -> None:
        lm = Aioredlock(masters)
        fixed = await lm.lock("fixed", 1)
        await lm.extend(fixed, 30)
        assert (await lm.get_lock("fixed", fixed.id)).lock_timeout > 20
        await fixed.extend()  # the lock's own lock_timeout from now
        assert (await lm.get_lock("fixed", fixed.id)).lock_timeout <= 1
        with pytest.raises(ValueError):
            await lm.extend(fixed, -1)
        await fixed.release()
        with pytest.raises(RuntimeError, match="Lock is not valid"):
            await lm.extend(fixed)
        renewed = await lm.lock("renewed")
        # Deleted behind its back: extend() finds it lost, and takes it again (free).
        assert await managers.async_manager(masters).lock("renewed").force_unlock()
        await lm.extend(renewed)
        assert renewed.valid
        assert await lm.is_locked("renewed")
        await lm.unlock(renewed)

    in_loop(masters, test)


def test_mutual_exclusion(masters: list[str]) -> None:
    async def test() -> None:
        a, b = Aioredlock(masters), Aioredlock(list(masters))
        counter = [0]

        async def work(lm: Aioredlock) -> None:
            for _ in range(10):
                while True:
                    try:
                        lock = await lm.lock("counter")
                        break
                    except LockError:
                        continue
                await aincrement(counter)
                await lm.unlock(lock)

        await asyncio.gather(*(work(lm) for lm in (a, b, a, b)))
        assert counter[0] == 40

    in_loop(masters, test)


def test_another_task_unlocks(masters: list[str]) -> None:
    async def test() -> None:
        lm = Aioredlock(masters)
        lock = await asyncio.create_task(lm.lock("pants"))  # taken by a task that ends
        assert await lm.is_locked("pants")
        async with lock:
            assert lock.valid
        assert lock.valid is False
        assert not await lm.is_locked("pants")

    in_loop(masters, test)


def test_cancelled_lock_leaves_nothing(masters: list[str], ensemble: LocalEnsemble) -> None:
    async def test() -> None:
        lm = Aioredlock(masters, retry_count=2, retry_delay_min=30, retry_delay_max=30)
        lock = await lm.lock("pants")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(lm.lock("pants"), 0.05)
        await lm.unlock(lock)

    in_loop(masters, test)
    assert lock_keys(ensemble) == {}


def test_destroy_and_active_locks(masters: list[str]) -> None:
    async def test() -> None:
        lm = Aioredlock(masters)
        one, two = await lm.lock("one"), await lm.lock("two", 30)
        assert await lm.get_active_locks() == [one, two]
        await lm.destroy()
        assert (one.valid, two.valid) == (False, False)
        assert not await lm.is_locked("one")
        assert not await lm.is_locked("two")
        assert await lm.get_active_locks() == []

    in_loop(masters, test)


def test_connection_forms(ensemble: LocalEnsemble) -> None:
    server = ensemble.servers[0]
    url = ensemble.urls[0]

    async def test() -> None:
        client = redis.asyncio.Redis(host=server.host, port=server.port)
        forms: list[Any] = [
            [url],
            [(server.host, server.port)],
            [{"host": server.host, "port": server.port, "db": 0, "minsize": 1}],
            [client],
        ]
        holder = Aioredlock(forms[0])
        lock = await holder.lock("pants")
        for form in forms[1:]:
            with pytest.raises(LockAcquiringError):  # the same lock, whatever the form
                await Aioredlock(form, retry_count=1).lock("pants")
        await holder.unlock(lock)
        for form in forms[1:]:
            await Aioredlock(form)._manager().close()
        await client.aclose()

    in_loop([url], test)


def test_managers_are_shared(ensemble: LocalEnsemble) -> None:
    urls = ensemble.urls
    server = ensemble.servers[0]

    async def test() -> None:
        a, b = Aioredlock(urls), Aioredlock(list(urls))
        assert a._manager() is b._manager() is managers.async_manager(urls)
        c = Aioredlock([{"host": server.host, "port": server.port}])
        d = Aioredlock([(server.host, server.port)])
        assert c._manager() is d._manager()
        await c._manager().close()

    in_loop(urls, test)


def test_quorum(ensemble: LocalEnsemble) -> None:
    urls = ensemble.urls

    async def test() -> None:
        lm = Aioredlock(urls, retry_count=2, retry_delay_min=0.01, retry_delay_max=0.02)
        ensemble.servers[3].stop()
        ensemble.servers[4].stop()
        lock = await lm.lock("pants", 30)  # 3 of 5
        ensemble.servers[2].stop()
        with pytest.raises(LockRuntimeError):
            await lm.unlock(lock)
        with pytest.raises(LockRuntimeError):
            await lm.lock("other")  # 2 of 5: no quorum
        assert await lm.is_locked("pants") is False  # as aioredlock: no majority says so
        with pytest.raises(LockRuntimeError):
            await lm.unlock(Lock(lm, "pants", "unknown"))

    in_loop(urls, test)


def test_arguments_and_errors(ensemble: LocalEnsemble) -> None:
    assert issubclass(LockAcquiringError, LockError)
    assert issubclass(LockRuntimeError, LockError)
    assert issubclass(LockError, AioredlockError)
    lm = Aioredlock()  # aioredlock's default master; nothing is connected yet
    assert lm.redis_connections == [{"host": "localhost", "port": 6379}]
    assert (lm.retry_count, lm.retry_delay_min, lm.retry_delay_max) == (3, 0.1, 0.3)
    assert lm.internal_lock_timeout == 10.0
    assert lm == Aioredlock()
    shown = repr(Aioredlock([{"host": "h", "password": "secret"}, "redis://:secret@h:1/0"]))
    assert "secret" not in shown
    for name, value, error in [
        ("retry_count", 0, ValueError),
        ("retry_delay_min", -1, ValueError),
        ("retry_delay_max", "string", ValueError),
        ("internal_lock_timeout", None, TypeError),
    ]:
        with pytest.raises(error):
            Aioredlock(**{name: value})
    with pytest.raises(TypeError, match="Sentinel"):
        Sentinel(("localhost", 26379), master="leader")
    with pytest.raises(TypeError, match="not supported"):
        Aioredlock([{"host": "h", "ssl": True}])
    with pytest.raises(TypeError, match="not a master"):
        Aioredlock([object()])
    assert Lock(lm, "potato", 1, 1.0).valid is False
    url = ensemble.urls[0]

    async def test() -> None:
        lm = Aioredlock([url])
        with pytest.raises(ValueError):
            await lm.lock("pants", -1)
        with pytest.raises(TypeError):
            await lm.is_locked(12345)  # type: ignore[arg-type]

    in_loop([url], test)
