"""Quorum members that are Sentinel-managed groups: a ``redis+sentinel://`` URL, or a
client of ``Sentinel.master_for`` (sync and asyncio), one vote like a plain master.

Against real groups (a master, two replicas, three sentinels on 127.0.0.1: see
redreentrant.testing.LocalSentinelGroup): locks through one group alone and beside two
plain masters, the member named in messages and ``inspect``, and a member that keeps
working after its master is killed, frozen or failed over (the connections ask the
sentinels for the new master). Mutual exclusion across a failover is not tested here: a
promoted replica may not have the lock's key yet, which is the business of the scripts'
quarantine. Without a server: the URL form, the comma-separated lists that hold one,
and the clients told apart."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio.sentinel
import redis.sentinel
from helpers import run, run_cli, wait_until

import redreentrant.asyncio as aio
from redreentrant import LockManager, QuorumUnavailableError
from redreentrant._core.keys import lock_key
from redreentrant._core.sentinel import demoted, parse_sentinel_url, split_masters
from redreentrant.checks import master_urls
from redreentrant.cli.common import masters as cli_masters
from redreentrant.compat.managers import master_key
from redreentrant.testing import LocalEnsemble, LocalSentinelGroup, LocalServer

#: how long a member may take to follow a failover (a generous bound): the failover
#: (2 to 4 s here), then the promoted replica's quarantine (the tests' lease, 3 s)
FOLLOW = 30.0


def _client(server: LocalServer) -> redis.Redis:
    return redis.Redis(port=server.port, socket_timeout=5)


def _holds(server: LocalServer, name: str) -> bool:
    with _client(server) as r:
        return bool(r.exists(lock_key(name)))


def _acquired(mgr: LockManager, prefix: str) -> str:
    """A fresh name acquired through ``mgr``, trying until one is (within FOLLOW)."""
    names = (f"{prefix}-{n}" for n in itertools.count())
    got: list[str] = []

    def attempt() -> bool:
        name = next(names)
        try:
            if mgr.lock(name).acquire(blocking=False):
                got.append(name)
        except QuorumUnavailableError:
            pass
        return bool(got)

    wait_until(attempt, f"acquired a lock through {mgr.masters}", FOLLOW)
    return got[0]


async def _acquired_async(mgr: aio.LockManager, prefix: str) -> str:
    """:func:`_acquired` for the asyncio manager."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FOLLOW
    for n in itertools.count():
        name = f"{prefix}-{n}"
        try:
            if await mgr.lock(name).acquire(blocking=False):
                return name
        except QuorumUnavailableError:
            pass
        if loop.time() > deadline:
            raise AssertionError(f"no lock acquired through {mgr.masters} within {FOLLOW}s")
        await asyncio.sleep(0.02)
    raise AssertionError("unreachable")


def _follows(mgr: LockManager, group: LocalSentinelGroup, old: LocalServer, prefix: str) -> None:
    """After the group's master ``old`` failed: an acquire through ``mgr`` succeeds
    within FOLLOW, and once the sentinels settled on a new master, acquires go there.
    (Not the first one's hold: on a slow machine a failover may be abandoned and another
    replica promoted, which wipes the first; mutual exclusion is not at stake here.)"""
    _acquired(mgr, prefix)
    new = group.wait_for_master(not_this=old)
    name = _acquired(mgr, f"{prefix}-settled")
    assert _holds(new, name)
    mgr.lock(name).release()


async def _follows_async(
    mgr: aio.LockManager, group: LocalSentinelGroup, old: LocalServer, prefix: str
) -> None:
    """:func:`_follows` for the asyncio manager."""
    await _acquired_async(mgr, prefix)
    new = await asyncio.to_thread(group.wait_for_master, old)
    name = await _acquired_async(mgr, f"{prefix}-settled")
    assert _holds(new, name)
    await mgr.lock(name).release()


# -- the URL form, without a server -------------------------------------------------------


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_database() -> None:
    url = parse_sentinel_url("redis+sentinel://s1:26380,s2,[fe80::1]:1/locks")
    assert url.sentinels == (("s1", 26380), ("s2", 26379), ("fe80::1", 1))
    assert (url.service, url.db, dict(url.options)) == ("locks", 0, {})

    url = parse_sentinel_url("redis+sentinel://app:p%40ss@localhost:5000/my.service-1/3/")
    assert url.sentinels == (("127.0.0.1", 5000),)
    assert (url.service, url.db) == ("my.service-1", 3)
    assert dict(url.options) == {"username": "app", "password": "p@ss"}
    assert parse_sentinel_url("redis+sentinel://:secret@h:1/s").options == {"password": "secret"}

    url = parse_sentinel_url(
        "rediss+sentinel://h:1,h:1/s/0?ssl_cert_reqs=none&ssl_check_hostname=no"
    )
    assert url.sentinels == (("h", 1),)  # given twice: once
    options = {"ssl": True, "ssl_cert_reqs": "none", "ssl_check_hostname": False}
    assert dict(url.options) == options
    assert url.tls == options  # the sentinels are reached with TLS too
    with pytest.raises(ValueError, match="malformed service name 'locks,c:3'"):
        parse_sentinel_url("redis+sentinel://h:1/locks,c:3")  # one URL, not a list


@pytest.mark.parametrize(
    "bad",
    [
        "redis+sentinel://h:1,h:2",  # no service
        "redis+sentinel://h:1,h:2/",
        "redis+sentinel://h:1?ssl_cert_reqs=none",
        "redis+sentinel:///locks",  # no sentinel
        "redis+sentinel://h:1,,h:2/locks",
        "redis+sentinel://h:0/locks",
        "redis+sentinel://h:99999/locks",
        "redis+sentinel://h:port/locks",
        "redis+sentinel://h:1/lo cks",
        "redis+sentinel://h:1/locks/db0",
        "redis+sentinel://h:1/locks/0/1",
        "redis+sentinel://h:1/locks?node=h:2",  # not an option of a sentinel URL
        "redis+sentinel//h:1/locks",
    ],
)
def test_a_malformed_sentinel_url_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(ValueError) as refused:
        master_urls(bad)
    assert repr(bad) in str(refused.value)


def test_a_list_of_masters_keeps_the_commas_of_a_sentinel_url() -> None:
    one = "redis+sentinel://a:1,b:2/locks"
    assert master_urls(f"{one},redis://c:3/0") == [one, "redis://c:3/0"]
    assert master_urls(f"c:3, {one}/2 ,d:4") == ["redis://c:3/0", f"{one}/2", "redis://d:4/0"]
    assert master_urls(f"{one},rediss+sentinel://e:5/other") == [
        one,
        "rediss+sentinel://e:5/other",
    ]
    # What follows a sentinel URL without a service is taken for more sentinels, but a
    # URL is not: either way the URL is refused.
    with pytest.raises(ValueError, match="names no service"):
        master_urls("redis+sentinel://a:1,b:2,redis://c:3/0")
    assert split_masters("redis+sentinel://a:1,b:2,c:3/s,d:4") == [
        "redis+sentinel://a:1,b:2,c:3/s",
        "d:4",
    ]
    # The command line's --masters, parsed by the same parser.
    parsed = cli_masters(argparse.Namespace(masters=f"{one},redis://c:3/0"))
    assert parsed == [one, "redis://c:3/0"]


def test_a_sentinel_member_is_named_and_told_apart() -> None:
    one = "redis+sentinel://127.0.0.1:2,127.0.0.1:1/locks"
    with LockManager(f"{one},redis://127.0.0.1:3/0") as mgr:  # nothing is connected yet
        assert mgr.masters == ("sentinel:locks@127.0.0.1:1", "127.0.0.1:3/0")
        assert mgr.quorum == 2
    # A list item holds one master: a sentinel URL, commas and all, but no more.
    with LockManager([one, "redis+sentinel://127.0.0.1:1/other/2"]) as mgr:
        assert mgr.masters == ("sentinel:locks@127.0.0.1:1", "sentinel:other@127.0.0.1:1")
    with pytest.raises(ValueError, match="holds a comma"):
        LockManager([f"{one},redis://127.0.0.1:3/0"])
    # One service of one sentinel is one master, whatever the database.
    with pytest.raises(ValueError, match="given twice"):
        LockManager([one, "redis+sentinel://127.0.0.1:1,127.0.0.1:2/locks/3"])
    with pytest.raises(ValueError, match="one Sentinel-managed master"):
        LockManager([one, "redis+sentinel://127.0.0.1:2,127.0.0.1:9/locks"])

    sentinel = redis.sentinel.Sentinel([("127.0.0.1", 2), ("127.0.0.1", 1)])
    with LockManager([sentinel.master_for("locks")]) as mgr:
        assert mgr.masters == ("sentinel:locks@127.0.0.1:1",)
    with pytest.raises(ValueError, match="given twice"):
        LockManager([sentinel.master_for("locks"), one])
    with pytest.raises(TypeError, match=r"master_for\(service_name\)"):
        LockManager([sentinel])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="slave_for"):
        LockManager([sentinel.slave_for("locks")])

    async def asyncio_flavour() -> None:
        a_sentinel = redis.asyncio.sentinel.Sentinel([("127.0.0.1", 1)])
        async with aio.LockManager([a_sentinel.master_for("locks"), one + "/1"]) as amgr:
            assert amgr.masters == ("sentinel:locks@127.0.0.1:1", "sentinel:locks@127.0.0.1:1")

    with pytest.raises(ValueError, match="given twice"):
        run(asyncio_flavour())


def test_the_adapters_tell_sentinel_managed_masters_apart() -> None:
    # The adapters share a manager per set of masters, known by the clients' settings:
    # clients of two services (whose pools name no host) are two masters.
    sentinel = redis.sentinel.Sentinel([("127.0.0.1", 2), ("127.0.0.1", 1)])
    again = redis.sentinel.Sentinel([("127.0.0.1", 1), ("127.0.0.1", 2)])
    a, b = sentinel.master_for("a"), sentinel.master_for("b")
    assert master_key(a) != master_key(b)
    assert master_key(a) == master_key(again.master_for("a"))
    assert master_key(a) != master_key(redis.Redis())


def test_a_script_refused_with_readonly_drops_a_sentinel_managed_connection() -> None:
    # Redis 6.2 reports a write refused inside a script as the script's error; redis-py's
    # Sentinel-managed connections drop themselves only for a READONLY reply of its own.
    refused = redis.ResponseError(
        "Error running script (call to f_0): @user_script:1: @user_script: 1:"
        " -READONLY You can't write against a read only replica."
    )
    sentinel = redis.sentinel.Sentinel([("127.0.0.1", 1)])
    managed = sentinel.master_for("locks").connection_pool.make_connection()
    assert demoted(managed, refused)
    assert demoted(managed, redis.ReadOnlyError("You can't write against a read only replica."))
    assert not demoted(managed, redis.ResponseError("NOSCRIPT No matching script."))
    assert not demoted(redis.Connection(), refused)  # a plain master: a failed call
    a_sentinel = redis.asyncio.sentinel.Sentinel([("127.0.0.1", 1)])
    assert demoted(a_sentinel.master_for("locks").connection_pool.make_connection(), refused)


# -- one group alone, and beside plain masters ------------------------------------------


def test_one_sentinel_member_acquires_releases_and_reenters(
    sentinel_group: LocalSentinelGroup,
) -> None:
    master = sentinel_group.master()
    with LockManager([sentinel_group.url], lease=30) as mgr:
        name = f"sentinel:locks@127.0.0.1:{min(s.port for s in sentinel_group.sentinels)}"
        assert mgr.masters == (name,)
        lock = mgr.lock("job")
        with lock, lock:
            assert _holds(master, "job")
            (view,) = mgr.inspect("job")
            assert view.master == name and view.error is None
            assert view.locks[0].holders == {mgr.owner_id(): 2}

            # A waiter is woken by the release (the lease would keep it out for 30 s).
            got: list[bool] = []

            def wait() -> None:
                got.append(lock.acquire(timeout=10))
                lock.release()

            waiter = threading.Thread(target=wait)
            waiter.start()
            wait_until(lambda: mgr.inspect("job")[0].locks[0].queue, "queued: the waiter")
        waiter.join()
        assert got == [True]
        assert not _holds(master, "job")


def test_a_sentinel_member_beside_two_plain_masters(sentinel_group: LocalSentinelGroup) -> None:
    with (
        LocalEnsemble(2) as plain,
        LockManager([sentinel_group.url, *plain.urls], lease=30) as mgr,
    ):
        assert mgr.quorum == 2
        with mgr.lock("shared"):
            assert _holds(sentinel_group.master(), "shared")
            assert all(_holds(server, "shared") for server in plain.servers)

        old = sentinel_group.kill_master()
        with mgr.lock("meanwhile"):  # the plain masters are a quorum meanwhile
            assert isinstance(mgr.ping()[0], Exception)
        sentinel_group.wait_for_master(not_this=old)
        wait_until(
            lambda: isinstance(mgr.ping()[0], float), "answering: the group's new master", FOLLOW
        )
        with mgr.lock("after"):
            pass


def test_the_command_line_takes_a_sentinel_url(sentinel_group: LocalSentinelGroup) -> None:
    with LocalEnsemble(1) as plain, LockManager([sentinel_group.url, *plain.urls]) as mgr:
        with mgr.lock("shown"):
            table = run_cli("inspect", "shown", masters=[sentinel_group.url, *plain.urls])
        assert table.returncode == 0, table.stderr
        assert f"{mgr.masters[0]} " in table.stdout
        assert table.stdout.count(f"{mgr.owner_id()} x1") == 2


# -- following failovers ----------------------------------------------------------------


def test_a_member_follows_its_killed_master(sentinel_group: LocalSentinelGroup) -> None:
    with LockManager([sentinel_group.url], lease=3) as mgr:
        with mgr.lock("before"):
            pass
        _follows(mgr, sentinel_group, sentinel_group.kill_master(), "after-kill")


def test_a_member_follows_a_failover_and_leaves_the_demoted_master(
    sentinel_group: LocalSentinelGroup,
) -> None:
    with LockManager([sentinel_group.url], lease=3) as mgr:
        with mgr.lock("before"):
            pass
        old = sentinel_group.failover()
        new = sentinel_group.wait_for_master(not_this=old)
        # The sentinels turn the old master into a replica some seconds later (and close
        # its clients' connections then); here it happens at once, and the manager's
        # connection to it stays open: its next call is refused with READONLY.
        with _client(old) as r:
            r.execute_command("REPLICAOF", "127.0.0.1", new.port)
        name = _acquired(mgr, "after-failover")
        assert _holds(new, name)
        mgr.lock(name).release()


def test_a_frozen_master_is_probed_through_the_sentinels(
    sentinel_group: LocalSentinelGroup,
) -> None:
    with LockManager([sentinel_group.url], lease=3) as mgr:
        with mgr.lock("before"):
            pass
        old = sentinel_group.master()
        old.pause()  # the member's calls time out: it is suspect, and probed
        try:
            _follows(mgr, sentinel_group, old, "after-freeze")
        finally:
            old.resume()


def test_a_client_of_sentinel_master_for_is_a_member(sentinel_group: LocalSentinelGroup) -> None:
    sentinel = redis.sentinel.Sentinel(sentinel_group.sentinel_addresses, socket_timeout=0.5)
    client = sentinel.master_for(sentinel_group.service, socket_timeout=0.5)
    try:
        with LockManager([client], lease=3) as mgr:
            assert mgr.masters[0].startswith("sentinel:locks@127.0.0.1:")
            with mgr.lock("passed"):
                assert _holds(sentinel_group.master(), "passed")
            _follows(mgr, sentinel_group, sentinel_group.kill_master(), "after-kill")
        assert client.ping() is True  # the manager does not close what it was given
    finally:
        client.close()
        for each in sentinel.sentinels:
            each.close()


def _async_test(body: Callable[[], Awaitable[None]]) -> None:
    run(asyncio.wait_for(body(), FOLLOW * 2))


def test_asyncio_a_member_by_url_follows_its_killed_master(
    sentinel_group: LocalSentinelGroup,
) -> None:
    async def body() -> None:
        async with aio.LockManager([sentinel_group.url], lease=3) as mgr:
            lock = mgr.lock("job")
            async with lock, lock:
                (view,) = await mgr.inspect("job")
                assert view.master == mgr.masters[0]
                assert view.locks[0].holders == {mgr.owner_id(): 2}
            await _follows_async(mgr, sentinel_group, sentinel_group.kill_master(), "after-kill")

    _async_test(body)


def test_asyncio_a_client_of_sentinel_master_for_follows_a_failover(
    sentinel_group: LocalSentinelGroup,
) -> None:
    async def body() -> None:
        sentinel = redis.asyncio.sentinel.Sentinel(
            sentinel_group.sentinel_addresses, socket_timeout=0.5
        )
        client: Any = sentinel.master_for(sentinel_group.service)
        try:
            async with aio.LockManager([client], lease=3) as mgr:
                assert mgr.masters[0].startswith("sentinel:locks@127.0.0.1:")
                async with mgr.lock("passed"):
                    assert _holds(sentinel_group.master(), "passed")
                old = await asyncio.to_thread(sentinel_group.failover)
                new = await asyncio.to_thread(sentinel_group.wait_for_master, old)
                with _client(old) as r:  # demoted at once, connections kept (see above)
                    r.execute_command("REPLICAOF", "127.0.0.1", new.port)
                name = await _acquired_async(mgr, "after-failover")
                assert _holds(new, name)
                await mgr.lock(name).release()
        finally:
            await client.aclose()
            for each in sentinel.sentinels:
                await each.aclose()

    _async_test(body)


# -- a promoted replica: quarantined, unless its grants reached the replicas ---------------


@pytest.mark.parametrize("durability", [None, "replicas:1"])
def test_a_promoted_replica_votes_only_after_the_quarantine_unless_grants_are_durable(
    sentinel_group: LocalSentinelGroup, durability: str | None
) -> None:
    """N = 1, one Sentinel group: after a failover the promoted replica may lack the
    latest grants. Without durability it does not vote for a lease (no lock meanwhile,
    and so no second holder); with ``durability="replicas:1"`` it had every grant, and
    votes at once."""
    lease = 2.0
    with LockManager([sentinel_group.url], lease=lease, durability=durability) as mgr:
        old = sentinel_group.failover()
        new = sentinel_group.wait_for_master(not_this=old)
        with _client(old) as r:
            r.execute_command("REPLICAOF", "127.0.0.1", new.port)  # demoted at once
        started = time.monotonic()
        name = _acquired(mgr, f"promoted-{durability}")
        waited = time.monotonic() - started
        assert _holds(new, name)
        mgr.lock(name).release()
        if durability is None:
            assert waited > lease * 0.9, f"the promoted replica voted after {waited:.2f}s"
            assert mgr.quarantined() == [0.0]
        else:
            assert waited < lease * 0.5, f"the durable member waited {waited:.2f}s"
