"""The owner's whole life cycle and the unhappy paths around it: late replies, loss
reported in time, bad settings, dead owners, hidden tasks, closing under waiters,
re-entry leases, slow callbacks, odd names, pickled errors and who holds a lock."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import multiprocessing
import os
import pickle
import re
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
import redis
from helpers import (
    FLAVOURS,
    aw,
    cluster_port,
    delete_everywhere,
    entered,
    fields_on,
    in_threads,
    lock_keys,
    registered,
    run,
    wait_until,
)
from redis.crc import key_slot

import redreentrant.asyncio as aio
from redreentrant import (
    LockKeyTypeError,
    LockLostError,
    LockManager,
    LockNotOwnedError,
    LockOwnerError,
    ManagerClosedError,
    QuorumUnavailableError,
    parse_owner,
)
from redreentrant import errors as error_module
from redreentrant._core.keys import PREFIX, lock_key
from redreentrant.testing import LocalEnsemble, LocalServer, RedisServerNotFound

# -- 1. a connection that timed out is never reused with a reply owed -----------------


def _freeze_then_thaw(ensemble: LocalEnsemble, masters: tuple[int, ...]) -> None:
    for i in masters:
        ensemble[i].resume()
    # What the frozen masters got late runs now; a stray grant lapses with its lease.
    wait_until(lambda: not lock_keys(ensemble), "freed everywhere")


@pytest.mark.parametrize("api", FLAVOURS)
def test_never_reads_a_late_reply_of_an_earlier_round(ensemble: LocalEnsemble, api: Any) -> None:
    async def main() -> None:
        async with entered(api.LockManager(ensemble.urls, lease=2.0, master_timeout=0.2)) as mgr:
            lock = mgr.lock("stale")
            for i in (0, 1, 2):
                ensemble[i].pause()
            with pytest.raises(QuorumUnavailableError):
                await aw(lock.acquire(blocking=False))
            _freeze_then_thaw(ensemble, (0, 1, 2))
            with LockManager(ensemble.urls) as rival, rival.lock("stale"):
                # The late replies of the frozen round said "granted": a connection
                # that kept them would make this round believe it holds the lock.
                assert not await aw(lock.acquire(blocking=False))
                assert not lock.is_owned() and lock.hold_count == 0
            assert await aw(lock.acquire(blocking=False))
            assert lock.is_owned()
            await aw(lock.release())

    run(main())


# -- 2. loss is reported before validity ends, at the edge of the settings --------------


@contextlib.contextmanager
def blackholed(ensemble: LocalEnsemble, masters: tuple[int, ...]) -> Iterator[None]:
    """Cut masters off: each is killed and its port left to a socket whose accept queue
    is full, so a connect hangs until its time-out (as behind a firewall that drops)."""
    holes: list[socket.socket] = []
    try:
        for i in masters:
            ensemble[i].kill()
            hole = socket.socket()
            hole.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            hole.bind(("127.0.0.1", ensemble[i].port))
            hole.listen(0)
            holes.append(hole)
            for _ in range(3):
                filler = socket.socket()
                filler.setblocking(False)
                filler.connect_ex(("127.0.0.1", ensemble[i].port))
                holes.append(filler)
        yield
    finally:
        for hole in holes:
            hole.close()


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_loss_is_reported_before_validity_ends_with_the_slowest_master_timeout(
    ensemble: LocalEnsemble, flavour: str
) -> None:
    # Rounds to 3 cut-off masters take a whole connect time-out per master (about the
    # lease here): the verdict must not wait for them.
    lease = 1.5
    master_timeout = lease / 3 - 0.01  # just under the largest accepted
    reported: list[float] = []
    ends: list[float] = []

    def sample(lock: Any) -> None:
        # The watchdog moves the validity on with each renewal.
        if lock.remaining() > 0:
            ends.append(time.monotonic() + lock.remaining())

    def on_lost(_: object) -> None:
        reported.append(time.monotonic())

    async def watch() -> None:
        manager = aio.LockManager if flavour == "asyncio" else LockManager
        options = {"lease": lease, "master_timeout": master_timeout, "on_lost": on_lost}
        async with entered(manager(ensemble.urls, **options)) as mgr:
            lock = mgr.lock("edge")
            await aw(lock.acquire())
            sample(lock)
            with blackholed(ensemble, (0, 1, 2)):
                end = time.monotonic() + 4 * lease
                while not reported and time.monotonic() < end:
                    sample(lock)
                    await asyncio.sleep(0.005)
            with pytest.raises((LockLostError, QuorumUnavailableError)):
                await aw(lock.release())

    run(watch())
    assert reported, "the loss was not reported"
    assert reported[0] < ends[-1], f"reported {reported[0] - ends[-1]:.3f}s after validity ended"


# -- 3. bad settings fail at once, naming the argument, changing nothing -------------------


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"lease": math.inf}, "lease"),
        ({"lease": 1e17}, "lease"),
        ({"lease": math.nan}, "lease"),
        ({"retry_jitter": math.inf}, "retry_jitter"),
        ({"retry_jitter": math.nan}, "retry_jitter"),
        ({"drift_factor": math.nan}, "drift_factor"),
        ({"master_timeout": math.inf}, "master_timeout"),
    ],
)
def test_bad_manager_settings_fail_at_once(
    urls: list[str], options: dict[str, float], argument: str
) -> None:
    for manager_class in (LockManager, aio.LockManager):
        with pytest.raises(ValueError, match=argument):
            manager_class(urls, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("lease", [math.inf, 1e17, -1.0, math.nan])
def test_bad_acquire_leases_fail_at_once_and_hold_nothing(
    manager: LockManager, ensemble: LocalEnsemble, lease: float
) -> None:
    lock = manager.lock("bad-lease")
    with pytest.raises(ValueError, match="lease"):
        lock.acquire(lease=lease)
    assert lock.hold_count == 0 and lock_keys(ensemble) == {}


def test_a_name_that_is_not_utf8_fails_at_once(manager: LockManager) -> None:
    for make in (manager.lock, manager.rw_lock, manager.fair_lock):
        with pytest.raises(ValueError, match="name"):
            make("orders:\ud800")
    with pytest.raises(ValueError, match="name"):
        manager.inspect("\udfff")
    with pytest.raises(TypeError, match="name"):
        manager.lock(b"bytes")  # type: ignore[arg-type]


# -- 4. holds of a dead owner ------------------------------------------------------------


@pytest.mark.parametrize("entry", ["acquire", "with"])
def test_a_thread_that_ends_holding_a_lock_frees_it_and_is_reported(
    ensemble: LocalEnsemble, caplog: pytest.LogCaptureFixture, entry: str
) -> None:
    reported: list[Any] = []
    caplog.set_level(logging.WARNING, logger="redreentrant")
    with (
        LockManager(ensemble.urls, lease=30.0, on_lost=reported.append) as mgr,
        LockManager(ensemble.urls) as rival,
    ):
        lines: list[int] = []

        def forgetful_worker() -> None:
            lock = mgr.lock("orphan")
            # Either way, it ends without releasing; the warning names this line.
            here = inspect.currentframe()
            assert here is not None
            lines.append(here.f_lineno + 2 if entry == "with" else here.f_lineno + 4)
            if entry == "with":
                lock.__enter__()
            else:
                lock.acquire()

        worker = threading.Thread(target=forgetful_worker, name="forgetful-worker")
        worker.start()
        worker.join()
        # Far sooner than the 30 s lease, which the watchdog no longer renews.
        assert rival.lock("orphan").acquire(timeout=10)
        wait_until(lambda: reported, "reported: the orphaned hold")
        assert getattr(reported[0], "name", None) == "orphan"
        warning = next(r.getMessage() for r in caplog.records if "orphan" in r.getMessage())
        assert "forgetful-worker" in warning
        assert f"{os.path.basename(__file__)}:{lines[0]} in forgetful_worker" in warning
        rival.lock("orphan").release()


def test_a_task_that_ends_holding_a_lock_frees_it_and_is_reported(
    ensemble: LocalEnsemble, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="redreentrant")

    async def main() -> None:
        reported: list[Any] = []
        async with (
            aio.LockManager(ensemble.urls, lease=30.0, on_lost=reported.append) as mgr,
            aio.LockManager(ensemble.urls) as rival,
        ):

            async def forgetful_task() -> None:
                await mgr.lock("orphan").acquire()  # and ends without releasing

            await asyncio.create_task(forgetful_task(), name="forgetful-task")
            assert await rival.lock("orphan").acquire(timeout=10)
            end = time.monotonic() + 10
            while not reported and time.monotonic() < end:
                await asyncio.sleep(0.01)
            assert getattr(reported[0], "name", None) == "orphan"
            await rival.lock("orphan").release()

    run(main())
    warning = next(r.getMessage() for r in caplog.records if "orphan" in r.getMessage())
    assert "forgetful-task" in warning and "forgetful_task" in warning


def test_a_fixed_lease_of_a_dead_owner_is_left_to_lapse(ensemble: LocalEnsemble) -> None:
    with LockManager(ensemble.urls, lease=1.0) as mgr:
        mgr.lock("kept-running").acquire()  # a managed hold: the watchdog runs
        in_threads(lambda: mgr.lock("fixed").acquire(lease=5.0), timeout=None)
        time.sleep(1.0)  # three watchdog ticks
        assert all(fields_on(ensemble, "fixed"))  # untouched: it ends with its lease
        mgr.lock("kept-running").release()
    wait_until(lambda: not lock_keys(ensemble), "freed everywhere")


_FORK: dict[str, Any] = {}


def _forked_child(conn: Any) -> None:
    mgr: LockManager = _FORK["mgr"]
    own = mgr.lock("child-own")
    own.acquire()
    time.sleep(1.2)  # several of the child's own watchdog ticks
    own.release()
    conn.send(mgr.lock("parent-thread").hold_count)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
# Forking a process that runs the watchdog's threads is the point here (Python 3.12+
# warns of it).
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_leaves_holds_of_threads_it_did_not_inherit(
    ensemble: LocalEnsemble,
) -> None:
    ctx = multiprocessing.get_context("fork")
    with LockManager(ensemble.urls, lease=1.0) as mgr:
        _FORK["mgr"] = mgr
        held, done = threading.Event(), threading.Event()
        owner: list[str] = []

        def holder() -> None:
            with mgr.lock("parent-thread"):
                owner.append(mgr.owner_id())
                held.set()
                done.wait()

        thread = threading.Thread(target=holder)
        thread.start()
        assert held.wait(10)
        # In the child the holder thread does not exist: it must still not be taken
        # for a dead owner there.
        parent_end, child_end = ctx.Pipe()
        child = ctx.Process(target=_forked_child, args=(child_end,))
        child.start()
        assert parent_end.recv() == 0
        child.join(timeout=10)
        assert fields_on(ensemble, "parent-thread") == [{owner[0].encode(): b"1"}] * 5
        done.set()
        thread.join()
        _FORK.clear()
    assert lock_keys(ensemble) == {}


# -- 5. an asyncio acquire in a task of its own ------------------------------------------


def test_an_acquire_in_a_task_of_its_own_fails_loudly_and_holds_nothing(
    ensemble: LocalEnsemble,
) -> None:
    async def main() -> None:
        async with aio.LockManager(ensemble.urls) as mgr:
            lock = mgr.lock("hidden")
            with pytest.raises(LockOwnerError, match="acquire\\(timeout="):
                await asyncio.create_task(lock.acquire())
            with pytest.raises(LockOwnerError):
                await asyncio.gather(lock.acquire(blocking=False))
            with pytest.raises(LockOwnerError):
                await asyncio.create_task(lock.__aenter__())
            assert lock_keys(ensemble) == {}
            if sys.version_info >= (3, 12):
                # wait_for runs the acquire in the calling task: the caller owns it.
                assert await asyncio.wait_for(lock.acquire(), 5)
                assert lock.hold_count == 1
                await lock.release()
            else:
                with pytest.raises(LockOwnerError, match="wait_for"):
                    await asyncio.wait_for(lock.acquire(), 5)
            assert lock_keys(ensemble) == {}

    run(main())


# -- 6. close() while others wait ---------------------------------------------------------


def test_close_wakes_waiting_threads_which_fail_and_take_nothing(
    ensemble: LocalEnsemble,
) -> None:
    with LockManager(ensemble.urls) as holder, holder.lock("closing"):
        mgr = LockManager(ensemble.urls)
        outcome: list[BaseException | bool] = []

        def waiter() -> None:
            try:
                outcome.append(mgr.lock("closing").acquire())
            except BaseException as error:
                outcome.append(error)

        thread = threading.Thread(target=waiter)
        thread.start()
        wait_until(lambda: registered(ensemble.urls[:1], "closing") != [[]], "registered")
        mgr.close()
        thread.join(timeout=10)
        assert not thread.is_alive(), "the waiter still waits on a closed manager"
        assert isinstance(outcome[0], ManagerClosedError)
        with pytest.raises(ManagerClosedError):
            mgr.lock("closing").acquire(blocking=False)
        with pytest.raises(ManagerClosedError):
            mgr.inspect("closing")
        with pytest.raises(RuntimeError):  # ManagerClosedError is one, as before
            mgr.fair_lock("closing")
    assert lock_keys(ensemble) == {}


def test_close_wakes_waiting_tasks_which_fail_and_take_nothing(ensemble: LocalEnsemble) -> None:
    async def main() -> None:
        async with aio.LockManager(ensemble.urls) as holder, holder.lock("closing"):
            mgr = aio.LockManager(ensemble.urls)

            async def waiter() -> bool:
                return await mgr.fair_lock("closing").acquire()

            async with holder.fair_lock("closing"):
                task = asyncio.create_task(waiter())
                while True:  # until the waiter is queued on the masters
                    views = await holder.inspect("closing")
                    if any(lv.queue for v in views for lv in v.locks):
                        break
                    await asyncio.sleep(0.01)
                await mgr.close()
                with pytest.raises(ManagerClosedError):
                    await asyncio.wait_for(task, 10)
                with pytest.raises(ManagerClosedError):
                    await mgr.lock("closing").acquire()

    run(main())
    assert lock_keys(ensemble) == {}  # the closed waiter left the queue


# -- 7. re-entry with lease= on a watchdog-managed hold --------------------------------------


def test_reentry_cannot_set_the_lease_of_a_managed_hold(
    manager: LockManager, ensemble: LocalEnsemble
) -> None:
    lock = manager.lock("reenter")
    with lock:
        with pytest.raises(ValueError, match="watchdog-managed"):
            lock.acquire(lease=1.0)
        assert lock.hold_count == 1
        with redis.Redis.from_url(ensemble[0].url) as r:
            assert r.pttl(lock_key("reenter")) > 2000  # still the manager's 5 s lease
            assert fields_on(ensemble, "reenter")[0] == {manager.owner_id().encode(): b"1"}


def test_reentry_of_a_fixed_hold_sets_its_fixed_lease(
    manager: LockManager, ensemble: LocalEnsemble
) -> None:
    lock = manager.lock("fixed-reenter")
    assert lock.acquire(lease=1.0)
    assert lock.acquire(lease=4.0)
    assert 3.0 < lock.remaining() <= 4.0
    with redis.Redis.from_url(ensemble[0].url) as r:
        assert 3000 < r.pttl(lock_key("fixed-reenter")) <= 4000
    lock.release()
    lock.release()


# -- 8. on_lost runs outside the renewal round -------------------------------------------------


def test_a_slow_on_lost_delays_no_other_renewal(ensemble: LocalEnsemble) -> None:
    slow_started = threading.Event()

    def on_lost(lock: Any) -> None:
        slow_started.set()
        time.sleep(3.0)

    with (
        LockManager(ensemble.urls, lease=1.0, on_lost=on_lost) as mgr,
        LockManager(ensemble.urls) as rival,
    ):
        doomed, kept = mgr.lock("doomed"), mgr.lock("kept")
        doomed.acquire()
        kept.acquire()
        delete_everywhere(ensemble.urls, lock_key("doomed"))
        assert slow_started.wait(10)
        end = time.monotonic() + 2.5  # well past the 1 s lease of "kept"
        while time.monotonic() < end:
            assert not rival.lock("kept").acquire(blocking=False)
            assert kept.is_owned()
            time.sleep(0.1)
        kept.release()
        with pytest.raises(LockLostError):
            doomed.release()


def test_a_slow_async_on_lost_delays_no_other_renewal(ensemble: LocalEnsemble) -> None:
    async def main() -> None:
        started = asyncio.Event()

        async def on_lost(lock: Any) -> None:
            started.set()
            await asyncio.sleep(3.0)

        async with (
            aio.LockManager(ensemble.urls, lease=1.0, on_lost=on_lost) as mgr,
            aio.LockManager(ensemble.urls) as rival,
        ):
            doomed, kept = mgr.lock("doomed"), mgr.lock("kept")
            await doomed.acquire()
            await kept.acquire()
            delete_everywhere(ensemble.urls, lock_key("doomed"))
            await asyncio.wait_for(started.wait(), 10)
            end = time.monotonic() + 2.5
            while time.monotonic() < end:
                assert not await rival.lock("kept").acquire(blocking=False)
                assert kept.is_owned()
                await asyncio.sleep(0.1)
            await kept.release()
            with pytest.raises(LockLostError):
                await doomed.release()

    run(main())


def test_closing_during_renewals_logs_no_error(
    ensemble: LocalEnsemble, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="redreentrant")
    ensemble[4].pause()  # every renewal round waits out the master timeout
    for _ in range(5):
        mgr = LockManager(ensemble.urls, lease=0.3, master_timeout=0.09)
        mgr.lock("closing-tick").acquire()
        time.sleep(0.15)  # mid-way through the watchdog's ticks
        mgr.close()
    ensemble[4].resume()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    wait_until(lambda: not lock_keys(ensemble), "freed everywhere")


# -- 10. masters as one comma-separated string ----------------------------------------------


def test_masters_as_one_comma_separated_string(ensemble: LocalEnsemble) -> None:
    with LockManager(",".join(ensemble.urls)) as mgr:
        assert len(mgr.masters) == 5 and mgr.quorum == 3
    bare = ",".join(url.split("//")[1].split("/")[0] for url in ensemble.urls)
    with LockManager(bare) as mgr:  # host:port, as on the command line
        assert len(mgr.masters) == 5
    with pytest.raises(ValueError, match=r"redis//127\.0\.0\.1:6379"):
        LockManager("redis//127.0.0.1:6379")
    with pytest.raises(ValueError, match="comma"):
        LockManager([",".join(ensemble.urls[:2])])


# -- 11. names with braces keep every key of a lock in one slot ---------------------------------


NAMES = ["}x", "a}b", "{}", "{x}", "}", "%7D", "line\nbreak", "nul\x00byte", "orders:42"]


def test_every_key_of_a_lock_shares_one_slot_whatever_its_name(
    manager: LockManager, ensemble: LocalEnsemble
) -> None:
    assert lock_key("orders:42") == PREFIX + "{orders:42}"  # brace-free names keep keys
    seen: set[str] = set()
    for name in NAMES:
        ensemble.flushall()
        lock, rw, fair = manager.lock(name), manager.rw_lock(name), manager.fair_lock(name)
        with lock, rw.read, fair:
            with redis.Redis.from_url(ensemble[0].url) as r:
                keys = [k.decode() for k in r.keys(PREFIX + "{*")]
            assert len(keys) >= 3
            assert len({key_slot(k.encode()) for k in keys}) == 1, (name, keys)
            assert not seen & set(keys)  # no two names share a key
            seen |= set(keys)
            view = manager.inspect(name)[0]
            assert {lv.kind for lv in view.locks} == {"lock", "rw", "fair"}


def test_names_with_braces_work_on_a_cluster_node(ensemble: LocalEnsemble) -> None:
    # The server itself checks: keys of several slots in one script fail (CROSSSLOT).
    with tempfile.TemporaryDirectory() as directory:
        node = LocalServer(
            port=cluster_port(),
            directory=directory,
            extra_args=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"],
        )
        with node:
            with redis.Redis.from_url(node.url) as r:
                r.execute_command("CLUSTER", "ADDSLOTS", *range(16384))
                wait_until(
                    lambda: b"cluster_state:ok" in r.execute_command("CLUSTER", "INFO"),
                    "ok: the cluster",
                )
            with LockManager([node.url], lease=3.0) as mgr:
                for name in ("}x", "a}b", "{}"):
                    with mgr.rw_lock(name).write, mgr.fair_lock(name), mgr.lock(name):
                        assert mgr.lock(name).locked()


# -- 12. errors survive pickling ----------------------------------------------------------------


def test_every_error_survives_pickling() -> None:
    class Unpicklable(Exception):
        def __reduce__(self) -> Any:
            raise TypeError("no")

    errors: list[BaseException] = [
        QuorumUnavailableError(
            "acquire 'x'",
            {"a:1/0": redis.ConnectionError("refused"), "b:2/0": Unpicklable("odd")},
            3,
        ),
        LockKeyTypeError("redreentrant:v1:{x}", "a:1/0", "WRONGTYPE"),
        LockLostError("lost"),
        LockNotOwnedError("not owned"),
        LockOwnerError("hidden task"),
        ManagerClosedError("closed"),
        error_module.LockError("base"),
        error_module.LockUpgradeError("upgrade"),
        error_module.LockTimeoutError("x", 1.5, "f() did not run"),
        RedisServerNotFound("no binary"),
    ]
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
        assert copy.__dict__.keys() == error.__dict__.keys()
    quorum = pickle.loads(pickle.dumps(errors[0]))
    assert isinstance(quorum.errors["a:1/0"], redis.ConnectionError) and quorum.needed == 3
    assert "Unpicklable: odd" in str(quorum.errors["b:2/0"])
    every = [
        obj
        for obj in vars(error_module).values()
        if isinstance(obj, type) and issubclass(obj, BaseException)
    ]
    assert {type(e) for e in errors} >= {c for c in every if c.__module__ == error_module.__name__}


def test_a_quorum_error_crosses_a_process_boundary(ensemble: LocalEnsemble) -> None:
    ensemble[0].kill()
    ensemble[1].kill()
    ensemble[2].kill()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        future = pool.submit(_acquire_in_child, ensemble.urls)
        with pytest.raises(QuorumUnavailableError) as raised:
            future.result(timeout=60)
    assert len(raised.value.errors) == 3 and raised.value.needed == 3


def _acquire_in_child(urls: list[str]) -> bool:
    with LockManager(urls) as mgr:
        return mgr.lock("crossing").acquire(blocking=False)


# -- 13. who holds it ---------------------------------------------------------------------------


def test_the_owner_id_names_host_pid_and_thread(manager: LockManager) -> None:
    lock = manager.lock("who")
    result: dict[str, Any] = {}

    def worker() -> None:
        with lock:
            views = manager.inspect("who")
            result["holders"] = [h for v in views for lv in v.locks for h in lv.holders]

    thread = threading.Thread(target=worker, name="invoice-worker")
    thread.start()
    thread.join()
    assert len(result["holders"]) == 5 and len(set(result["holders"])) == 1
    info = parse_owner(result["holders"][0])
    assert info is not None
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64] or "localhost"
    assert info.pid == os.getpid() and info.host == host
    assert info.kind == "thread" and info.name == "invoice-worker"
    assert info.describe() == f"host {info.host} pid {os.getpid()} thread invoice-worker"
    assert manager.id.startswith(f"{info.host}:{os.getpid()}:")
    assert parse_owner("e4258c11a0:t1") is None  # an id of another format
