"""redreentrant.compat.redlock, redlock-py's ``Redlock``: what a program sees through it,
on real masters, and redlock-py's own tests run against it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import in_threads, library_source, lock_keys, registered, run_library_tests, wait_until

from redreentrant.compat import managers
from redreentrant.compat.redlock import (
    CannotObtainLock,
    Lock,
    MultipleRedlockException,
    Redlock,
)
from redreentrant.testing import LocalEnsemble

pytestmark = pytest.mark.integration

SHIMS = Path(__file__).with_name("compat_shims") / "redlock"

#: redlock-py's tests expected to fail against the adapter, and why
EXPECTED_FAILURES = {
    "tests.test_redlock.TestRedlock::test_py3_compatible_encoding": (
        "reads redlock-py's raw key (servers[0].get('pants')): the adapter keeps the lock"
        " under redreentrant:v1:{pants}"
    ),
}


def held(urls: list[str], name: str) -> bool:
    """Whether anyone holds ``name`` on a quorum of ``urls`` (redreentrant's view)."""
    return managers.sync_manager(urls).lock(name).locked()


# -- what a program sees -----------------------------------------------------------------


def test_lock_and_unlock(masters: list[str], ensemble: LocalEnsemble) -> None:
    rl = Redlock(masters)
    lock = rl.lock("pants", 1000)
    assert isinstance(lock, Lock)
    assert lock.resource == "pants"
    assert isinstance(lock.key, bytes)
    assert len(lock.key) == 22
    assert 0 < lock.validity <= 1000 - 12  # less the drift allowance: 2 ms + 1 %
    assert held(masters, "pants")
    assert set(lock_keys(ensemble)) == set(masters)  # on every master, under our keys
    assert rl.unlock(lock) is None
    assert not held(masters, "pants")
    assert lock_keys(ensemble) == {}


def test_not_reentrant(masters: list[str], ensemble: LocalEnsemble) -> None:
    rl = Redlock(masters, retry_count=2, retry_delay=0.05)
    lock = rl.lock("pants", 10_000)
    assert lock
    started = time.monotonic()
    assert rl.lock("pants", 10_000) is False
    assert time.monotonic() - started < 5  # bounded by retry_count * retry_delay
    assert rl.unlock(lock) is None
    again = rl.lock("pants", 10_000)
    assert again
    rl.unlock(again)
    assert lock_keys(ensemble) == {}


def test_waiter_woken_by_the_release(masters: list[str]) -> None:
    rl = Redlock(masters)
    lock = rl.lock("woken", 60_000)
    assert lock
    waiter = Redlock(masters, retry_count=1, retry_delay=60)  # may wait a minute
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(waiter.lock("woken", 60_000)))
    started = time.monotonic()
    thread.start()
    wait_until(lambda: all(registered(masters, "woken")), "the waiter registered")
    rl.unlock(lock)
    thread.join(30)
    assert isinstance(got[0], Lock)
    assert time.monotonic() - started < 30  # woken by the release, not at its bound
    waiter.unlock(got[0])


def test_ttl_must_be_an_int(masters: list[str]) -> None:
    rl = Redlock(masters)
    with pytest.raises(ValueError, match="is not an integer"):
        rl.lock("pants", 1000.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        rl.lock("pants", "1000")  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl", [-5, 0, 1, 3])
def test_ttl_too_short_is_never_granted(masters: list[str], ttl: int) -> None:
    rl = Redlock(masters, retry_count=1, retry_delay=0.01)
    assert rl.lock("pants", ttl) is False
    assert not held(masters, "pants")


def test_short_ttl(masters: list[str], ensemble: LocalEnsemble) -> None:
    rl = Redlock(masters, retry_count=3, retry_delay=0.01)
    lock = rl.lock("short", 10)
    assert lock
    assert 0 < lock.validity <= 8  # 10 ms less 2 ms of drift allowance
    wait_until(lambda: not held(masters, "short"), "the 10 ms lease ended")
    other = rl.lock("short", 10_000)  # free again, though never unlocked
    assert other
    assert rl.unlock(lock) is None  # expired: ignored, as redlock-py ignores it
    assert held(masters, "short")  # and the new holder keeps it
    rl.unlock(other)
    assert lock_keys(ensemble) == {}


def test_mutual_exclusion(masters: list[str]) -> None:
    rl = Redlock(masters)
    counter = [0]
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(10):
                while not (lock := rl.lock("counter", 10_000)):
                    pass
                value = counter[0]
                time.sleep(0.001)
                counter[0] = value + 1
                rl.unlock(lock)
        except BaseException as error:
            errors.append(error)

    in_threads(work, [()] * 4)
    assert errors == []
    assert counter[0] == 40


def test_unlock_through_another_redlock_of_the_masters(masters: list[str]) -> None:
    lock = Redlock(masters).lock("pants", 10_000)
    assert lock
    Redlock(list(masters)).unlock(lock)
    assert not held(masters, "pants")


def test_unlock_of_an_unknown_lock_is_ignored(masters: list[str]) -> None:
    rl = Redlock(masters)
    lock = rl.lock("pants", 10_000)
    assert lock
    rl.unlock(Lock(100, "pants", b"not-the-key"))
    assert held(masters, "pants")
    rl.unlock(lock)
    rl.unlock(lock)  # twice: ignored
    with pytest.raises(AttributeError):
        rl.unlock(False)  # type: ignore[arg-type]  # as redlock-py, which reads .resource


def test_connection_forms_share_the_keys(ensemble: LocalEnsemble) -> None:
    server = ensemble.servers[0]
    url = ensemble.urls[0]
    by_dict = Redlock([{"host": server.host, "port": server.port}], retry_delay=0.01)
    by_url = Redlock([url], retry_delay=0.01)
    by_client = Redlock([redis.Redis(host=server.host, port=server.port)], retry_delay=0.01)
    lock = by_dict.lock("pants", 10_000)
    assert lock
    assert by_url.lock("pants", 10_000) is False
    assert by_client.lock("pants", 10_000) is False
    by_dict.unlock(lock)
    assert isinstance(by_url.servers[0], redis.Redis)
    assert by_url.quorum == 1


def test_managers_are_shared(ensemble: LocalEnsemble) -> None:
    urls = ensemble.urls
    a, b = Redlock(urls), Redlock(list(urls))
    assert a._manager is b._manager is managers.sync_manager(urls)
    server = ensemble.servers[1]
    c = Redlock([{"host": server.host, "port": server.port}])
    d = Redlock([{"host": server.host, "port": server.port}])  # another client object
    assert c.servers[0] is not d.servers[0]
    assert c._manager is d._manager


def test_quorum(ensemble: LocalEnsemble) -> None:
    urls = ensemble.urls
    rl = Redlock(urls, retry_count=2, retry_delay=0.01)
    assert rl.quorum == 3
    ensemble.servers[3].stop()
    ensemble.servers[4].stop()
    lock = rl.lock("pants", 10_000)  # 3 of 5: granted, no exception
    assert lock
    ensemble.servers[2].stop()
    with pytest.raises(MultipleRedlockException) as raised:
        rl.unlock(lock)
    assert len(raised.value.errors) == 3
    assert rl.lock("other", 10_000) is False  # 2 of 5: no quorum


def test_errors() -> None:
    with pytest.raises(CannotObtainLock):
        Redlock([])
    with pytest.raises(Warning):
        Redlock([{"cat": "hog"}])
    error = MultipleRedlockException([Exception("connection error"), Exception("timed out")])
    assert str(error) == repr(error) == "connection error :: timed out"
    assert Redlock.default_retry_count == 3
    assert Redlock.default_retry_delay == 0.2
    assert Redlock.clock_drift_factor == 0.01


# -- redlock-py's own tests --------------------------------------------------------------


@pytest.mark.library_suite
def test_redlock_py_own_tests() -> None:
    source = library_source("redlock-py")
    outcomes = run_library_tests(source, ["tests/test_redlock.py"], SHIMS, "-p", "redlock_shim")
    assert len(outcomes) == 6, outcomes
    failed = {test for test, outcome in outcomes.items() if outcome != "passed"}
    assert failed == set(EXPECTED_FAILURES), outcomes
