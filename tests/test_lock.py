"""The reentrant lock against five real masters: reentrancy, ownership, waiting, input."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import redis
from helpers import fields_on, holds_on, in_threads, on_masters, registered, wait_until

from redreentrant import (
    LockKeyTypeError,
    LockLostError,
    LockManager,
    LockNotOwnedError,
)
from redreentrant._core.keys import lock_key
from redreentrant.testing import LocalEnsemble


def test_nested_with_counts_holds_and_frees_at_the_outermost_exit(
    manager: LockManager, ensemble: LocalEnsemble
) -> None:
    lock = manager.lock("nested")
    depth_seen: list[int] = []

    def recurse(depth: int) -> None:
        with lock:
            depth_seen.append(lock.hold_count)
            if depth < 20:
                recurse(depth + 1)

    recurse(1)
    assert depth_seen == list(range(1, 21))
    assert lock.hold_count == 0 and not lock.is_owned() and not lock.locked()
    assert fields_on(ensemble, "nested") == [{}] * 5


def test_every_master_records_the_hold_count(manager: LockManager, ensemble: LocalEnsemble) -> None:
    lock = manager.lock("counted")
    with lock, lock, lock:
        owner = manager.owner_id().encode()
        assert fields_on(ensemble, "counted") == [{owner: b"3"}] * 5
        # The hold is "<count>:<tag>", the tag that of the try that took it: the same on
        # every master.
        assert len({str(fields) for fields in holds_on(ensemble, "counted")}) == 1
        assert lock.hold_count == 3 and lock.is_owned() and lock.locked()
        assert 0 < lock.remaining() <= manager.lease
    assert fields_on(ensemble, "counted") == [{}] * 5


def test_lock_objects_are_views_of_the_threads_hold(manager: LockManager) -> None:
    a, b = manager.lock("view"), manager.lock("view")
    with a:
        assert b.hold_count == 1 and b.acquire(blocking=False)
        assert a.hold_count == 2
        b.release()
    assert a.hold_count == 0


def test_another_thread_cannot_take_or_release_a_held_lock(manager: LockManager) -> None:
    lock = manager.lock("owned")
    results: dict[str, object] = {}

    def other() -> None:
        results["try"] = lock.acquire(blocking=False)
        started = time.monotonic()
        results["timed"] = lock.acquire(timeout=0.3)
        results["waited"] = time.monotonic() - started
        try:
            lock.release()
        except LockNotOwnedError as error:
            results["release"] = error
        results["count"] = lock.hold_count

    with lock:
        in_threads(other, timeout=None)
        assert lock.is_owned() and lock.hold_count == 1  # unchanged by the other thread
    assert results["try"] is False and results["timed"] is False
    assert 0.3 <= float(results["waited"]) < 2.0  # type: ignore[arg-type]
    assert isinstance(results["release"], LockNotOwnedError)
    assert results["count"] == 0


def test_two_managers_are_different_owners(urls: list[str]) -> None:
    with LockManager(urls) as one, LockManager(urls) as two:
        with one.lock("shared"):
            assert two.lock("shared").acquire(blocking=False) is False
        assert two.lock("shared").acquire(blocking=False) is True
        two.lock("shared").release()


def test_release_without_holding_raises_and_changes_nothing(
    manager: LockManager, urls: list[str]
) -> None:
    with LockManager(urls) as other, other.lock("free-me"):
        with pytest.raises(LockNotOwnedError):
            manager.lock("free-me").release()
        assert other.lock("free-me").is_owned()
        assert manager.lock("free-me").locked()


def test_a_blocked_acquirer_is_handed_the_lock_on_release_not_on_expiry(
    ensemble: LocalEnsemble,
) -> None:
    # Two managers: the hand-off crosses Redis pub/sub (the waiter's home channel), not
    # an in-process shortcut.
    urls = ensemble.urls
    with LockManager(urls, lease=60.0) as holder, LockManager(urls, lease=60.0) as waiter:
        holder.lock("handoff").acquire()
        got: list[bool] = []

        def wait() -> None:
            lock = waiter.lock("handoff")
            got.append(lock.acquire(timeout=20))  # the holder's lease is 60 s
            if got[-1]:
                lock.release()

        t = threading.Thread(target=wait)
        t.start()
        wait_until(
            lambda: all(len(r) == 1 for r in registered(ensemble.urls, "handoff")),
            "registered on every master",
        )
        holder.lock("handoff").release()
        t.join(timeout=30)
        assert got == [True], "the waiter was not woken by the release"


def test_a_local_release_wakes_local_waiters_without_pubsub(ensemble: LocalEnsemble) -> None:
    # Every pub/sub connection is cut before the release: only the in-process wake-up
    # (and not the 60 s lease) can hand the lock to the waiting threads.
    with LockManager(ensemble.urls, lease=60.0) as manager:
        lock = manager.lock("local")
        order: list[int] = []
        lock.acquire()

        def wait(i: int) -> None:
            if lock.acquire(timeout=20):
                order.append(i)
                lock.release()

        threads = [threading.Thread(target=wait, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        wait_until(
            lambda: all(len(r) == 3 for r in registered(ensemble.urls, "local")),
            "all three registered on every master",
        )
        on_masters(ensemble.urls, lambda r: r.client_kill_filter(_type="pubsub"))
        lock.release()
        for t in threads:
            t.join(timeout=60)
        assert sorted(order) == [0, 1, 2]


def test_a_waiter_wakes_when_the_holders_lease_expires(urls: list[str]) -> None:
    with LockManager(urls) as holder, LockManager(urls) as waiter:
        assert holder.lock("expire").acquire(lease=0.5)
        started = time.monotonic()
        assert waiter.lock("expire").acquire(timeout=5)
        assert time.monotonic() - started > 0.3  # not before the holder's lease ended
        waiter.lock("expire").release()


def test_force_unlock_frees_a_lock_held_elsewhere(urls: list[str]) -> None:
    with LockManager(urls) as holder, LockManager(urls) as admin:
        holder.lock("stuck").acquire(lease=60)
        assert admin.lock("stuck").force_unlock() is True
        assert not admin.lock("stuck").locked()
        assert admin.lock("stuck").force_unlock() is False
        assert admin.lock("stuck").acquire(blocking=False)
        admin.lock("stuck").release()
        # The holder was told nothing until now: its release finds the hold gone.
        with pytest.raises(LockLostError):
            holder.lock("stuck").release()
        assert holder.lock("stuck").hold_count == 0


def test_a_managed_hold_forced_open_stays_free_after_its_holders_renewal(urls: list[str]) -> None:
    lost: list[object] = []
    with LockManager(urls, lease=3.0, on_lost=lost.append) as holder, LockManager(urls) as admin:
        assert holder.lock("stuck").acquire()
        assert admin.lock("stuck").force_unlock()
        # Its next renewal takes it again where the lock is free, finds it lost, gives it back.
        wait_until(lambda: lost, "the loss reported at the holder's next renewal", 5)
        assert not admin.lock("stuck").locked()


def test_one_master_is_a_legal_ensemble(single: LockManager) -> None:
    assert single.quorum == 1
    with single.lock("solo") as lock, lock:
        assert lock.hold_count == 2


# -- bad input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"lease": 0}, ValueError),
        ({"lease": -1}, ValueError),
        ({"lease": 0.001}, ValueError),
        ({"lease": "5"}, TypeError),
        ({"timeout": -2}, ValueError),
        ({"timeout": -0.5}, ValueError),
        ({"timeout": float("nan")}, ValueError),
        ({"blocking": False, "timeout": 1}, ValueError),
        ({"timeout": "1"}, TypeError),
    ],
)
def test_bad_acquire_arguments_raise_before_anything_is_sent(
    manager: LockManager, ensemble: LocalEnsemble, kwargs: dict[str, object], error: type
) -> None:
    with pytest.raises(error):
        manager.lock("bad").acquire(**kwargs)  # type: ignore[arg-type]
    assert fields_on(ensemble, "bad") == [{}] * 5


@pytest.mark.parametrize("name", ["", None, 42])
def test_bad_names_are_refused(manager: LockManager, name: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        manager.lock(name)  # type: ignore[arg-type]


def test_bad_manager_arguments_are_refused(urls: list[str]) -> None:
    with pytest.raises(ValueError, match="at least one master"):
        LockManager([])
    with pytest.raises(ValueError, match="given twice"):
        LockManager([urls[0], urls[1], urls[0]])
    with pytest.raises(ValueError, match="are one server: they are not independent masters"):
        LockManager([urls[0], urls[0].replace("127.0.0.1", "localhost")])
    two_dbs = [urls[0], urls[0].removesuffix("/0") + "/1"]
    with pytest.raises(ValueError, match="are one server: they are not independent masters"):
        LockManager(two_dbs)
    with pytest.raises(ValueError, match="lease"):
        LockManager(urls, lease=0)
    with pytest.raises(ValueError, match="master_timeout"):
        LockManager(urls, lease=1, master_timeout=0.5)
    with pytest.raises(TypeError):
        LockManager([object()])  # type: ignore[list-item]


def test_a_key_holding_other_data_is_a_lock_error_and_is_left_alone(
    manager: LockManager, ensemble: LocalEnsemble
) -> None:
    with redis.Redis.from_url(ensemble.urls[2]) as r:
        r.set(lock_key("taken"), "somebody's data")
        with pytest.raises(LockKeyTypeError, match=r"\{taken\}") as raised:
            manager.lock("taken").acquire()
        assert raised.value.key == lock_key("taken")
        assert r.get(lock_key("taken")) == b"somebody's data"
        with pytest.raises(LockKeyTypeError):
            manager.lock("taken").force_unlock()
        assert r.get(lock_key("taken")) == b"somebody's data"
        r.delete(lock_key("taken"))
    assert fields_on(ensemble, "taken") == [{}] * 5


def test_a_closed_manager_refuses_work(urls: list[str]) -> None:
    mgr = LockManager(urls)
    lock = mgr.lock("closed")
    mgr.close()
    with pytest.raises(RuntimeError, match="closed"):
        lock.acquire()


@pytest.mark.parametrize("masters", [1, 3])
def test_acquires_interrupted_mid_send_give_their_connections_back(
    urls: list[str], monkeypatch: pytest.MonkeyPatch, masters: int
) -> None:
    """A send interrupted (KeyboardInterrupt) leaves its stream out of step; the
    connection must go back to the pool (closed), not be kept: with a bounded pool, a
    few such interruptions would leave no connection to make a round with."""
    interrupting = threading.Event()
    send = redis.Connection.send_packed_command

    def send_packed_command(
        self: redis.Connection, command: object, check_health: bool = True
    ) -> None:
        if interrupting.is_set():  # this send only: the acquire's clean-up goes out
            interrupting.clear()
            raise KeyboardInterrupt
        send(self, command, check_health)  # type: ignore[arg-type]

    monkeypatch.setattr(redis.Connection, "send_packed_command", send_packed_command)
    clients = [redis.Redis.from_url(u, max_connections=2) for u in urls[:masters]]
    try:
        with LockManager(clients, lease=30) as mgr:
            lock = mgr.lock("interrupted-mid-send")
            with lock:  # connected: later rounds take idle connections
                pass
            for _ in range(4):
                interrupting.set()
                with pytest.raises(KeyboardInterrupt):
                    lock.acquire()
                assert lock.hold_count == 0
            # Two connections per master at most: none may have been kept.
            assert lock.acquire(timeout=5)
            lock.release()
            for view in mgr.inspect("interrupted-mid-send"):
                assert view.locks == []
    finally:
        for client in clients:
            client.close()


def test_a_lease_shorter_than_the_master_timeout_is_honoured(urls: list[str]) -> None:
    # 10 ms, as redlock-py's users give: a grant counts only with validity left.
    with LockManager(urls[:3]) as mgr:
        assert mgr.master_timeout == 0.25
        lock = mgr.lock("brief")
        assert lock.acquire(lease=0.5)  # the connections are made
        lock.release()
        granted = 0
        for _ in range(20):
            if lock.acquire(blocking=False, lease=0.01):
                granted += 1
                with contextlib.suppress(LockLostError):  # it may have lapsed already
                    lock.release()
        assert granted >= 1
        assert lock.acquire(lease=0.01)
        time.sleep(0.02)
        assert threading_acquire(mgr, "brief")  # lapsed by itself: another owner takes it
        with pytest.raises(LockLostError):
            lock.release()
        with pytest.raises(ValueError, match=r"the shortest lease honoured is 4\.1 ms"):
            lock.acquire(lease=0.001)


def threading_acquire(mgr: LockManager, name: str) -> bool:
    """Whether another thread (another owner) takes ``name`` at once (then released)."""
    got: list[bool] = []

    def take() -> None:
        lock = mgr.lock(name)
        got.append(lock.acquire(blocking=False))
        if got[-1]:
            lock.release()

    in_threads(take, timeout=10)
    return got == [True]
