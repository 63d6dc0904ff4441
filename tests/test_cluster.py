"""Quorum members that are Redis Clusters: real multi-node clusters started here (three
``--cluster-enabled yes`` nodes each on 127.0.0.1, slots split by the harness), mixed
with plain masters or on their own; locks on every node, mutual exclusion, a held
lock's slot resharded (MOVED, ASK), a node killed, wake-ups, the asyncio twin, and the
routing in the core without a server."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio.cluster
import redis.cluster
from helpers import aincrement, cross, heal, in_threads, increment, many_managers, wait_until

import redreentrant.asyncio as aio
from redreentrant import LockLostError, LockManager, QuorumUnavailableError
from redreentrant._core.cluster import (
    Backoff,
    ClusterMember,
    Endpoints,
    NodeCommands,
    NodeRound,
    parse_cluster_url,
    redirect_of,
    route,
)
from redreentrant._core.effects import Call, Fanout
from redreentrant._core.keys import PREFIX, aux_key, key_slot, lock_key
from redreentrant._core.scripts import RENEW
from redreentrant._core.settings import master_url, master_urls
from redreentrant.testing import LocalCluster, LocalEnsemble

LEASE = 3.0


# -- fixtures: three clusters of three nodes, shared by the module ------------------------


@pytest.fixture(scope="module")
def clusters() -> Iterator[list[LocalCluster]]:
    made = [LocalCluster(3) for _ in range(3)]
    try:
        for c in made:
            c.start()
        yield made
    finally:
        for c in made:
            c.stop()


@pytest.fixture
def cluster(clusters: list[LocalCluster]) -> Iterator[LocalCluster]:
    """The first cluster, whole, empty, and checked for leaked lock keys after the test."""
    c = clusters[0]
    heal(c)
    c.flushall()
    yield c
    heal(c)
    leaked = {k: v for k, v in c.keys(PREFIX + "{*").items() if v}
    c.flushall()
    if leaked:
        pytest.fail(f"lock keys left behind: {leaked}")


@pytest.fixture
def three(clusters: list[LocalCluster]) -> Iterator[list[LocalCluster]]:
    for c in clusters:
        heal(c)
        c.flushall()
    yield clusters
    for c in clusters:
        heal(c)
        c.flushall()


@pytest.fixture
def plain(ensemble: LocalEnsemble) -> list[str]:
    """Two plain masters to mix with a cluster member."""
    return ensemble.urls[:2]


def node_keys(c: LocalCluster) -> dict[int, list[str]]:
    return {k: v for k, v in c.keys(PREFIX + "{*").items() if v}


def member(mgr: Any, i: int) -> ClusterMember:
    m = mgr._transport.protocol.ends.members[i]
    assert isinstance(m, ClusterMember)
    return m


def node_pttl(c: LocalCluster, index: int, name: str) -> int:
    """The lock key's PTTL on one node (ASKING first: it may be importing the slot)."""
    with redis.Redis(host="127.0.0.1", port=c[index].port) as r:
        pipe = r.pipeline(transaction=False)
        pipe.execute_command("ASKING")
        pipe.pttl(lock_key(name))
        return int(pipe.execute()[1])


# -- mixed with plain masters ----------------------------------------------------------------


def test_a_cluster_member_is_one_vote_beside_plain_masters(
    cluster: LocalCluster, plain: list[str]
) -> None:
    names = [cluster.names_on(k, 1)[0] for k in range(3)]
    assert len({cluster.owner(cluster.slot_of(n)) for n in names}) == 3  # one per node
    with LockManager([cluster.url, *plain], lease=LEASE) as mgr:
        assert mgr.masters[0].startswith("cluster:127.0.0.1:") and mgr.quorum == 2
        locks = [mgr.lock(n) for n in names]
        for lock in locks:
            assert lock.acquire()
        # Each lock's keys went to the node that owns its slot.
        assert node_keys(cluster) == {k: [lock_key(n)] for k, n in enumerate(names)}
        for n in names:
            views = mgr.inspect(n)
            assert all(v.error is None and v.locks for v in views), views
        mgr._watchdog.tick()  # one renewal round: one call per slot on the cluster member
        assert all(node_pttl(cluster, k, n) > (LEASE - 0.5) * 1000 for k, n in enumerate(names))
        with LockManager([cluster.url, *plain], lease=LEASE) as other:
            assert not other.lock(names[1]).acquire(blocking=False)
            assert other.force_unlock(names[2])  # through the member too
        for lock in locks[:2]:
            lock.release()
        with pytest.raises(LockLostError):
            locks[2].release()
    assert not node_keys(cluster)


def test_a_semaphore_works_through_a_cluster_member(
    cluster: LocalCluster, plain: list[str]
) -> None:
    with LockManager([cluster.url, *plain], lease=LEASE) as mgr:
        sems = [mgr.semaphore("pool", permits=2) for _ in range(3)]
        done = threading.Event()
        got: list[bool] = []

        def hold(sem: Any) -> None:
            got.append(sem.acquire(blocking=False))
            if got[-1]:
                done.wait(10)
                sem.release()

        holders = [threading.Thread(target=hold, args=(s,)) for s in sems[:2]]
        for n, t in enumerate(holders, 1):  # one after the other: every member agrees
            t.start()
            wait_until(lambda n=n: len(got) == n, "tried")
        assert got == [True, True]
        # All of a semaphore's keys share its name's hash tag: one node holds them.
        assert len(node_keys(cluster)) == 1
        mgr._watchdog.tick()  # renewed through the member
        assert sems[2].available() == 0 and not sems[2].acquire(blocking=False)
        assert len(sems[2].holders()) == 2
        done.set()
        for t in holders:
            t.join()
        assert sems[2].available() == 2
    assert not node_keys(cluster)


def test_an_election_works_through_cluster_members(three: list[LocalCluster]) -> None:
    urls = [c.url for c in three]
    with LockManager(urls, lease=LEASE) as a, LockManager(urls, lease=LEASE) as b:
        observer = b.election("cluster-leader").observe()
        assert next(observer) is None
        terms = []
        for mgr, value in ((a, b"a"), (b, b"b")):
            with mgr.election("cluster-leader").campaign(value=value) as e:
                terms.append(e.term)
                mgr._watchdog.tick()  # the lock and its record, renewed through the members
                seen = b.election("cluster-leader").leader()
                assert seen is not None and (seen.value, seen.term) == (value, e.term)
        changes = [next(observer) for _ in range(4)]
        observer.close()
        assert [c and c.value for c in changes] == [b"a", None, b"b", None]
        assert terms[0] < terms[1]
    for cl in three:  # the terms' counters stay, as fencing counters do
        assert all(k.endswith(":election:fence") for keys in node_keys(cl).values() for k in keys)


def test_asyncio_election_through_cluster_members(three: list[LocalCluster]) -> None:
    urls = [c.url for c in three]

    async def main() -> tuple[int, int]:
        async with aio.LockManager(urls, lease=LEASE) as a, aio.LockManager(urls) as b:
            async with a.election("aio-leader").campaign(value=b"a") as e:
                first = e.term
                assert not await b.election("aio-leader").acquire(blocking=False)
            second = await b.election("aio-leader").campaign(value=b"b")
            term = second.term
            await second.resign()
            return first, term

    first, second = asyncio.run(main())
    assert first < second


def test_a_multi_lock_takes_names_on_several_nodes_together(
    cluster: LocalCluster, plain: list[str], ensemble: LocalEnsemble
) -> None:
    names = [cluster.names_on(k, 1)[0] for k in range(3)]  # one name per node

    def locks() -> dict[int, list[str]]:  # the lock keys (the fencing counters stay)
        held = {
            k: [x for x in v if not x.endswith(":fence")] for k, v in node_keys(cluster).items()
        }
        return {k: v for k, v in held.items() if v}

    with LockManager([cluster.url, *plain], lease=LEASE) as mgr:
        many = mgr.multi_lock(names, fencing=True)
        with many:
            assert locks() == {k: [lock_key(n)] for k, n in enumerate(names)}
            assert set(many.tokens) == set(names)
            mgr._watchdog.tick()  # renewed on every node
            assert all(node_pttl(cluster, k, n) > (LEASE - 0.5) * 1000 for k, n in enumerate(names))
            with LockManager([cluster.url, *plain], lease=LEASE) as other:
                assert not other.lock(names[1]).acquire(blocking=False)
        assert not locks()
        # One name held elsewhere: the multi-lock takes none of them, on any node.
        with LockManager([cluster.url, *plain], lease=LEASE) as other, other.lock(names[2]):
            assert not many.acquire(blocking=False)
            assert locks() == {2: [lock_key(names[2])]}
    cluster.flushall()  # the fencing counters outlive their locks on purpose
    ensemble.flushall()


def test_multi_locks_in_crossing_orders_never_deadlock_on_cluster_members(
    three: list[LocalCluster],
) -> None:
    # Half the threads take [x, y, z], half [z, y, x], with one name on each node of
    # every member (a call per slot): no deadlock, and no two holders ever overlap.
    urls = [c.url for c in three]
    x, y, z = (three[0].names_on(k, 1, "cross")[0] for k in range(3))  # one per node
    orders = [[x, y, z], [z, y, x]] * 3
    rounds = 10
    with many_managers(len(orders), urls, lease=LEASE) as managers:
        counters = cross(managers, orders, rounds, pause=0.001)
    assert counters == dict.fromkeys((x, y, z), len(orders) * rounds)
    for c in three:
        assert not node_keys(c)


def test_fencing_tokens_grow_through_cluster_members(three: list[LocalCluster]) -> None:
    with LockManager([c.url for c in three], lease=LEASE, fencing=True) as mgr:
        tokens = []
        for _ in range(3):
            with mgr.lock("fenced") as lock:
                tokens.append(lock.token)
        assert tokens == sorted(tokens) and len(set(tokens)) == 3, tokens


def test_threads_exclude_each_other_on_three_cluster_members(three: list[LocalCluster]) -> None:
    urls = [c.url for c in three]
    counter = {"value": 0}
    names = [three[0].names_on(k, 1, "count")[0] for k in range(3)]
    per_thread = 15

    def work(mgr: LockManager, name: str) -> None:
        lock = mgr.lock(name)
        for _ in range(per_thread):
            with lock:
                increment(
                    counter, "value", 0.0005
                )  # read, sleep, write: any overlap loses an update

    with LockManager(urls, lease=LEASE) as a, LockManager(urls, lease=LEASE) as b:
        for name in names:
            counter["value"] = 0
            in_threads(work, [(m, name) for m in (a, b, a, b)])
            assert counter["value"] == 4 * per_thread
    for c in three:
        assert not node_keys(c)


# -- resharding --------------------------------------------------------------------------------


def test_renewals_follow_a_held_locks_slot_to_its_new_node(
    cluster: LocalCluster, plain: list[str]
) -> None:
    name = cluster.names_on(0, 1, "moving")[0]
    slot = cluster.slot_of(name)
    with LockManager([cluster.url, *plain], lease=LEASE) as mgr:
        lock = mgr.lock(name)
        assert lock.acquire()
        assert member(mgr, 0).owner(slot) == cluster.addresses[0]
        cluster.migrate_slot(slot, 2)
        assert node_keys(cluster) == {2: [lock_key(name)]}
        time.sleep(0.3)
        mgr._watchdog.tick()  # MOVED: the renewal goes to node 2, which knows the slot now
        assert member(mgr, 0).owner(slot) == cluster.addresses[2]
        assert node_pttl(cluster, 2, name) > (LEASE - 0.2) * 1000
        with LockManager([cluster.url, *plain], lease=LEASE) as other:
            assert not other.lock(name).acquire(blocking=False)  # no second holder
            assert all(v.error is None and v.locks for v in other.inspect(name))
        lock.release()
    assert not node_keys(cluster)
    cluster.migrate_slot(slot, 0)  # as it was, for the other tests


def test_renewals_ask_the_importing_node_during_a_migration(
    cluster: LocalCluster, plain: list[str]
) -> None:
    name = cluster.names_on(1, 1, "asking")[0]
    slot = cluster.slot_of(name)
    with LockManager([cluster.url, *plain], lease=LEASE) as mgr:
        lock = mgr.lock(name)
        assert lock.acquire()
        source = cluster.begin_migration(slot, 0)
        try:
            assert source == 1
            assert cluster.move_keys(slot, 1, 0) == 1
            time.sleep(0.3)
            mgr._watchdog.tick()  # ASK: node 1 no longer has the key; node 0 imports it
            assert node_pttl(cluster, 0, name) > (LEASE - 0.2) * 1000
            # ASK leaves the map as it is: the slot is still node 1's until it moves.
            assert member(mgr, 0).owner(slot) == cluster.addresses[1]
        finally:
            cluster.finish_migration(slot, 0)
        mgr._watchdog.tick()  # now MOVED
        assert member(mgr, 0).owner(slot) == cluster.addresses[0]
        lock.release()
    assert not node_keys(cluster)
    cluster.migrate_slot(slot, 1)


# -- a node killed ----------------------------------------------------------------------------


def test_a_killed_node_fails_its_slots_on_that_member_only(
    cluster: LocalCluster, plain: list[str]
) -> None:
    dead, alive = cluster.names_on(2, 1, "dead")[0], cluster.names_on(0, 1, "alive")[0]
    with LockManager([cluster.url, *plain], lease=LEASE) as mgr:
        assert mgr.lock(alive).acquire()  # the member knows its map and nodes now
        cluster[2].kill()
        lock = mgr.lock(dead)
        assert lock.acquire()  # the plain masters are a quorum
        views = mgr.inspect(dead)
        assert views[0].error is not None and all(v.error is None for v in views[1:])
        assert mgr.inspect(alive)[0].locks  # node 0 still serves the member
        lock.release()
        mgr.lock(alive).release()
    with LockManager([cluster.url, plain[0]], lease=LEASE) as two:
        with pytest.raises(QuorumUnavailableError) as caught:
            two.lock(dead).acquire(blocking=False)
        assert any(m.startswith("cluster:") for m in caught.value.errors)


def test_three_cluster_members_keep_a_quorum_with_one_node_down(three: list[LocalCluster]) -> None:
    name = three[1].names_on(1, 1, "down")[0]
    with LockManager([c.url for c in three], lease=LEASE) as mgr:
        three[1][three[1].owner(three[1].slot_of(name))].kill()
        lock = mgr.lock(name)
        with lock:
            views = mgr.inspect(name)
            assert [v.error is None for v in views] == [True, False, True]
            time.sleep(0.2)
            mgr._watchdog.tick()
            assert lock.is_owned() and lock.remaining() > LEASE - 0.5
    for c in (three[0], three[2]):
        assert not node_keys(c)


# -- wake-ups ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lock", "fair", "write"])
def test_wakeups_reach_a_waiter_through_cluster_members(
    three: list[LocalCluster], kind: str
) -> None:
    urls = [c.url for c in three]
    lease = 30.0  # only a wake-up, not an expiry, hands the lock over in time

    def make(mgr: LockManager, name: str) -> Any:
        if kind == "fair":
            return mgr.fair_lock(name)
        if kind == "write":
            return mgr.rw_lock(name).write
        return mgr.lock(name)

    with LockManager(urls, lease=lease) as a, LockManager(urls, lease=lease) as b:
        for k in range(3):  # a lock on each node: most are heard through another node
            name = three[0].names_on(k, 1, f"wake-{kind}")[0]
            held = make(a, name)
            assert held.acquire()
            got: list[float] = []

            def waiter(name: str = name, got: list[float] = got) -> None:
                lock = make(b, name)
                if lock.acquire(timeout=10):
                    got.append(time.monotonic())
                    lock.release()

            t = threading.Thread(target=waiter)
            t.start()
            time.sleep(0.3)  # the waiter is blocked by now
            released = time.monotonic()
            held.release()
            t.join(timeout=15)
            assert got and got[0] - released < 2.0, (kind, name)
    for c in three:
        assert not node_keys(c)


def test_the_wakeup_subscriber_moves_to_another_node_when_its_node_dies(
    cluster: LocalCluster,
) -> None:
    lease = 30.0  # only a wake-up, not an expiry, hands the lock over in time
    with LockManager([cluster.url], lease=lease) as a, LockManager([cluster.url], lease=lease) as b:
        with a.lock("warm-up"):
            assert not b.lock("warm-up").acquire(timeout=0.2)  # b's subscriber starts
        hub = b._hub
        wait_until(lambda: hub._pubsubs[0] is not None, "connected: the subscriber")
        port = hub._pubsubs[0].connection.port
        dead = next(k for k, s in enumerate(cluster.servers) if s.port == port)
        name = cluster.names_on((dead + 1) % 3, 1, "moving-hub")[0]
        cluster[dead].kill()
        wait_until(
            lambda: (
                hub._pubsubs[0] is not None
                and hub._pubsubs[0].connection.port != port
                and 0 in hub._subs.home_confirmed
            ),
            "subscribed again on another node",
        )
        held = a.lock(name)
        assert held.acquire()
        got: list[float] = []

        def waiter() -> None:
            lock = b.lock(name)
            if lock.acquire(timeout=15):
                got.append(time.monotonic())
                lock.release()

        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.3)
        released = time.monotonic()
        held.release()
        t.join(timeout=20)
        assert got and got[0] - released < 2.0


def test_the_command_line_takes_a_cluster_url(
    cluster: LocalCluster, plain: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from redreentrant.cli.app import main

    name = cluster.names_on(1, 1, "cli")[0]
    masters = ",".join([cluster.url, *plain])
    logger = logging.getLogger("redreentrant")  # the command sets up its logging
    handlers, propagate = list(logger.handlers), logger.propagate
    try:
        with LockManager([cluster.url, *plain], lease=LEASE) as mgr, mgr.lock(name):
            assert main(["inspect", "--masters", masters, "--json", name]) == 0
    finally:
        logger.handlers[:] = handlers
        logger.propagate = propagate
    document = json.loads(capsys.readouterr().out)
    assert document["state"] == "held"
    assert document["masters"][0]["master"].startswith("cluster:127.0.0.1:")
    assert document["masters"][0]["locks"]


def test_names_and_top_scan_every_node_of_a_cluster_member(cluster: LocalCluster) -> None:
    from redreentrant.cli.top import Watcher

    names = [cluster.names_on(k, 1, "top")[0] for k in range(3)]
    urls = [cluster.url]  # what top sees comes from the cluster's nodes alone
    with LockManager(urls, lease=LEASE) as mgr, LockManager(urls, lease=LEASE) as other:
        locks = [mgr.lock(n) for n in names]
        for lock in locks:
            assert lock.acquire()

        def wait_then_release() -> None:
            lock = other.lock(names[1])
            if lock.acquire(timeout=5):
                lock.release()

        # A new manager (its slot map not read yet) lists them all, each on its node.
        with LockManager(urls) as fresh:
            assert fresh.names("top-*") == {n: ("lock",) for n in sorted(names)}
            assert [isinstance(a, float) for a in fresh.ping()] == [True]

        async def listed() -> tuple[dict[str, tuple[str, ...]], list[Any]]:
            async with aio.LockManager(urls) as amgr:
                return await amgr.names("top-*"), await amgr.ping()

        found, answers = asyncio.run(listed())
        assert found == {n: ("lock",) for n in sorted(names)}
        assert [isinstance(a, float) for a in answers] == [True]
        waiting = threading.Thread(target=wait_then_release)
        waiting.start()
        try:
            with Watcher(urls, "top-*", 50) as watcher:
                # the waiter registered on the node owning names[1]'s slot is seen
                wait_until(
                    lambda: any(r.waiters for r in watcher.snapshot().locks), "seen: the waiter", 5
                )
                snap = watcher.snapshot()
            assert [m.up for m in snap.masters] == [True]
            assert snap.masters[0].master.startswith("cluster:127.0.0.1:")
            assert sorted(row.name for row in snap.locks) == sorted(names)
            assert all(row.state == "held" for row in snap.locks)
        finally:
            for lock in locks:
                lock.release()
            waiting.join(timeout=10)


# -- clients, URLs and the asyncio twin --------------------------------------------------------


def test_cluster_clients_are_members(cluster: LocalCluster, plain: list[str]) -> None:
    host, port = cluster.addresses[1]
    with redis.cluster.RedisCluster(host=host, port=port) as client:
        with LockManager([plain[0], client, plain[1]], lease=LEASE) as mgr:
            assert mgr.masters[1].startswith("cluster:127.0.0.1:")
            for k in range(3):
                with mgr.lock(cluster.names_on(k, 1, "client")[0]) as lock:
                    assert mgr.inspect(lock.name)[1].locks
        with pytest.raises(ValueError, match="given twice"):
            LockManager([cluster.url, client, plain[0]])


def test_valkey_cluster_clients_are_members(cluster: LocalCluster, plain: list[str]) -> None:
    valkey_cluster = pytest.importorskip("valkey.cluster")
    host, port = cluster.addresses[2]
    with valkey_cluster.ValkeyCluster(host=host, port=port) as vclient:
        name = cluster.names_on(2, 1, "valkey")[0]
        with LockManager([vclient, *plain], lease=LEASE) as mgr, mgr.lock(name) as lock:
            assert mgr.inspect(lock.name)[0].locks


def test_asyncio_twin_on_cluster_members(three: list[LocalCluster], plain: list[str]) -> None:
    c = three[0]
    host, port = c.addresses[0]

    async def main() -> None:
        client = redis.asyncio.cluster.RedisCluster(host=host, port=port)
        counter = {"value": 0}
        try:
            async with (
                aio.LockManager([client, three[1].url, plain[0]], lease=LEASE) as a,
                aio.LockManager([three[0].url, three[1].url, plain[0]], lease=LEASE) as b,
            ):
                names = [c.names_on(k, 1, "aio")[0] for k in range(3)]

                async def work(mgr: aio.LockManager, name: str) -> None:
                    for _ in range(10):
                        async with mgr.lock(name):
                            await aincrement(counter, "value")

                for name in names:
                    counter["value"] = 0
                    await asyncio.gather(*(work(m, name) for m in (a, b, a, b)))
                    assert counter["value"] == 40
                # hand-off through the members, and renewals after a resharding
                name = names[0]
                slot = c.slot_of(name)
                lock = a.lock(name)
                assert await lock.acquire()
                got: list[float] = []

                async def waiter() -> None:
                    other = b.lock(name)
                    assert await other.acquire(timeout=10)
                    got.append(time.monotonic())
                    await asyncio.to_thread(c.migrate_slot, slot, 1)
                    await b._watchdog.tick()
                    assert member(b, 0).owner(slot) == c.addresses[1]
                    assert other.is_owned() and other.remaining() > LEASE - 0.5
                    await other.release()

                task = asyncio.ensure_future(waiter())
                await asyncio.sleep(0.3)
                started = time.monotonic()
                await lock.release()
                await asyncio.wait_for(task, 15)
                assert got and got[0] - started < 2.0
                await asyncio.to_thread(c.migrate_slot, slot, 0)
        finally:
            await client.aclose()

    asyncio.run(main())
    for cl in three:
        assert not node_keys(cl)


def test_an_upgradeable_reader_upgrades_through_cluster_members(three: list[LocalCluster]) -> None:
    urls = [c.url for c in three]
    lease = 60.0  # only a wake-up, not a lease's end or a retry (lease / 3), ends the wait
    name = three[0].names_on(1, 1, "upgrade")[0]  # on a node other than the first
    with LockManager(urls, lease=lease) as a, LockManager(urls, lease=lease) as b:
        rw = a.rw_lock(name)
        assert rw.upgradeable.acquire()
        reading, released = threading.Event(), []
        channel = aux_key(name, "rw:wake:u")

        def heard(c: LocalCluster) -> bool:
            """Whether a node of ``c`` has a subscriber on the upgrade's channel."""
            for host, port in c.addresses:
                with redis.Redis(host=host, port=port) as r:
                    if int(r.pubsub_numsub(channel)[0][1]) > 0:
                        return True
            return False

        def reader() -> None:
            with b.rw_lock(name).read:
                reading.set()
                wait_until(lambda: all(v.locks and v.locks[0].queue for v in b.inspect(name)), "up")
                wait_until(lambda: all(map(heard, three)), "the upgrade waiting for a wake-up")
                released.append(time.monotonic())

        t = threading.Thread(target=reader)
        t.start()
        assert reading.wait(10)
        assert rw.upgradeable.upgrade(timeout=lease)
        assert released and time.monotonic() - released[0] < 5.0
        t.join(timeout=10)
        # (A round ends once a quorum answered: a member may not have seen it yet.)
        assert sum(v.locks[0].mode == "write" for v in a.inspect(name) if v.locks) >= 2
        rw.upgradeable.downgrade()
        assert sum(v.locks[0].mode == "read" for v in a.inspect(name) if v.locks) >= 2
        rw.upgradeable.release()
        assert sum(not v.locks for v in a.inspect(name)) >= 2


def test_asyncio_synchronizers_on_cluster_members(three: list[LocalCluster]) -> None:
    urls = [c.url for c in three]
    names = [three[0].names_on(k, 1, "sync")[0] for k in range(3)]  # one per node

    async def main() -> None:
        async with aio.LockManager(urls, lease=LEASE) as a, aio.LockManager(urls) as b:
            # A semaphore of 2: two tasks hold, a third is refused, then gets one.
            held = asyncio.Event()

            async def hold() -> bool:
                async with a.semaphore("aio-pool", permits=2):
                    await held.wait()
                return True

            holders = [asyncio.create_task(hold()) for _ in range(2)]
            third = b.semaphore("aio-pool", permits=2)
            while await third.available():
                await asyncio.sleep(0.01)
            assert not await third.acquire(blocking=False)
            held.set()
            assert await asyncio.gather(*holders) == [True, True]
            assert await third.acquire(timeout=5)
            await third.release()
            # A multi-lock over names on every node: all of them, or none.
            async with a.multi_lock(names):
                assert not await b.lock(names[2]).acquire(blocking=False)
            async with b.lock(names[1]):
                assert not await a.multi_lock(names).acquire(blocking=False)
                assert await b.lock(names[0]).acquire(blocking=False)  # left free
                await b.lock(names[0]).release()
            # The upgradeable reader upgrades once the other reader is gone.
            rw = a.rw_lock("aio-config")
            reading, leave = asyncio.Event(), asyncio.Event()

            async def read() -> None:
                async with b.rw_lock("aio-config").read:
                    reading.set()
                    await leave.wait()

            async def leave_soon() -> None:
                await asyncio.sleep(0.2)
                leave.set()

            async with rw.upgradeable:
                reader = asyncio.create_task(read())
                await reading.wait()
                leaving = asyncio.create_task(leave_soon())
                assert await rw.upgradeable.upgrade(timeout=10)
                assert leave.is_set()  # not before the reader was gone
                await asyncio.gather(reader, leaving)
                assert not await b.rw_lock("aio-config").read.acquire(blocking=False)
                await rw.upgradeable.downgrade()

    asyncio.run(main())
    for cl in three:
        assert not node_keys(cl)


# -- the URL form and the routing, without a server ------------------------------------------


def test_cluster_urls_are_parsed_and_checked() -> None:
    url = "rediss+cluster://user:p%40ss@10.0.0.1:7000/0?node=10.0.0.2:7001&ssl_cert_reqs=none"
    seeds, options = parse_cluster_url(url)
    assert seeds == (("10.0.0.1", 7000), ("10.0.0.2", 7001))
    assert options == {"username": "user", "password": "p@ss", "ssl": True, "ssl_cert_reqs": "none"}
    assert master_url("redis+cluster://localhost:7000") == "redis+cluster://localhost:7000"
    assert master_urls("h:1, redis+cluster://h:7000") == ["redis://h:1/0", "redis+cluster://h:7000"]
    for bad in (
        "redis+cluster://h:7000/3",
        "redis+cluster://h:7000?db=1",
        "redis+cluster://h:7000?node=nope",
        "redis+cluster:///x",
    ):
        with pytest.raises(ValueError):
            master_url(bad)


def test_redirects_are_read_from_replies() -> None:
    from redis.exceptions import AskError, MovedError, ResponseError

    assert redirect_of(MovedError("3999 127.0.0.1:7002"), ("h", 1)) is not None
    moved = redirect_of(MovedError("3999 :7002"), ("10.0.0.5", 7000))
    assert moved is not None and not moved.ask and moved.node == ("10.0.0.5", 7002)
    ask = redirect_of(AskError("12 127.0.0.1:7001"), ("h", 1))
    assert ask is not None and ask.ask and ask.slot == 12
    assert redirect_of(ResponseError("MOVED 5 localhost:7009"), ("h", 1)) is not None
    assert redirect_of(ResponseError("WRONGTYPE"), ("h", 1)) is None
    assert redirect_of(ConnectionError("MOVED 1 h:2"), ("h", 1)) is None


def test_route_follows_moved_and_ask_and_keeps_votes_per_member() -> None:
    from redis.exceptions import AskError, MovedError

    a, b = ("127.0.0.1", 7000), ("127.0.0.1", 7001)
    m = ClusterMember([a], {})
    ends = Endpoints([m, object()], refresh_interval=1.0)
    key = lock_key("x")
    call = Call(RENEW, (key,), (1000, "owner"))
    fan = Fanout(((call,), (call,)))
    steps = route(fan, ends, time.monotonic, 0.25)
    effect = steps.send(None)
    assert isinstance(effect, NodeCommands) and effect.commands == (("CLUSTER", "SLOTS"),)
    effect = steps.send([[[0, 16383, [b"127.0.0.1", 7000, b"id"]]]])
    end_a = ends.of(0, a)
    assert isinstance(effect, NodeRound) and effect.voters == {1, end_a}
    assert effect.calls[1] == (call,) and effect.calls[end_a] == (call,)
    replies: list[list[object]] = [[] for _ in effect.calls]
    replies[1] = [[1]]
    slot = key_slot(key)
    replies[end_a] = [MovedError(f"{slot} 127.0.0.1:7001")]
    effect = steps.send(replies)  # read in full: a NOSCRIPT there is redone in the round
    assert isinstance(effect, NodeRound) and effect.early is None
    end_b = ends.of(0, b)
    assert effect.calls[end_b] == (call,) and m.owner(slot) == b
    replies = [[] for _ in effect.calls]
    replies[end_b] = [AskError(f"{slot} 127.0.0.1:7000")]
    effect = steps.send(replies)
    assert isinstance(effect, NodeCommands) and effect.endpoint == end_a
    assert effect.commands[0] == ("ASKING",) and effect.commands[1][0] == "EVAL"
    with pytest.raises(StopIteration) as done:
        steps.send([b"OK", [1]])
    assert done.value.value == [[[1]], [[1]]]
    assert m.owner(slot) == b  # ASK does not change the map


def test_tryagain_is_sent_again_while_the_round_lasts() -> None:
    from redis.exceptions import TryAgainError

    a = ("127.0.0.1", 7000)
    m = ClusterMember([a], {})
    ends = Endpoints([m], refresh_interval=1.0)
    m.load([[0, 16383, [b"127.0.0.1", 7000, b"id"]]], a)
    call = Call(RENEW, (lock_key("x"),), (1000, "owner"))
    steps = route(Fanout(((call,),)), ends, time.monotonic, 0.25)
    effect = steps.send(None)
    assert isinstance(effect, NodeRound)
    end = ends.of(0, a)
    replies: list[list[object]] = [[] for _ in effect.calls]
    replies[end] = [TryAgainError("Multiple keys request during rehashing of slot")]
    effect = steps.send(replies)
    assert isinstance(effect, Backoff)
    effect = steps.send(None)
    assert isinstance(effect, NodeRound) and effect.calls[end] == (call,)
    replies = [[] for _ in effect.calls]
    replies[end] = [[1]]
    with pytest.raises(StopIteration) as done:
        steps.send(replies)
    assert done.value.value == [[[1]]]
    # Out of time: the refusal stands, as that member's failure.
    late = iter([0.0, 1.0, 1.0, 1.0])
    steps = route(Fanout(((call,),)), ends, lambda: next(late), 0.25)
    effect = steps.send(None)
    replies = [[] for _ in effect.calls]  # type: ignore[union-attr]
    replies[end] = [TryAgainError("again")]
    with pytest.raises(StopIteration) as done:
        steps.send(replies)
    assert isinstance(done.value.value[0][0], TryAgainError)


def test_valkey_is_an_optional_import(monkeypatch: pytest.MonkeyPatch) -> None:
    from redreentrant._async.cluster import cluster_types as async_types
    from redreentrant._sync.cluster import cluster_types as sync_types

    for name in ("valkey", "valkey.cluster", "valkey.asyncio", "valkey.asyncio.cluster"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails
    assert sync_types() == (redis.cluster.RedisCluster,)
    assert async_types() == (redis.asyncio.cluster.RedisCluster,)
    with pytest.raises(TypeError, match="RedisCluster"):
        LockManager([object()])  # type: ignore[list-item]


def test_renewals_split_per_slot_and_go_to_each_node_in_one_pipeline() -> None:
    from redreentrant._core.holds import Hold
    from redreentrant._core.kinds import EXCLUSIVE
    from redreentrant._core.quorum import Quorum
    from redreentrant._core.watchdog import renew_steps

    a, b = ("127.0.0.1", 7000), ("127.0.0.1", 7001)
    m = ClusterMember([a], {})
    m.load([[0, 8191, [b"127.0.0.1", 7000, b"a"]], [8192, 16383, [b"127.0.0.1", 7001, b"b"]]], a)
    ends = Endpoints([m], refresh_interval=1.0)
    names = [f"n{k}" for k in range(12)]
    holds = [Hold(EXCLUSIVE, n, "owner", 1, 3.0, True, 1.0) for n in names]
    renew = renew_steps(Quorum(("c",), 0.01, 0.05), holds, 3.0, {0})
    fanout = renew.send(None)
    assert len(fanout.calls[0]) == len({key_slot(lock_key(n)) for n in names})  # per slot
    steps = route(fanout, ends, time.monotonic, 0.25)
    effect = steps.send(None)
    assert isinstance(effect, NodeRound)
    on_a = effect.calls[ends.of(0, a)]
    on_b = effect.calls[ends.of(0, b)]
    assert len(on_a) + len(on_b) == len(fanout.calls[0]) and on_a and on_b
    assert all(key_slot(c.keys[0]) < 8192 for c in on_a)  # each node's calls, one pipeline
    assert all(key_slot(c.keys[0]) >= 8192 for c in on_b)


def test_a_member_whose_map_cannot_be_read_is_asked_again_only_after_an_interval() -> None:
    a = ("127.0.0.1", 7000)
    m = ClusterMember([a], {})
    ends = Endpoints([m], refresh_interval=1.0)
    call = Call(RENEW, (lock_key("x"),), (1000, "owner"))
    now = [0.0]
    for t, asks in ((0.0, True), (0.5, False), (1.5, True)):
        now[0] = t
        steps = route(Fanout(((call,),)), ends, lambda: now[0], 0.25)
        effect = steps.send(None)
        if asks:
            assert isinstance(effect, NodeCommands) and effect.commands == (("CLUSTER", "SLOTS"),)
            effect = steps.send([ConnectionError("refused")])
        # The seed is tried all the same (it would redirect if it answered).
        assert isinstance(effect, NodeRound) and effect.calls[ends.of(0, a)] == (call,)
        replies: list[list[object]] = [[] for _ in effect.calls]
        replies[ends.of(0, a)] = [ConnectionError("refused")]
        with pytest.raises(StopIteration):
            steps.send(replies)
    assert m.stale and a in m.down


def test_a_cluster_client_is_read_for_its_nodes_and_settings() -> None:
    from redreentrant._core.cluster import connect_timeout
    from redreentrant._core.masters import cluster_of_client

    client = redis.asyncio.cluster.RedisCluster(
        host="localhost", port=7000, password="secret", ssl=True, ssl_cert_reqs="none"
    )  # not initialised: nothing is connected
    m = cluster_of_client(client)
    assert m.seeds == (("127.0.0.1", 7000),) and m.client is client
    assert m.options["password"] == "secret" and m.options["ssl"] is True
    assert m.options["ssl_cert_reqs"] == "none"
    assert "connection_class" not in m.options and "retry" not in m.options
    assert connect_timeout(m, 0.25) == 0.25  # the client's 5 s default is capped
    assert connect_timeout(ClusterMember([("h", 1)], {"socket_connect_timeout": 0.1}), 1) == 0.1
