"""The read/write lock and the fair lock against real masters, healthy and degraded.

Every test runs twice: with five masters up, and with two of the five killed.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from helpers import WORKERS, in_threads, increment, many_managers, read_line, stop, wait_until

from redreentrant import LockManager, LockUpgradeError
from redreentrant._core.keys import aux_key
from redreentrant.testing import LocalEnsemble


@pytest.fixture(params=[0, 2], ids=["all-up", "two-down"])
def masters(request: pytest.FixtureRequest, ensemble: LocalEnsemble) -> Iterator[list[str]]:
    for i in (1, 3)[: request.param]:
        ensemble[i].kill()
    yield ensemble.urls


@pytest.fixture
def mgr(masters: list[str]) -> Iterator[LockManager]:
    with LockManager(masters, lease=5.0) as m:
        yield m


def spawn(urls: list[str], name: str, lease: float, kind: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKERS), "hold", ",".join(urls), name, str(lease), kind],
        stdout=subprocess.PIPE,
        text=True,
    )


# -- read/write ---------------------------------------------------------------------


def queued(mgr: LockManager, name: str) -> int:
    """The fewest waiters any running master has queued for the fair lock ``name``."""
    views = [v for v in mgr.inspect(name) if v.error is None]
    return min(len(v.locks[0].queue) if v.locks else 0 for v in views)


def subscribed(url: str, channel: str) -> int:
    """How many connections hear ``channel`` on a master (a killed one counts as all)."""
    try:
        with redis.Redis.from_url(url) as r:
            return int(r.pubsub_numsub(channel)[0][1])
    except redis.ConnectionError:
        return 1 << 30


def test_readers_overlap_and_writers_exclude(masters: list[str]) -> None:
    state = {"readers": 0, "most_readers": 0, "writing": 0, "counter": 0, "bad": 0}
    guard = threading.Lock()  # protects only the bookkeeping, not the tested section

    def reader(m: LockManager) -> None:
        rw = m.rw_lock("doc")
        for _ in range(8):
            with rw.read:
                with guard:
                    state["readers"] += 1
                    state["most_readers"] = max(state["most_readers"], state["readers"])
                    state["bad"] += state["writing"]
                time.sleep(0.01)
                with guard:
                    state["readers"] -= 1

    def writer(m: LockManager) -> None:
        rw = m.rw_lock("doc")
        for _ in range(8):
            with rw.write:
                with guard:
                    state["bad"] += state["readers"] + state["writing"]
                    state["writing"] += 1
                increment(state, "counter", 0.002)  # non-atomic on purpose
                with guard:
                    state["writing"] -= 1

    roles = [reader] * 4 + [writer] * 2
    with many_managers(2, masters) as managers:
        in_threads(lambda i, role: role(managers[i % 2]), enumerate(roles))
    assert state["bad"] == 0
    assert state["counter"] == 16
    assert state["most_readers"] >= 2  # readers did share the lock


def test_a_writer_downgrades_by_taking_the_read_lock(mgr: LockManager, masters: list[str]) -> None:
    rw = mgr.rw_lock("downgrade")
    with LockManager(masters) as other:
        theirs = other.rw_lock("downgrade")
        rw.write.acquire()
        rw.read.acquire()  # a writer may read
        assert theirs.read.acquire(blocking=False) is False
        rw.write.release()  # ... and keeps reading
        assert rw.read.is_owned() and not rw.write.is_owned()
        assert rw.read.locked() and not rw.write.locked()
        assert theirs.read.acquire(blocking=False) is True  # readers may join now
        theirs.read.release()
        assert theirs.write.acquire(blocking=False) is False  # we still read
        rw.read.release()
        assert theirs.write.acquire(blocking=False) is True
        theirs.write.release()


def test_a_reader_asking_to_write_fails_fast(mgr: LockManager) -> None:
    rw = mgr.rw_lock("upgrade")
    with rw.read:
        started = time.monotonic()
        with pytest.raises(LockUpgradeError):
            rw.write.acquire(timeout=30)
        with pytest.raises(LockUpgradeError):
            rw.write.acquire(blocking=False)
        assert time.monotonic() - started < 2
        assert rw.read.hold_count == 1 and rw.write.hold_count == 0
    with rw.write:  # fine once the read lock is released
        assert rw.write.is_owned()


def test_reads_and_writes_are_reentrant(mgr: LockManager) -> None:
    rw = mgr.rw_lock("nest")
    with rw.write, rw.write, rw.read, rw.read:
        assert (rw.write.hold_count, rw.read.hold_count) == (2, 2)
    with rw.read, rw.read:
        assert rw.read.hold_count == 2
    assert not rw.read.locked() and not rw.write.locked()


def test_a_waiting_writer_is_not_starved_by_a_stream_of_readers(masters: list[str]) -> None:
    stop = threading.Event()
    managers = [LockManager(masters) for _ in range(3)]

    def reader(m: LockManager) -> None:
        lock = m.rw_lock("busy").read
        while not stop.is_set():
            # Readers overlap all the time: without writer priority there is never a
            # moment with no reader, and the writer would wait forever.
            if lock.acquire(timeout=0.5):
                time.sleep(0.05)
                lock.release()

    threads = [threading.Thread(target=reader, args=(m,)) for m in managers]
    try:
        for t in threads:
            t.start()
        time.sleep(0.3)
        with LockManager(masters) as writer_mgr:
            writer = writer_mgr.rw_lock("busy").write
            assert writer.acquire(timeout=10), "the writer starved"
            writer.release()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
        for m in managers:
            m.close()


def test_releasing_the_write_lock_wakes_every_waiting_reader(masters: list[str]) -> None:
    with LockManager(masters, lease=30) as holder:
        holder.rw_lock("wake").write.acquire()
        inside = threading.Barrier(4, timeout=10)
        got: list[float] = []
        managers = [LockManager(masters, lease=30) for _ in range(2)]

        def reader(m: LockManager) -> None:
            with m.rw_lock("wake").read:
                got.append(time.monotonic())
                inside.wait()  # all three readers are inside together

        threads = [threading.Thread(target=reader, args=(managers[i % 2],)) for i in range(3)]
        for t in threads:
            t.start()
        channel = aux_key("wake", "rw:wake:r")
        wait_until(
            lambda: all(subscribed(url, channel) >= 2 for url in masters), "heard by both waiters"
        )
        released = time.monotonic()
        holder.rw_lock("wake").write.release()
        inside.wait()
        for t in threads:
            t.join(timeout=10)
        for m in managers:
            m.close()
        assert len(got) == 3 and max(got) - released < 20.0  # woken, not by the 30 s lease


def test_a_killed_reader_frees_the_lock_within_its_lease(masters: list[str]) -> None:
    lease = 1.0
    proc = spawn(masters, "crashed", lease, "read")
    try:
        assert read_line(proc) == "waiting\n" and read_line(proc) == "held\n"
        with LockManager(masters) as mgr:
            writer = mgr.rw_lock("crashed").write
            assert writer.acquire(blocking=False) is False
            stop(proc)
            killed = time.monotonic()
            assert writer.acquire(timeout=lease + 1.0)
            assert time.monotonic() - killed <= lease + 1.0
            writer.release()
    finally:
        if proc.poll() is None:
            stop(proc)


@pytest.mark.parametrize("kind", ["read", "write", "fair"])
def test_the_watchdog_renews_every_kind(masters: list[str], kind: str) -> None:
    with LockManager(masters, lease=1.0) as mgr, LockManager(masters) as rival:

        def pick(m: LockManager) -> object:
            return {
                "read": m.rw_lock("renewed").write,
                "write": m.rw_lock("renewed").read,
                "fair": m.fair_lock("renewed"),
            }[kind]  # the rival's conflicting side

        mine = {
            "read": mgr.rw_lock("renewed").read,
            "write": mgr.rw_lock("renewed").write,
            "fair": mgr.fair_lock("renewed"),
        }[kind]
        theirs = pick(rival)
        with mine:
            end = time.monotonic() + 2.5
            while time.monotonic() < end:
                assert theirs.acquire(blocking=False) is False  # type: ignore[attr-defined]
                time.sleep(0.2)
            assert mine.is_owned()
        assert theirs.acquire(blocking=False) is True  # type: ignore[attr-defined]
        theirs.release()  # type: ignore[attr-defined]


# -- fair -----------------------------------------------------------------------------


def test_fair_lock_grants_in_order_of_arrival(mgr: LockManager, masters: list[str]) -> None:
    fair = mgr.fair_lock("fifo")
    order: list[int] = []

    def wait(i: int) -> None:
        with managers[i % 3].fair_lock("fifo"):
            order.append(i)
            time.sleep(0.01)

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(7)]
    with many_managers(3, masters) as managers:
        with fair:
            for i, t in enumerate(threads):
                t.start()
                # Arrive one after another, in a known order: each is queued on every
                # master before the next starts.
                wait_until(lambda n=i + 1: queued(mgr, "fifo") == n, f"{i + 1} queued")
            queue = mgr.inspect("fifo")[0].locks[0].queue
            assert len(queue) == 7
        for t in threads:
            t.join(timeout=30)
    assert order == list(range(7))


def test_fair_lock_is_reentrant(mgr: LockManager) -> None:
    fair = mgr.fair_lock("fair-nest")
    with fair, fair, fair:
        assert fair.hold_count == 3 and fair.locked()
    assert not fair.locked()


def test_a_waiter_that_times_out_leaves_the_queue(mgr: LockManager, masters: list[str]) -> None:
    with LockManager(masters) as other, mgr.fair_lock("gave-up"):
        assert other.fair_lock("gave-up").acquire(timeout=0.4) is False
        views = mgr.inspect("gave-up")
        assert all(lock.queue == [] for v in views for lock in v.locks)
        # The ensemble fixture also checks that no key at all is left behind.


def test_a_killed_waiter_does_not_stick_the_queue(mgr: LockManager, masters: list[str]) -> None:
    lease = 1.0  # the killed waiter's place lasts at most this long without a refresh
    fair = mgr.fair_lock("dead-waiter")
    fair.acquire()
    proc = spawn(masters, "dead-waiter", lease, "fair")
    try:
        assert read_line(proc) == "waiting\n"
        wait_until(
            lambda: any(v.locks and v.locks[0].queue for v in mgr.inspect("dead-waiter")),
            "queued: the doomed process's waiter",
            5,
        )
        got = threading.Event()

        def behind() -> None:
            with LockManager(masters) as other, other.fair_lock("dead-waiter"):
                got.set()

        t = threading.Thread(target=behind)
        t.start()
        wait_until(lambda: queued(mgr, "dead-waiter") == 2, "queued behind the doomed process")
        stop(proc)
        fair.release()
        assert got.wait(timeout=lease + 3), "the queue stuck behind a dead waiter"
        t.join(timeout=10)
        # The dead waiter's place lapses by itself, its keys with it, also on a master
        # where no call ran after its deadline (the others reached a quorum without it).
        wait_until(
            lambda: not any(v.locks for v in mgr.inspect("dead-waiter") if v.error is None),
            "gone: the queue",
            lease + 5,
        )
    finally:
        if proc.poll() is None:
            stop(proc)


def test_masters_that_queued_waiters_in_different_orders_still_agree(
    ensemble: LocalEnsemble,
) -> None:
    # (Waiters block with a 10 s timeout below: their queue entries last that long.)
    # Four masters (quorum 3): two saw W before V, two saw V before W. Each master grants
    # only its own head, so without a tie-break every round splits 2-2 until the
    # waiters' entries lapse (their 10 s timeout); with it, one yields at once.
    urls = ensemble.urls[:4]
    queue = aux_key("split", "fair:queue")
    with LockManager(urls) as holder, LockManager(urls) as one, LockManager(urls) as two:
        got: dict[str, float] = {}
        fair = holder.fair_lock("split")
        fair.acquire()

        def wait(who: str, mgr: LockManager) -> None:
            lock = mgr.fair_lock("split")
            if lock.acquire(timeout=10):
                got[who] = time.monotonic()
                lock.release()

        threads = [
            threading.Thread(target=wait, args=("W", one)),
            threading.Thread(target=wait, args=("V", two)),
        ]
        for t in threads:
            t.start()
            time.sleep(0.2)
        with redis.Redis.from_url(urls[0]) as r:
            order = r.lrange(queue, 0, -1)
        assert len(order) == 2
        for url in urls[2:]:
            with redis.Redis.from_url(url) as r:
                r.delete(queue)
                r.rpush(queue, *reversed(order))
        released = time.monotonic()
        fair.release()
        for t in threads:
            t.join(timeout=15)
        assert set(got) == {"W", "V"}
        assert max(got.values()) - released < 1.0, "the split vote did not settle"
