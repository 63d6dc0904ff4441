"""valkey-py clients as masters (sync and asyncio), beside redis-py's: the same locks,
the same keys, error replies and time-outs as valkey-py raises them.

valkey-py is optional for the library; the tests need it (the ``valkey`` extra, in
``dev``): under CI a missing package fails here rather than skipping.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from helpers import lock_keys

from redreentrant import LockManager
from redreentrant.asyncio import LockManager as AsyncLockManager
from redreentrant.testing import LocalEnsemble

valkey = pytest.importorskip("valkey")
valkey_asyncio = pytest.importorskip("valkey.asyncio")


def valkey_clients(ensemble: LocalEnsemble, timeout: float = 0.5) -> list[Any]:
    return [
        valkey.Valkey.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        for url in ensemble.urls
    ]


def connections(clients: list[Any]) -> list[int]:
    """How many connections each master has accepted so far."""
    return [int(c.info("stats")["total_connections_received"]) for c in clients]


@pytest.fixture
def clients(ensemble: LocalEnsemble) -> Iterator[list[Any]]:
    made = valkey_clients(ensemble)
    yield made
    for client in made:
        client.close()


def test_valkey_clients_are_masters(ensemble: LocalEnsemble, clients: list[Any]) -> None:
    with LockManager(clients, lease=5.0) as mgr, LockManager(ensemble.urls) as rival:
        assert list(mgr.masters) == [url.removeprefix("redis://") for url in ensemble.urls]
        lock = mgr.lock("vk")
        with lock, lock:
            assert lock.hold_count == 2 and lock.locked()
            assert len(lock_keys(ensemble)) == 5
            # A redis-py manager sees the same lock, held.
            assert not rival.lock("vk").acquire(blocking=False)
        assert not lock.locked()
        assert rival.lock("vk").acquire(blocking=False)
        rival.lock("vk").release()
    assert lock_keys(ensemble) == {}


def test_a_waiter_on_valkey_clients_is_woken_by_a_release(
    ensemble: LocalEnsemble, clients: list[Any]
) -> None:
    with LockManager(clients, lease=30.0) as mgr, LockManager(ensemble.urls) as holder:
        held = holder.lock("wake")
        held.acquire()
        got: list[float] = []

        def wait() -> None:
            started = time.monotonic()
            if mgr.lock("wake").acquire(timeout=10):
                got.append(time.monotonic() - started)
                mgr.lock("wake").release()

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)
        held.release()
        waiter.join(15)
        # Woken by the release (pub/sub on valkey-py), not by the 30 s lease running out.
        assert got and got[0] < 5
    assert lock_keys(ensemble) == {}


def test_mixed_clients_flushed_scripts_and_a_frozen_master(
    ensemble: LocalEnsemble, clients: list[Any]
) -> None:
    # Masters 0-2 through valkey-py, 3-4 through redis-py, in one manager.
    mixed = clients[:3] + [redis.Redis.from_url(url) for url in ensemble.urls[3:]]
    try:
        with LockManager(mixed, lease=10.0, master_timeout=0.3) as mgr:
            lock = mgr.lock("mixed")
            with lock:
                pass
            for client in clients:
                client.script_flush()  # NOSCRIPT: an error reply, then the scripts reload
            before = connections(clients)
            with lock:
                assert lock.is_owned()
            # An error reply is a reply: the connection it came on is kept.
            assert connections(clients) == before
            ensemble[1].pause()  # a read that times out (valkey-py's TimeoutError)
            with lock:
                assert lock.is_owned()
            ensemble[1].resume()
            before = connections(clients)
            with lock:
                assert lock.is_owned()
            # A late connection is caught up, not dropped and made anew.
            assert connections(clients) == before
    finally:
        for client in mixed[3:]:
            client.close()
    assert lock_keys(ensemble) == {}


def test_asyncio_valkey_clients_are_masters(ensemble: LocalEnsemble, clients: list[Any]) -> None:
    async def main() -> None:
        made = [valkey_asyncio.Valkey.from_url(url) for url in ensemble.urls]
        try:
            async with AsyncLockManager(made, lease=5.0, master_timeout=0.3) as mgr:
                lock = mgr.lock("vk-async")
                async with lock, lock:
                    assert lock.hold_count == 2
                    assert len(lock_keys(ensemble)) == 5
                for client in made:
                    await client.script_flush()
                before = connections(clients)
                async with lock:
                    assert lock.is_owned()
                assert connections(clients) == before  # the error replies kept theirs
                ensemble[2].pause()
                async with lock:
                    assert lock.is_owned()
                ensemble[2].resume()
        finally:
            for client in made:
                await client.aclose()

    asyncio.run(main())
    assert lock_keys(ensemble) == {}


def test_a_master_of_another_kind_is_refused(clients: list[Any]) -> None:
    with pytest.raises(TypeError, match="Redis or Valkey"):
        LockManager([clients[0], object()])  # type: ignore[list-item]
    # An asyncio manager takes asyncio clients only.
    with pytest.raises(TypeError, match="Redis or Valkey"):
        AsyncLockManager(clients[:1])  # type: ignore[arg-type]
