"""The loopback TCP proxy of redreentrant.testing.proxy, against a real redis-server."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from redreentrant.testing import LocalEnsemble
from redreentrant.testing.loopback import client
from redreentrant.testing.proxy import TcpProxy


@pytest.fixture
def proxy(ensemble: LocalEnsemble) -> Iterator[TcpProxy]:
    with TcpProxy(ensemble[0].port) as p:
        yield p


def test_pass_through_forwards_both_ways(ensemble: LocalEnsemble, proxy: TcpProxy) -> None:
    assert proxy.mode == "pass"
    assert proxy.port != ensemble[0].port
    assert proxy.url().startswith("redis://127.0.0.1:")
    via = client(proxy.port, timeout=5.0)
    direct = client(ensemble[0].port, timeout=5.0)
    try:
        big = "x" * 3_000_000  # more than the proxy's buffers: flow control at work
        assert via.set("proxy:big", big)
        assert direct.get("proxy:big") == big
        assert via.get("proxy:big") == big
        assert proxy.connections == 1
    finally:
        direct.delete("proxy:big")
        via.close()
        direct.close()


def test_delay_holds_replies_back(proxy: TcpProxy) -> None:
    with client(proxy.port, timeout=5.0) as via:
        assert via.ping()
        proxy.delay(0.1)
        started = time.monotonic()
        assert via.ping()
        assert time.monotonic() - started >= 0.1  # one delay each way: at least 0.2 s
        proxy.pass_through()
        assert via.ping()


def test_blackhole_makes_a_client_time_out(proxy: TcpProxy) -> None:
    with client(proxy.port, timeout=0.3) as via:
        assert via.ping()
        proxy.blackhole()
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            via.ping()
        assert time.monotonic() - started < 10.0
        # New connections are accepted, and as silent.
        fresh = client(proxy.port, timeout=0.3)
        try:
            with pytest.raises(redis.TimeoutError):
                fresh.ping()
        finally:
            fresh.close()
        proxy.pass_through()
        assert via.ping()  # redis-py dropped the timed-out connection: a new one works


def test_reset_breaks_the_connection(proxy: TcpProxy) -> None:
    with client(proxy.port, timeout=5.0) as via:
        assert via.ping()
        proxy.reset()
        assert proxy.connections == 0
        with pytest.raises(redis.ConnectionError):
            via.ping()  # the connection was reset, and so is the reconnect
        proxy.pass_through()
        assert via.ping()


def test_stop_closes_everything(ensemble: LocalEnsemble) -> None:
    proxy = TcpProxy(ensemble[0].port).start()
    with client(proxy.port, timeout=2.0) as via:
        assert via.ping()
        proxy.stop()
        proxy.stop()  # idempotent
        with pytest.raises(redis.ConnectionError):
            via.ping()
        with pytest.raises(RuntimeError):
            proxy.blackhole()
