"""``@mgr.synchronized(...)``, sync and asyncio, against real masters: exclusion,
re-entry, skipping, time-outs, names bound to arguments, methods and lock kinds."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import aincrement, in_threads, increment, many_managers, run

import redreentrant.asyncio as aio
from redreentrant import LockManager, LockTimeoutError, LockUpgradeError, ManagerClosedError


@contextmanager
def held_elsewhere(urls: list[str], name: str, kind: str = "lock") -> Iterator[None]:
    """``name`` held by another manager (another owner) for the block."""
    with LockManager(urls) as other:
        lock = other.rw_lock(name).read if kind == "read" else other.lock(name)
        assert lock.acquire(blocking=False)
        try:
            yield
        finally:
            lock.release()


@contextmanager
def held_by_another_thread(manager: LockManager, name: str) -> Iterator[None]:
    """``name`` held by another thread of ``manager`` for the block."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with manager.lock(name):
            taken.set()
            done.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    assert taken.wait(10)
    try:
        yield
    finally:
        done.set()
        thread.join(10)


# -- the sync decorator -------------------------------------------------------------------


def test_decorated_calls_of_threads_exclude_each_other(manager: LockManager) -> None:
    counter = [0]

    @manager.synchronized("counter")
    def bump() -> None:
        increment(counter)

    def work() -> None:
        for _ in range(15):
            bump()

    in_threads(work, [()] * 6)
    assert counter[0] == 90
    assert not manager.lock("counter").locked()


def test_each_name_made_from_the_arguments_is_a_lock_of_its_own(urls: list[str]) -> None:
    counters = {"a": 0, "b": 0}

    def slow_bump(mgr: LockManager) -> Any:
        @mgr.synchronized("counter:{key}")
        def bump(key: str) -> None:
            increment(counters, key)

        return bump

    with many_managers(2, urls) as managers:
        workers = [slow_bump(managers[i % 2]) for i in range(4)]
        in_threads(lambda w, k: [w(k) for _ in range(10)], zip(workers, "abab", strict=True))
        assert counters == {"a": 20, "b": 20}

        # Two names do not exclude each other: each call waits inside for the other.
        arrived = {"a": threading.Event(), "b": threading.Event()}

        @managers[0].synchronized("room:{room}")
        def meet(room: str, other: str) -> bool:
            arrived[room].set()
            return arrived[other].wait(10)

        results: list[bool] = []
        in_threads(lambda r, o: results.append(meet(r, o)), [("a", "b"), ("b", "a")], 30)
        assert results == [True, True]


def test_a_recursive_decorated_function_reenters_its_lock(manager: LockManager) -> None:
    lock = manager.lock("factorial")
    depths: list[int] = []

    @manager.synchronized("factorial")
    def factorial(n: int) -> int:
        depths.append(lock.hold_count)
        return 1 if n <= 1 else n * factorial(n - 1)

    assert factorial(5) == 120
    assert depths == [1, 2, 3, 4, 5]
    assert lock.hold_count == 0 and not lock.locked()

    # A template re-enters when the recursive call makes the same name.
    tree = manager.lock("tree:root")
    seen: list[int] = []

    @manager.synchronized("tree:{root}")
    def walk(root: str, depth: int = 0) -> None:
        seen.append(tree.hold_count)
        if depth < 2:
            walk(root, depth + 1)

    walk("root")
    assert seen == [1, 2, 3] and not tree.locked()


def test_a_skipped_call_never_runs_and_returns_none(manager: LockManager, urls: list[str]) -> None:
    ran: list[str] = []

    @manager.synchronized("nightly:{day}", blocking=False)
    def nightly(day: str) -> str:
        ran.append(day)
        return f"report {day}"

    with held_elsewhere(urls, "nightly:mon"):
        assert nightly("mon") is None
    with held_by_another_thread(manager, "nightly:mon"):
        assert nightly("mon") is None
        assert nightly("tue") == "report tue"  # another name: not held
    assert ran == ["tue"]
    assert nightly("mon") == "report mon"
    # Held by the calling thread itself: the call re-enters and runs.
    with manager.lock("nightly:wed"):
        assert nightly("wed") == "report wed"
    assert ran == ["tue", "mon", "wed"]


def test_a_call_that_times_out_raises_and_never_runs(manager: LockManager, urls: list[str]) -> None:
    ran: list[int] = []

    @manager.synchronized("busy", timeout=0.3)
    def patient() -> int:
        ran.append(1)
        return 1

    @manager.synchronized("busy", timeout=0)
    def impatient() -> int:
        ran.append(0)
        return 0

    with held_elsewhere(urls, "busy"):
        start = time.monotonic()
        with pytest.raises(LockTimeoutError) as caught:
            patient()
        assert time.monotonic() - start >= 0.3
        error = caught.value
        assert (error.name, error.timeout) == ("busy", 0.3)
        assert "test_decorators" in str(error) and "patient() did not run" in str(error)
        with pytest.raises(TimeoutError):
            impatient()
    assert ran == []
    assert patient() == 1 and impatient() == 0


def test_a_blocking_call_waits_for_the_holder_to_release(manager: LockManager) -> None:
    ran = threading.Event()

    @manager.synchronized("handoff")
    def job() -> str:
        ran.set()
        return "done"

    with held_by_another_thread(manager, "handoff"):
        results: list[str] = []
        caller = threading.Thread(target=lambda: results.append(job()))
        caller.start()
        assert not ran.wait(0.2)  # waiting for the holder
    caller.join(10)
    assert results == ["done"]


def test_the_name_is_bound_to_the_calls_arguments(manager: LockManager) -> None:
    held: list[tuple[str, bool]] = []

    @manager.synchronized("order:{region}:{order.id}:{rush}")
    def settle(order: Any, region: str = "eu", *, rush: bool = False) -> None:
        expected = f"order:{region}:{order.id}:{rush}"
        held.append((expected, manager.lock(expected).is_owned()))

    settle(SimpleNamespace(id=1))
    settle(SimpleNamespace(id=2), "us", rush=True)
    settle(region="ap", order=SimpleNamespace(id=3))
    assert held == [
        ("order:eu:1:False", True),
        ("order:us:2:True", True),
        ("order:ap:3:False", True),
    ]

    @manager.synchronized("user:{kwargs[user]}:{args[0]}")
    def job(*args: Any, **kwargs: Any) -> bool:
        return manager.lock("user:ada:7").is_owned()

    assert job(7, user="ada")


def test_calls_whose_arguments_make_no_name_lock_nothing_and_do_not_run(
    manager: LockManager,
) -> None:
    ran: list[object] = []

    @manager.synchronized("order:{order.id}")
    def settle(order: Any) -> None:
        ran.append(order)

    with pytest.raises(TypeError, match="missing a required argument: 'order'"):
        settle()  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="AttributeError"):
        settle(object())
    assert ran == []


def test_methods_name_their_instance_and_keep_their_signature(manager: LockManager) -> None:
    class Account:
        def __init__(self, number: int) -> None:
            self.number = number

        @manager.synchronized("account:{self.number}")
        def withdraw(self, amount: int) -> bool:
            """Take money out."""
            return manager.lock(f"account:{self.number}").is_owned()

        @classmethod
        @manager.synchronized("accounts:{cls.__name__}")
        def open_count(cls) -> bool:
            return manager.lock("accounts:Account").is_owned()

        @staticmethod
        @manager.synchronized("audit")
        def audit() -> bool:
            return manager.lock("audit").is_owned()

    assert Account(7).withdraw(10) and Account.open_count() and Account.audit()
    withdraw = Account.withdraw
    assert withdraw.__name__ == "withdraw" and withdraw.__doc__ == "Take money out."
    assert inspect.signature(withdraw) == inspect.signature(withdraw.__wrapped__)  # type: ignore[attr-defined]
    assert list(inspect.signature(Account(1).withdraw).parameters) == ["amount"]


def test_lock_kinds_lease_and_exceptions(manager: LockManager, urls: list[str]) -> None:
    @manager.synchronized("queue", kind="fair")
    def fair() -> bool:
        return manager.fair_lock("queue").is_owned() and not manager.lock("queue").is_owned()

    assert fair()

    rw = manager.rw_lock("doc")

    @manager.synchronized("doc", kind="read")
    def read() -> bool:
        return rw.read.is_owned()

    @manager.synchronized("doc", kind="write", blocking=False)
    def write() -> bool:
        return rw.write.is_owned()

    with held_elsewhere(urls, "doc", kind="read"):
        assert read()  # readers share
        assert write() is None  # a reader elsewhere keeps the writer out
    assert write()

    @manager.synchronized("doc", kind="write")
    def edit() -> bool:
        return read()  # a writer may read

    @manager.synchronized("doc", kind="read")
    def peek_then_edit() -> bool:
        return edit()  # a reader may not write

    assert edit()
    with pytest.raises(LockUpgradeError):
        peek_then_edit()
    assert not rw.read.locked() and not rw.write.locked()

    @manager.synchronized("fixed", lease=2)
    def fixed() -> float:
        return manager.lock("fixed").remaining()

    assert 0 < fixed() <= 2

    @manager.synchronized("boom")
    def boom() -> None:
        raise KeyError("inside")

    with pytest.raises(KeyError, match="inside"):
        boom()
    assert not manager.lock("boom").locked()


def test_bad_options_and_templates_are_refused_before_any_call(manager: LockManager) -> None:
    def settle(order_id: int) -> None: ...

    with pytest.raises(ValueError, match="'orderid', which is not a parameter"):
        manager.synchronized("order:{orderid}")(settle)
    for options, error in [
        ({"kind": "mutex"}, ValueError),
        ({"blocking": False, "timeout": 1}, ValueError),
        ({"timeout": -5}, ValueError),
        ({"lease": 0}, ValueError),
        ({"blocking": "no"}, TypeError),
    ]:
        with pytest.raises(error):
            manager.synchronized("x", **options)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="malformed"):
        manager.synchronized("order:{")

    async def coroutine() -> None: ...

    with pytest.raises(TypeError, match="asyncio"):
        manager.synchronized("x")(coroutine)


def test_a_closed_manager_refuses_decorators_and_calls(urls: list[str]) -> None:
    mgr = LockManager(urls)

    @mgr.synchronized("x")
    def job() -> None: ...

    mgr.close()
    with pytest.raises(ManagerClosedError):
        job()
    with pytest.raises(ManagerClosedError):
        mgr.synchronized("x")


# -- the asyncio decorator ----------------------------------------------------------------


def test_a_recursive_await_reenters_in_the_calling_task(urls: list[str]) -> None:
    async def main() -> None:
        async with aio.LockManager(urls) as mgr:
            lock = mgr.lock("factorial")
            depths: list[int] = []

            @mgr.synchronized("factorial")
            async def factorial(n: int) -> int:
                depths.append(lock.hold_count)
                return 1 if n <= 1 else n * await factorial(n - 1)

            assert await factorial(4) == 24
            assert depths == [1, 2, 3, 4]
            assert lock.hold_count == 0 and not await lock.locked()
            # A call run as a task of its own owns the lock for that task's life.
            assert await asyncio.create_task(factorial(2)) == 2
            assert not await lock.locked()

    run(main())


def test_decorated_calls_of_tasks_exclude_each_other(urls: list[str]) -> None:
    async def main() -> None:
        managers = [aio.LockManager(urls) for _ in range(2)]
        counter = [0]

        def bumper(mgr: aio.LockManager) -> Any:
            @mgr.synchronized("counter:{key}")
            async def bump(key: str) -> None:
                await aincrement(counter, 0, 0.002)

            return bump

        async def work(i: int) -> None:
            bump = bumper(managers[i % 2])
            for _ in range(10):
                await bump("shared")

        await asyncio.gather(*(work(i) for i in range(4)))
        for m in managers:
            await m.close()
        assert counter[0] == 40

    run(main())


def test_async_skip_timeout_and_cancel_never_run_the_function(urls: list[str]) -> None:
    async def main() -> None:
        async with aio.LockManager(urls) as mgr:
            ran: list[str] = []

            @mgr.synchronized("job:{day}", blocking=False)
            async def nightly(day: str) -> str:
                ran.append(day)
                return day

            @mgr.synchronized("job:{day}", timeout=0.2)
            async def patient(day: str) -> str:
                ran.append(day)
                return day

            @mgr.synchronized("job:{day}")
            async def forever(day: str) -> str:
                ran.append(day)
                return day

            taken, done = asyncio.Event(), asyncio.Event()

            async def holder() -> None:
                async with mgr.lock("job:mon"):
                    taken.set()
                    await done.wait()

            task = asyncio.create_task(holder())
            await taken.wait()
            assert await nightly("mon") is None
            with pytest.raises(LockTimeoutError, match="patient\\(\\) did not run"):
                await patient("mon")
            waiting = asyncio.create_task(forever("mon"))
            await asyncio.sleep(0.1)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert ran == []
            done.set()
            await task
            assert await nightly("mon") == "mon" and await forever("mon") == "mon"
            assert not await mgr.lock("job:mon").locked()

    run(main())


def test_the_asyncio_decorator_takes_only_coroutine_functions(urls: list[str]) -> None:
    async def main() -> None:
        async with aio.LockManager(urls) as mgr:

            def plain(order_id: int) -> None: ...

            with pytest.raises(TypeError, match="'async def' functions"):
                mgr.synchronized("x")(plain)  # type: ignore[arg-type]

            async def settle(order_id: int, region: str = "eu") -> bool:
                """Settle an order."""
                return mgr.lock(f"order:{region}:{order_id}").is_owned()

            decorated = mgr.synchronized("order:{region}:{order_id}")(settle)
            assert inspect.iscoroutinefunction(decorated)
            assert inspect.signature(decorated) == inspect.signature(settle)
            assert decorated.__doc__ == "Settle an order." and decorated.__wrapped__ is settle  # type: ignore[attr-defined]
            assert await decorated(5, region="us")
            assert await functools.partial(decorated, 6)()
            with pytest.raises(ValueError, match="not a parameter"):
                mgr.synchronized("order:{id}")(settle)

    run(main())
