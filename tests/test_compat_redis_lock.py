"""redreentrant.compat.redis_lock, python-redis-lock's API: what a program sees through the
adapter against real masters (exclusion, no reentrancy, ids as owners, the library's
errors, return values and log messages, leases, reset, shared managers, no keys left),
and python-redis-lock's own tests run against it."""

from __future__ import annotations

import gc
import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import in_threads, library_source, lock_keys, registered, run_library_tests, wait_until

import redreentrant
from redreentrant import LockManager, parse_owner
from redreentrant.compat import managers
from redreentrant.compat import redis_lock as rl
from redreentrant.testing import LocalEnsemble, LocalServer

pytestmark = pytest.mark.integration

SHIMS = Path(__file__).parent / "compat_shims" / "redis_lock"


@pytest.fixture
def url(ensemble: LocalEnsemble) -> str:
    return ensemble.urls[0]


@pytest.fixture(params=[False, True], ids=["bytes", "decoded"])
def conn(request: pytest.FixtureRequest, url: str) -> Iterator[redis.StrictRedis]:
    client = redis.StrictRedis.from_url(url, decode_responses=request.param)
    yield client
    client.close()


def not_acquired(name: str) -> str:
    return re.escape(f"Lock(lock:{name}) is not acquired or it already expired.")


# -- exclusion -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [{}, {"expire": 5}, {"expire": 2, "auto_renewal": True}],
    ids=["never-expires", "fixed", "auto-renewal"],
)
def test_lock_objects_exclude_each_other(url: str, options: dict[str, Any]) -> None:
    """Threads, each with a client and Lock objects of its own, increment a counter by
    read, sleep, write: no increment is lost."""
    counter = [0]
    rounds, workers = 15, 6

    def work() -> None:
        with redis.StrictRedis.from_url(url) as client:
            for _ in range(rounds):
                with rl.Lock(client, "counter", **options):
                    value = counter[0]
                    time.sleep(0.001)
                    counter[0] = value + 1

    in_threads(work, [()] * workers)
    assert counter[0] == rounds * workers


def test_not_reentrant(conn: redis.StrictRedis) -> None:
    lock = rl.Lock(conn, "job")
    assert lock.acquire() is True
    try:
        with pytest.raises(
            rl.AlreadyAcquired, match=r"^Already acquired from this Lock instance\.$"
        ):
            lock.acquire()
        with pytest.raises(RuntimeError):
            lock.acquire(blocking=False)
        with pytest.raises(rl.AlreadyAcquired):  # another object of the same id
            rl.Lock(conn, "job", id=lock.id).acquire()
        other = rl.Lock(conn, "job")
        assert other.acquire(blocking=False) is False
        assert other.acquire(timeout=1) is False
        with (
            pytest.raises(rl.NotAcquired, match=not_acquired("job")),
            rl.Lock(conn, "job", blocking=False),
        ):
            pass
    finally:
        lock.release()
    with pytest.raises(rl.NotAcquired, match=not_acquired("job")):
        lock.release()
    # Released: the same object takes it again.
    with lock:
        assert lock.locked()
    assert not lock.locked()


def test_an_id_is_one_owner(conn: redis.StrictRedis) -> None:
    """Lock objects of one id release and extend what another took, from any thread."""
    lock = rl.Lock(conn, "handoff", expire=5, id=b"worker-1")
    assert lock.id == "worker-1"
    assert lock.acquire()
    rl.Lock(conn, "handoff", id="worker-1").extend(10)
    in_threads(rl.Lock(conn, "handoff", id="worker-1").release, timeout=10)
    assert not lock.locked()
    with pytest.raises(rl.NotAcquired):
        lock.release()
    with pytest.raises(rl.NotAcquired):
        rl.Lock(conn, "handoff", id="worker-2").release()


def test_an_id_waits_for_its_own_lock_taken_meanwhile(conn: redis.StrictRedis, url: str) -> None:
    """While one thread's acquire of an id waits, the same id from another thread does
    not hold the lock (as in the library): it cannot release it, and a non-blocking
    acquire fails."""
    holder = rl.Lock(conn, "self")
    assert holder.acquire()
    mine = rl.Lock(conn, "self", id="me")
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(mine.acquire(timeout=10)))
    thread.start()
    wait_until(lambda: registered([url], "self") != [[]], "the first acquire waiting")
    again = rl.Lock(conn, "self", id="me")
    assert again.acquire(blocking=False) is False
    with pytest.raises(rl.NotAcquired):
        again.release()
    holder.release()
    thread.join(10)
    assert got == [True]
    with pytest.raises(rl.AlreadyAcquired):
        again.acquire()
    again.release()


def test_an_id_that_holds_the_lock_cannot_take_it_again(conn: redis.StrictRedis) -> None:
    """As in the library (its test_given_id): while an id holds the lock, every Lock
    object of that id raises AlreadyAcquired, also without blocking; any of them releases
    it."""
    first = rl.Lock(conn, "given", id="a")
    assert first.acquire()
    second = rl.Lock(conn, "given", id="a")
    with pytest.raises(rl.AlreadyAcquired):
        second.acquire(blocking=False)
    with pytest.raises(rl.AlreadyAcquired):
        second.acquire()
    second.release()
    with pytest.raises(rl.NotAcquired):
        first.release()
    assert second.acquire(blocking=False) is True
    with pytest.raises(rl.AlreadyAcquired):
        first.acquire(blocking=False)
    first.release()


@pytest.mark.parametrize(
    "options",
    [{}, {"expire": 30}, {"expire": 30, "auto_renewal": True}],
    ids=["never-expires", "fixed", "auto-renewal"],
)
def test_an_id_takes_its_lock_again_once_the_key_vanished(
    conn: redis.StrictRedis, options: dict[str, Any]
) -> None:
    """The server lost the key (FLUSHALL, a restart): the lock is free, as the library's
    key is gone, and the id takes it again, by a new Lock object or the same one."""
    first = rl.Lock(conn, "vanished", id="first", **options)
    assert first.acquire()
    conn.flushall()
    assert first.locked() is False
    assert first.get_owner_id() is None
    again = rl.Lock(conn, "vanished", id="first", **options)
    assert again.acquire(blocking=False) is True
    assert first.get_owner_id() == "first"
    assert rl.Lock(conn, "vanished").acquire(blocking=False) is False
    with pytest.raises(rl.AlreadyAcquired):
        first.acquire(blocking=False)
    first.release()  # the same id
    assert not again.locked()
    assert first.acquire()
    conn.flushall()
    assert first.acquire(timeout=5) is True  # the same object
    first.release()


def test_a_vanished_hold_is_not_held(conn: redis.StrictRedis) -> None:
    """Once the key vanished and another id took the lock, the first id neither holds
    it nor releases it: its acquire fails as anyone's."""
    first = rl.Lock(conn, "vanished", id="first")
    assert first.acquire()
    conn.flushall()
    other = rl.Lock(conn, "vanished", id="other")
    assert other.acquire(blocking=False) is True
    assert rl.Lock(conn, "vanished", id="first").acquire(blocking=False) is False
    assert first.acquire(blocking=False) is False
    with pytest.raises(rl.NotAcquired):
        first.release()
    assert first.get_owner_id() == "other"
    other.release()


# -- the library's errors and return values -----------------------------------------------


def test_exceptions_are_the_librarys() -> None:
    names = [
        "AlreadyAcquired",
        "NotAcquired",
        "AlreadyStarted",
        "TimeoutNotUsable",
        "InvalidTimeout",
        "TimeoutTooLarge",
        "NotExpirable",
    ]
    for name in names:
        cls = getattr(rl, name)
        assert cls.__bases__ == (RuntimeError,), name


def test_constructor_checks_as_the_library_does() -> None:
    dummy = object()
    with pytest.raises(ValueError, match="must be instance of StrictRedis"):
        rl.Lock(dummy, "x")
    with pytest.raises(ValueError, match=r"^A negative expire is not acceptable\.$"):
        rl.Lock(dummy, "x", strict=False, expire="-1")
    with pytest.raises(ValueError, match=r"^Expire may not be None when auto_renewal is set$"):
        rl.Lock(dummy, "x", strict=False, auto_renewal=True)
    with pytest.raises(TypeError, match=r"^Incorrect type for `id`"):
        rl.Lock(dummy, "x", strict=False, id=1)  # type: ignore[arg-type]
    lock = rl.Lock(dummy, "x", strict=False)
    assert isinstance(lock.id, str) and len(lock.id) == 24  # 18 random bytes, base64
    assert rl.Lock(dummy, "x", strict=False, id=b"\xff").id == "/w=="
    with pytest.raises(ValueError):
        lock.extend(-1)
    with pytest.raises(TypeError, match=r"^To extend a lock 'expire' must be provided"):
        lock.extend()


def test_acquire_arguments(conn: redis.StrictRedis) -> None:
    lock = rl.Lock(conn, "args", expire=2)
    with pytest.raises(rl.TimeoutNotUsable, match=r"^Timeout cannot be used if blocking=False$"):
        lock.acquire(blocking=False, timeout=1)
    with pytest.raises(rl.InvalidTimeout, match=re.escape("Timeout (-1) cannot be less")):
        lock.acquire(timeout=-1)
    with pytest.raises(ValueError):
        lock.acquire(timeout="soon")
    with pytest.raises(rl.TimeoutTooLarge, match=re.escape("Timeout (3) cannot be greater")):
        lock.acquire(timeout="3")
    renewed = rl.Lock(conn, "args", expire=2, auto_renewal=True)
    assert renewed.acquire(timeout=3) is True  # renewed: any timeout
    renewed.release()
    for timeout in (0, "0", 1.9):  # whole seconds; 0: no limit
        assert lock.acquire(timeout=timeout) is True
        lock.release()


def test_extend(conn: redis.StrictRedis) -> None:
    lock = rl.Lock(conn, "ext", expire=1)
    with pytest.raises(rl.NotAcquired, match=re.escape("Lock lock:ext is not acquired")):
        lock.extend()
    assert lock.acquire()
    lock.extend(3)  # 3 s from now
    other = rl.Lock(conn, "ext")
    assert other.acquire(timeout=2) is False  # outlasts the first lease of 1 s
    lock.release()
    forever = rl.Lock(conn, "ext")
    with forever:
        with pytest.raises(rl.NotExpirable, match=r"^Lock lock:ext has no assigned expiration"):
            forever.extend(10)
        with pytest.raises(TypeError):
            forever.extend()
    with rl.Lock(conn, "ext", expire=1, auto_renewal=True) as renewed:
        renewed.extend()  # the watchdog renews it: only checked to be held
        renewed.extend(5)


def test_locked_and_get_owner_id(conn: redis.StrictRedis, url: str) -> None:
    lock = rl.Lock(conn, "owned", id="first")
    another = rl.Lock(conn, "owned", id="another")
    assert lock.locked() is False and another.locked() is False
    assert lock.get_owner_id() is None
    assert lock.acquire() is True
    assert lock.locked() is True and another.locked() is True
    assert lock.get_owner_id() == another.get_owner_id() == "first"
    lock.release()
    # A holder that is not a Lock of this process: its redreentrant owner id.
    with LockManager([url]) as mgr, mgr.lock("owned"):
        holder = another.get_owner_id()
        assert holder == mgr.owner_id()
        assert parse_owner(holder) is not None


def test_the_librarys_log_messages(
    conn: redis.StrictRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="redis_lock")
    with rl.Lock(conn, "logged"):
        assert rl.Lock(conn, "logged").acquire(blocking=False) is False
    records = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert [r for r in records if r[0].startswith("redis_lock")] == [
        ("redis_lock.acquire", "DEBUG", "Acquiring Lock('lock:logged') ..."),
        ("redis_lock.acquire", "INFO", "Acquired Lock('lock:logged')."),
        ("redis_lock.acquire", "DEBUG", "Acquiring Lock('lock:logged') ..."),
        ("redis_lock.acquire", "WARNING", "Failed to acquire Lock('lock:logged')."),
        ("redis_lock.release", "DEBUG", "Releasing Lock('lock:logged')."),
    ]


# -- leases ------------------------------------------------------------------------------


def test_a_fixed_lease_of_one_second(conn: redis.StrictRedis) -> None:
    first = rl.Lock(conn, "lease", expire=1)
    assert first.acquire()
    second = rl.Lock(conn, "lease")
    assert second.acquire(blocking=False) is False
    assert second.acquire(timeout=10) is True  # woken when the lease ends: not released
    with pytest.raises(rl.NotAcquired):
        first.release()
    with pytest.raises(rl.NotAcquired):
        first.extend()
    second.release()
    assert first.acquire(blocking=False) is True  # a new hold, not a re-entry
    first.release()


def test_never_expires_outlives_its_lock_objects(conn: redis.StrictRedis) -> None:
    """expire=None: the hold stays (renewed by the watchdog) once its Lock object is
    dropped, as the library's key stays; an id releases it from elsewhere."""
    assert rl.Lock(conn, "forever", id="job-7").acquire()
    gc.collect()
    assert rl.Lock(conn, "forever").acquire(blocking=False) is False
    rl.Lock(conn, "forever", id="job-7").release()
    assert not rl.Lock(conn, "forever").locked()


def test_auto_renewal_outlives_expire_and_ends_with_its_lock_object(
    conn: redis.StrictRedis,
) -> None:
    lock = rl.Lock(conn, "renewed", expire=1, auto_renewal=True)
    assert lock.acquire()
    other = rl.Lock(conn, "renewed")
    assert other.acquire(timeout=2) is False  # renewed past expire=1
    del lock
    gc.collect()
    assert other.acquire(timeout=10) is True  # released once its Lock object is collected
    other.release()


# -- reset ---------------------------------------------------------------------------------


def test_reset_wakes_a_waiter(conn: redis.StrictRedis, url: str) -> None:
    holder = rl.Lock(conn, "stuck")
    assert holder.acquire()
    waiter = rl.Lock(conn, "stuck")
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=10)))
    thread.start()
    wait_until(lambda: registered([url], "stuck") != [[]], "the waiter waiting")
    rl.Lock(conn, "stuck").reset()
    thread.join(10)
    assert got == [True]
    with pytest.raises(rl.NotAcquired):
        holder.release()
    waiter.release()
    assert holder.acquire(blocking=False) is True  # no stale hold left behind
    holder.release()


def test_reset_all_frees_the_plain_locks_of_that_server(
    conn: redis.StrictRedis, ensemble: LocalEnsemble
) -> None:
    names = ["a", "b", "c}x"]
    locks = [rl.Lock(conn, name) for name in names]
    for lock in locks:
        assert lock.acquire()
    with redis.StrictRedis.from_url(ensemble.urls[1]) as elsewhere_client:
        elsewhere = rl.Lock(elsewhere_client, "a")
        assert elsewhere.acquire()
        mgr = managers.sync_manager([conn])
        rw = mgr.rw_lock("rw")  # another kind: not the library's, left alone
        assert rw.write.acquire()
        rl.reset_all(conn)
        for lock, name in zip(locks, names, strict=True):
            assert not lock.locked()
            with pytest.raises(rl.NotAcquired):
                lock.release()
            fresh = rl.Lock(conn, name)
            assert fresh.acquire(blocking=False)
            fresh.release()
        assert elsewhere.locked()
        assert mgr.inspect("rw")[0].locks  # still held
        rw.write.release()
        elsewhere.release()
    rl.reset_all(conn)  # nothing to reset


# -- managers and keys ----------------------------------------------------------------------


@pytest.fixture
def own_server(redis_binary: str) -> Iterator[LocalServer]:
    """A server no manager knows yet."""
    with LocalServer(binary=redis_binary) as server:
        yield server


def test_adapters_share_one_manager(
    own_server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[LockManager] = []

    class Counted(LockManager):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(redreentrant, "LockManager", Counted)
    watchdogs = {t for t in threading.enumerate() if t.name == "redreentrant-watchdog"}
    clients = [redis.StrictRedis.from_url(own_server.url) for _ in range(2)]
    locks = [
        rl.Lock(clients[i % 2], f"job-{i}", expire=5, auto_renewal=i % 3 == 0) for i in range(6)
    ]
    try:
        for lock in locks:
            assert lock.acquire()
        assert len(made) == 1
        mgr = made[0]
        assert managers.sync_manager([clients[0]]) is mgr is managers.sync_manager([clients[1]])
        for i in range(6):
            [holder] = mgr.inspect(f"job-{i}")[0].locks[0].holders
            assert holder.startswith(mgr.id + ":")
        new = {t for t in threading.enumerate() if t.name == "redreentrant-watchdog"} - watchdogs
        assert len(new) == 1  # one watchdog for every lock: no thread per lock object
    finally:
        for lock in locks:
            lock.release()
        managers.sync_manager([clients[0]]).close()
        for client in clients:
            client.close()


def test_closing_a_client_given_leaves_the_manager_alone(url: str) -> None:
    """The shared manager has a client of its own: a program that closes its client
    (which disconnects the connections of its pool in use) does not deafen it."""

    def contend(client: redis.StrictRedis) -> None:
        holder = rl.Lock(client, "closed")
        assert holder.acquire()
        waiter = rl.Lock(client, "closed")
        got: list[bool] = []
        thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=20)))
        thread.start()
        wait_until(lambda: registered([url], "closed") != [[]], "the waiter waiting")
        holder.release()
        # Woken by the release, not at the end of the holder's lease (30 s).
        wait_until(lambda: got == [True], "the waiter woken", limit=5)
        thread.join(10)
        waiter.release()

    first = redis.StrictRedis.from_url(url)
    contend(first)
    first.close()
    with redis.StrictRedis.from_url(url) as conn:
        contend(conn)


def test_no_library_keys_and_none_left(conn: redis.StrictRedis, ensemble: LocalEnsemble) -> None:
    with rl.Lock(conn, "keys", expire=5), rl.Lock(conn, "other"):
        assert conn.keys("lock*") == []  # never the library's lock: and lock-signal: keys
        [(master, keys)] = lock_keys(ensemble).items()
        assert master == ensemble.urls[0]
        assert "redreentrant:v1:{keys}" in keys and "redreentrant:v1:{other}" in keys
    wait_until(lambda: lock_keys(ensemble) == {}, "every key gone")


# -- python-redis-lock's own tests --------------------------------------------------------

#: Their tests run four at a time (a server each), on one combination of decoded and
#: raw connections (the adapter's own tests above cover both), without the eventlet
#: variants (redis-py does not run under eventlet's monkey-patching: they fail with
#: python-redis-lock itself too) and without test_no_overlap, which passes or fails by
#: chance: 125 forked children each release and os._exit() at once, and a wake-up
#: deferred by a turn (5 ms: redreentrant._core.turns) dies with its process,
#: so waiters sleep until their registration ends (up to a lease).
SELECTION = "not True and not eventlet and not test_no_overlap"
_CONN = "decode_responses=False-decode_responses=False"
_RAW_TTL = (
    "reads the TTL of the library's raw key lock:foobar (-2: the adapter's key is redreentrant's)"
)
_RAW_SIGNAL = "reads the library's raw signal list lock-signal:<name> (no signal list here)"

EXPECTED_FAILURES: dict[str, str] = (
    {
        f"tests.test_redis_lock::{test}[{_CONN}]": why
        for test, why in {
            "test_upgrade": "writes the library's raw key (via the private lock._name)",
            "test_token": "reads the library's raw key (via the private lock._name)",
            "test_extend": _RAW_TTL,
            "test_extend_lock_default_expire": _RAW_TTL,
            "test_extend_another_instance": _RAW_TTL,
            "test_extend_another_instance_different_id_fail": _RAW_TTL,
            "test_release_from_nonblocking_leaving_garbage": _RAW_SIGNAL,
            "test_no_auto_renewal": "reads the private _lock_renewal_interval (no thread per lock)",
            "test_auto_renewal": (
                "reads the private _lock_renewal_thread/_stop/_interval (the watchdog renews)"
            ),
            "test_auto_renewal_stops_after_gc": "reads the private _name and _lock_renewal_thread",
        }.items()
    }
    | {
        f"tests.test_redis_lock::test_signal_expiration[{_CONN}-{method}-{ms}]": _RAW_SIGNAL
        for method in ("release", "reset_all")
        for ms in (1000, 1500)
    }
    | {
        f"tests.test_redis_lock::test_simple_auto_renewal[{effect}]": (
            "expects the log messages of the library's renewal thread (the watchdog renews here)"
        )
        for effect in ("normal", "gevent")
    }
)


@pytest.mark.timeout(600)
@pytest.mark.library_suite
def test_python_redis_lock_own_tests(redis_binary: str) -> None:
    pytest.importorskip("process_tests", reason="its tests need it: pip install process-tests")
    pytest.importorskip("gevent", reason="its tests need it: pip install gevent")
    pytest.importorskip("xdist", reason="they run four at a time: pip install pytest-xdist")
    source = library_source("python-redis-lock")
    outcomes = run_library_tests(
        source,
        ["tests/test_redis_lock.py"],
        SHIMS,
        "-p",
        "redis_lock_shim",
        "-p",
        "no:asyncio",
        "-n",
        "4",
        "-k",
        SELECTION,
        env={"REDIS_SERVER": redis_binary},
        timeout=600,
    )
    assert len(outcomes) == 48, sorted(outcomes)  # of 175
    failing = {test for test, outcome in outcomes.items() if outcome != "passed"}
    assert failing == set(EXPECTED_FAILURES), {
        "newly failing": sorted(failing - set(EXPECTED_FAILURES)),
        "now passing": sorted(set(EXPECTED_FAILURES) - failing),
    }
    assert {outcomes[test] for test in failing} == {"failed"}
