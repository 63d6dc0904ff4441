"""A master that forgot does not vote: each master's memory record, the quarantine of a
master whose memory began lately (a restart without its data, FLUSHALL, a promoted
replica), and what it keeps from a second holder, for every kind, on real servers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

import redreentrant.asyncio
from redreentrant import LockLostError, LockManager, QuorumUnavailableError
from redreentrant._core import scripts
from redreentrant._core.keys import MEMORY_KEY, lock_key, reserved_key, waiters_key
from redreentrant.testing import LocalEnsemble, LocalServer
from tests.helpers import drop_counters, run, run_cli, wait_until

pytestmark = pytest.mark.integration

LEASE = 1.5


def stamp(r: redis.Redis, name: str = "stamped") -> list[int]:
    """The stamp of a try of lock ``name`` on ``r`` (taken, then let go)."""
    keys = [lock_key(name), waiters_key(name), reserved_key(name)]
    reply = r.eval(scripts.ACQUIRE.source, 3, *keys, "o", 1000, "1:1", 0)
    r.delete(*keys)
    assert isinstance(reply, list) and isinstance(reply[-1], list), reply
    return [int(x) for x in reply[-1]]


def memory(r: redis.Redis) -> list[int]:
    reply = r.eval(scripts.MEMORY.source, 1, MEMORY_KEY)
    assert isinstance(reply, list)
    return [int(x) for x in reply]


# -- the record ------------------------------------------------------------------------------


def test_a_try_makes_the_record_when_missing_and_reports_its_age(ensemble: LocalEnsemble) -> None:
    r = redis.Redis(port=ensemble[0].port)
    assert stamp(r)[1] > 10**12  # a server's first start: its memory began before any lease
    r.delete(MEMORY_KEY)  # what a restart without its data, or a flush, leaves
    assert memory(r)[1:] == [-1, 0]  # none yet: the next try makes it
    now, age, failover = stamp(r)
    assert (age, failover) == (0, 0)
    assert int(r.hget(MEMORY_KEY, "began") or 0) == now
    time.sleep(0.05)
    assert 50 <= stamp(r)[1] < 5000
    assert 50 <= memory(r)[1] < 5000
    r.close()


def test_a_promoted_replica_begins_its_memory_anew_as_a_failover() -> None:
    with LocalServer() as primary, LocalServer() as replica:
        p, rep = redis.Redis(port=primary.port), redis.Redis(port=replica.port)
        rep.replicaof("127.0.0.1", primary.port)
        wait_until(lambda: rep.info("replication")["master_link_status"] == "up", "link")
        assert stamp(p)[2] == 0  # made at the first start, kept
        p.wait(1, 2000)
        wait_until(lambda: rep.hget(MEMORY_KEY, "began") is not None, "the record replicated")
        rep.replicaof("no", "one")
        assert memory(rep)[1:] == [0, 1]  # the next try begins it
        _, age, failover = stamp(rep)
        assert failover == 1 and age < 1000
        time.sleep(0.02)
        assert stamp(rep)[2] == 1 and stamp(rep)[1] >= 20  # begun once, kept since
        p.close()
        rep.close()


def test_a_restart_that_keeps_the_data_keeps_the_memory() -> None:
    keep = ["--appendonly", "yes", "--appendfsync", "always"]
    with LocalServer(extra_args=keep) as server:
        r = redis.Redis(port=server.port)
        r.delete(MEMORY_KEY)
        stamp(r)  # a record made now, under this run's replication id
        time.sleep(0.1)
        server.kill()
        server.start()
        r = redis.Redis(port=server.port)
        _, age, failover = stamp(r)
        assert age >= 100 and failover == 0  # not quarantined by the restart
        r.close()


# -- no second holder -------------------------------------------------------------------------


def plain(mgr: Any, name: str) -> Any:
    return mgr.lock(name)


KINDS: dict[str, Callable[[Any, str], Any]] = {
    "plain": plain,
    "rw": lambda mgr, name: mgr.rw_lock(name).write,
    "fair": lambda mgr, name: mgr.fair_lock(name),
    "semaphore": lambda mgr, name: mgr.semaphore(name, permits=1),
    "multi-lock": lambda mgr, name: mgr.multi_lock([name, name + "-2"]),
    "election": lambda mgr, name: mgr.election(name),
}
RIVALS: dict[str, Callable[[Any, str], Any]] = {
    **KINDS,
    "rw": lambda mgr, name: mgr.rw_lock(name).read,  # a reader: shut out by the writer
}


def forget(ensemble: LocalEnsemble, how: str, count: int = 3) -> None:
    for server in ensemble.servers[:count]:
        if how == "restart":
            server.restart()  # empty: no persistence
        else:
            with redis.Redis(port=server.port) as r:
                r.flushall()


def rival_grants(rival: Any, until: float) -> list[float]:
    """Non-blocking tries by ``rival`` until ``until`` (monotonic): when each won."""
    won = []
    while time.monotonic() < until:
        with contextlib.suppress(QuorumUnavailableError):  # connections the restart broke
            if rival.acquire(blocking=False):
                won.append(time.monotonic())
                rival.release()
        time.sleep(0.02)
    return won


@pytest.mark.parametrize(
    ("kind", "how"),
    [(kind, "restart") for kind in KINDS] + [("plain", "flushall"), ("election", "flushall")],
)
def test_a_majority_that_forgot_never_lets_a_second_holder_in(
    ensemble: LocalEnsemble, kind: str, how: str
) -> None:
    """3 of 5 masters lose their memory while a lock is held: no rival holds it while
    the holder's validity runs, the holder is told before it ends, and once the
    quarantine has passed the rival gets the lock."""
    lost: list[float] = []
    name = f"forgot-{kind}"
    with (
        LockManager(
            ensemble.urls, lease=LEASE, on_lost=lambda lock: lost.append(time.monotonic())
        ) as a,
        LockManager(ensemble.urls, lease=LEASE) as b,
    ):
        holder = KINDS[kind](a, name)
        assert holder.acquire(blocking=False)
        rival = RIVALS[kind](b, name)
        assert not rival.acquire(blocking=False)  # b has seen the masters before
        forget(ensemble, how)
        valid_until = time.monotonic() + holder.remaining()
        won = rival_grants(rival, valid_until)
        assert not won, f"a second holder {valid_until - won[0]:.3f}s before the validity ended"
        assert lost and lost[0] < valid_until, "the holder was not told before its validity ended"
        assert rival.acquire(timeout=3 * LEASE)  # the quarantine passed
        rival.release()
    drop_counters(ensemble)  # an election's terms outlive it


def test_a_new_client_that_never_saw_the_masters_is_kept_out_too(ensemble: LocalEnsemble) -> None:
    with LockManager(ensemble.urls, lease=LEASE) as a:
        holder = a.lock("newcomer")
        assert holder.acquire()
        forget(ensemble, "restart")
        valid_until = time.monotonic() + holder.remaining()
        with LockManager(ensemble.urls, lease=LEASE) as b:  # its first round comes after
            assert not rival_grants(b.lock("newcomer"), valid_until)


def test_asyncio_a_majority_restarted_empty_keeps_the_second_holder_out(
    ensemble: LocalEnsemble,
) -> None:
    async def main() -> None:
        lost: list[float] = []
        async with (
            redreentrant.asyncio.LockManager(
                ensemble.urls, lease=LEASE, on_lost=lambda lock: lost.append(time.monotonic())
            ) as a,
            redreentrant.asyncio.LockManager(ensemble.urls, lease=LEASE) as b,
        ):
            holder = a.lock("forgot-async")
            assert await holder.acquire()
            forget(ensemble, "restart")
            valid_until = time.monotonic() + holder.remaining()
            rival = b.lock("forgot-async")
            while time.monotonic() < valid_until:
                with contextlib.suppress(QuorumUnavailableError):
                    assert not await rival.acquire(blocking=False)
                await asyncio.sleep(0.02)
            assert lost and lost[0] < valid_until
            assert await rival.acquire(timeout=3 * LEASE)
            await rival.release()

    run(main())


def test_without_quarantine_a_majority_restarted_empty_lets_a_second_holder_in(
    ensemble: LocalEnsemble,
) -> None:
    """``quarantine=0``: what the quarantine is for (a rival gets the lock while the
    holder's validity runs; its renewal comes a lease/3 later)."""
    with (
        LockManager(ensemble.urls, lease=LEASE, quarantine=0) as a,
        LockManager(ensemble.urls, lease=LEASE, quarantine=0) as b,
    ):
        holder = a.lock("unguarded")
        assert holder.acquire()
        forget(ensemble, "restart")
        valid_until = time.monotonic() + holder.remaining()
        rival = b.lock("unguarded")
        assert rival.acquire(blocking=False) and time.monotonic() < valid_until
        rival.release()
        wait_until(lambda: not holder.is_owned(), "the holder told of its loss")
        with contextlib.suppress(LockLostError):
            holder.release()


# -- settings, and what inspect, top and quarantined() show ----------------------------------


def test_a_fixed_lease_longer_than_the_quarantine_is_refused(urls: list[str]) -> None:
    with pytest.raises(ValueError, match=r"lease 30s is longer than quarantine=10s"):
        LockManager(urls, quarantine=10)
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="quarantine must"):
            LockManager(urls, quarantine=bad)
    with LockManager(urls, lease=5, quarantine=10) as mgr:
        with pytest.raises(ValueError, match=r"lease 11s is longer than quarantine=10s"):
            mgr.lock("fixed").acquire(lease=11)
        lock = mgr.lock("fixed")
        assert lock.acquire(lease=8)
        with pytest.raises(ValueError, match="longer than quarantine=10s"):
            lock.extend(9)  # what it has left, and 9 s more
        lock.release()
    with LockManager(urls, lease=5, quarantine=0) as mgr:  # none: any lease
        lock = mgr.lock("fixed")
        assert lock.acquire(lease=60)
        lock.release()


def test_quarantined_masters_are_shown_with_the_time_left(ensemble: LocalEnsemble) -> None:
    with LockManager(ensemble.urls, lease=LEASE, quarantine=20) as mgr:
        assert mgr.quarantined() == [0.0] * 5
        ensemble[1].restart()
        wait_until(lambda: mgr.quarantined()[1] > 0, "the restarted master read")  # reconnected
        left = mgr.quarantined()
        assert left[1] == pytest.approx(20, abs=0.5) and left[0] == 0.0  # from the next try
        with mgr.lock("shown"):
            pass
        time.sleep(0.2)
        left = mgr.quarantined()
        assert 18 < left[1] < 19.9 and [left[i] for i in (0, 2, 3, 4)] == [0.0] * 4
        views = mgr.inspect("shown")
        assert views[1].quarantined > 18 and views[1].memory is not None
        assert views[1].memory < 2 and not views[1].failover
        shown = run_cli("inspect", "shown", masters=ensemble.urls, ok=True).stdout
        assert f"127.0.0.1:{ensemble[1].port}/0: quarantined, its votes count in" in shown
        top = run_cli("top", "--once", masters=ensemble.urls, ok=True).stdout
        assert "quarantined" in top


def test_a_refusal_for_want_of_counted_votes_is_told_from_one_by_a_holder(urls: list[str]) -> None:
    """``quorum_votes_at()``: after it, a refused acquire was refused by a holder; before
    it, by quarantined masters, and an acquire once it has come is granted."""
    with LockManager(urls, lease=LEASE) as mgr, LockManager(urls, lease=LEASE) as other:
        theirs, lock = other.lock("told"), mgr.lock("told")
        assert theirs.acquire()
        started = time.monotonic()
        assert not lock.acquire(blocking=False)
        assert mgr.quorum_votes_at() <= started  # every master voted: a holder refused
        theirs.release()
        for url in urls[:3]:  # a majority's memory begins now (a restart without data)
            redis.Redis.from_url(url).delete(MEMORY_KEY)
        started = time.monotonic()
        assert not lock.acquire(blocking=False)
        at = mgr.quorum_votes_at()
        assert started < at < started + LEASE + 1.0  # about a quarantine from the try
        while not lock.acquire(blocking=False):  # the same refusal, until their votes count
            assert mgr.quorum_votes_at() > started, "refused with every vote counted"
            started = time.monotonic()
            time.sleep(max(0.0, mgr.quorum_votes_at() - started))
        assert time.monotonic() >= at and lock.is_owned()
        lock.release()

    async def twin() -> float:
        async with redreentrant.asyncio.LockManager(urls, lease=LEASE) as amgr:
            return amgr.quorum_votes_at()

    assert run(twin()) == float("-inf")  # no round yet: nothing counted out


def test_after_the_quarantine_tokens_grow_past_the_ones_forgotten(ensemble: LocalEnsemble) -> None:
    """A majority restarted empty lost the fencing counters: no token while they are
    quarantined, and after it a token larger than every earlier one (their clocks)."""
    with LockManager(ensemble.urls, lease=LEASE, fencing=True) as mgr:
        with mgr.lock("fenced") as lock:
            last = lock.token
        forget(ensemble, "restart")
        started = time.monotonic()
        lock = mgr.lock("fenced")
        while True:
            with contextlib.suppress(QuorumUnavailableError):  # connections the restart broke
                assert lock.acquire(timeout=3 * LEASE)
                break
        assert time.monotonic() - started > LEASE * 0.9  # quarantined until then
        assert lock.token is not None and lock.token > last
        lock.release()
    drop_counters(ensemble)
