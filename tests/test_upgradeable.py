"""The upgradeable reader of the read/write lock (``rw_lock(name).upgradeable``) against
real masters, one and five, sync and asyncio: it shares with readers and excludes
writers and other upgradeable readers; an upgrade waits for the readers, is woken by
the last one's release, and no writer gets in between; a timed-out upgrade changes
nothing; a downgrade lets readers in; loss and a killed holder. Also the history
checker's rules for the upgradeable mode (no server)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import PY, delete_everywhere, in_threads, on_masters, read_line, run, stop, wait_until

import redreentrant.asyncio as aio
from redreentrant import (
    FencingError,
    LockLostError,
    LockManager,
    LockNotOwnedError,
    LockUpgradeError,
    UpgradeableReadLock,
)
from redreentrant._core.keys import aux_key
from redreentrant.testing.history import Event, Recorder, check, load

#: long enough that only a wake-up, never a lease's end or a waiter's periodic retry
#: (a third of the lease at the soonest), ends a wait within the tests' bounds
LONG = 60.0


def rw_keys(name: str) -> tuple[str, str, str]:
    return aux_key(name, "rw"), aux_key(name, "rw:leases"), aux_key(name, "rw:writers")


def waiting_writers(urls: list[str], name: str) -> list[list[str]]:
    """Per master: the owners registered as waiting writers (or upgrades) of ``name``."""
    writers = aux_key(name, "rw:writers")
    return on_masters(urls, lambda r: r.zrange(writers, 0, -1), decode_responses=True)


def subscribed(urls: list[str], channel: str) -> bool:
    """Whether every master has a subscriber on ``channel``."""
    return all(on_masters(urls, lambda r: int(r.pubsub_numsub(channel)[0][1]) >= 1))


class Other:
    """Another owner: a thread of its own, running the calls given to it in turn."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1)

    def start(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run ``fn`` there; its result (or error) comes in the future."""
        return self._pool.submit(fn)

    def __call__(self, fn: Callable[[], Any]) -> Any:
        return self.start(fn).result(timeout=30)


def gets(lock_of: Callable[[], Any]) -> bool:
    """Whether a new owner (another thread) gets the lock at once (released again)."""

    def go() -> bool:
        lock = lock_of()
        got = bool(lock.acquire(blocking=False))
        if got:
            lock.release()
        return got

    return bool(Other()(go))


def pending(future: Future[Any], seconds: float = 0.2) -> bool:
    """Whether ``future`` is still not done ``seconds`` later (a call still waiting)."""
    done, _ = wait_futures([future], timeout=seconds)
    return not done


# -- what it shares and excludes ------------------------------------------------------


def test_it_shares_with_readers_and_excludes_writers_and_other_upgradeable_readers(
    masters: list[str],
) -> None:
    with LockManager(masters) as a, LockManager(masters) as b:
        up = a.rw_lock("doc").upgradeable
        theirs = b.rw_lock("doc")
        assert isinstance(up, UpgradeableReadLock)
        assert up.acquire(blocking=False)
        assert up.locked() and theirs.upgradeable.locked()
        assert theirs.read.locked() and not theirs.write.locked()  # in read mode
        reader = Other()
        assert reader(lambda: theirs.read.acquire(blocking=False))  # readers share
        assert not gets(lambda: theirs.upgradeable)  # one at a time
        assert not gets(lambda: a.rw_lock("doc").upgradeable)  # in its own manager too
        assert not gets(lambda: theirs.write)  # writers are excluded
        owners = {f"{a.owner_id()} (upgradeable)", f"{reader(b.owner_id)} (read)"}
        views = [v for v in a.inspect("doc") if v.locks and set(v.locks[0].holders) == owners]
        assert len(views) >= len(masters) // 2 + 1  # (a round ends with a quorum)
        reader(theirs.read.release)
        assert not gets(lambda: theirs.write)  # still excluded, by it alone
        up.release()
        assert gets(lambda: theirs.upgradeable)  # the next one may come
        assert gets(lambda: theirs.write)
        with theirs.write:
            assert not up.acquire(blocking=False)  # a writer excludes it


def test_a_waiting_writer_stops_new_upgradeable_readers(masters: list[str]) -> None:
    with LockManager(masters, lease=LONG) as a, LockManager(masters, lease=LONG) as b:
        reader = a.rw_lock("queue").read
        assert reader.acquire()
        writer = Other()
        wrote = writer.start(lambda: b.rw_lock("queue").write.acquire(timeout=30))
        wait_until(lambda: all(waiting_writers(masters, "queue")), "the writer registered")
        assert not b.rw_lock("queue").upgradeable.acquire(blocking=False)
        reader.release()
        assert wrote.result(timeout=30) is True
        writer(b.rw_lock("queue").write.release)


def test_a_reader_or_writer_asking_for_the_upgradeable_lock_fails_fast(
    masters: list[str],
) -> None:
    with LockManager(masters) as mgr:
        rw = mgr.rw_lock("fast")
        with rw.read:
            started = time.monotonic()
            with pytest.raises(LockUpgradeError, match="read lock cannot take the upgradeable"):
                rw.upgradeable.acquire(timeout=30)
            with pytest.raises(LockUpgradeError, match="read lock cannot take the write"):
                rw.write.acquire(timeout=30)  # as before: a plain reader asking to write
            assert time.monotonic() - started < 10  # at once, not after the timeouts
            assert rw.read.hold_count == 1 and not rw.upgradeable.is_owned()
        with rw.write:
            with pytest.raises(LockUpgradeError, match="write lock cannot take the upgradeable"):
                rw.upgradeable.acquire(timeout=30)
            assert rw.write.hold_count == 1


# -- the upgrade ------------------------------------------------------------------------


def test_an_upgrade_waits_for_the_readers_and_is_woken_by_the_last_release(
    masters: list[str],
) -> None:
    with (
        LockManager(masters, lease=LONG) as a,
        LockManager(masters, lease=LONG) as b,
        LockManager(masters, lease=LONG) as c,
    ):
        rw = a.rw_lock("grow")
        holder, first, second = Other(), Other(), Other()
        me = holder(a.owner_id)
        assert holder(rw.upgradeable.acquire)
        assert first(lambda: b.rw_lock("grow").read.acquire())
        assert second(lambda: c.rw_lock("grow").read.acquire())
        upgraded = holder.start(rw.upgradeable.upgrade)
        # The intent is marked: new readers wait, as they do for a waiting writer.
        wait_until(
            lambda: all(q == [me] for q in waiting_writers(masters, "grow")),
            "the upgrade registered its intent",
        )
        channel = aux_key("grow", "rw:wake:u")
        wait_until(lambda: subscribed(masters, channel), "the upgrade waiting for a wake-up")
        assert not gets(lambda: b.rw_lock("grow").read)
        first(b.rw_lock("grow").read.release)
        assert pending(upgraded)  # one reader is left
        released = time.monotonic()
        second(c.rw_lock("grow").read.release)
        # Woken by that release: without a wake-up its next try would come a third of
        # the 60 s lease later, at the soonest.
        assert upgraded.result(timeout=LONG) is True
        assert time.monotonic() - released < 10.0
        assert holder(lambda: (rw.write.hold_count, rw.upgradeable.hold_count)) == (1, 1)
        # Off the waiting writers where it was granted: a quorum (a master that refused
        # a try keeps it registered until the release, which changes nothing there).
        left = [q == [] for q in waiting_writers(masters, "grow")]
        assert sum(left) >= len(masters) // 2 + 1
        assert not gets(lambda: c.rw_lock("grow").read)
        holder(rw.upgradeable.downgrade)
        holder(rw.upgradeable.release)


def test_no_writer_gets_in_between_an_upgrade_and_its_grant(
    masters: list[str], tmp_path: Path
) -> None:
    name = "between"
    path = tmp_path / "history.jsonl"
    with (
        Recorder(path, "test") as rec,
        LockManager(masters, lease=LONG) as a,
        LockManager(masters, lease=LONG) as b,
        LockManager(masters, lease=LONG) as c,
    ):
        up = a.rw_lock(name).upgradeable
        holder, reader, writer = Other(), Other(), Other()
        me, them = holder(a.owner_id), writer(c.owner_id)
        up_rec, reader_rec, writer_rec = rec.child("up"), rec.child("r"), rec.child("w")

        def span(r: Recorder, op: str, mode: str, owner: str, call: Callable[[], Any]) -> Any:
            with r.span(op, name, mode, owner=owner):
                return call()

        assert holder(lambda: span(up_rec, "acquire", "u", me, up.acquire))
        assert reader(lambda: span(reader_rec, "acquire", "r", "r", b.rw_lock(name).read.acquire))

        def write() -> None:
            lock = c.rw_lock(name).write
            assert span(writer_rec, "acquire", "w", them, lambda: lock.acquire(timeout=LONG))
            span(writer_rec, "release", "w", them, lock.release)

        wrote = writer.start(write)
        wait_until(lambda: all(them in q for q in waiting_writers(masters, name)), "a writer")
        upgraded = holder.start(lambda: span(up_rec, "acquire", "w", me, up.upgrade))
        wait_until(lambda: all(me in q for q in waiting_writers(masters, name)), "the upgrade")
        reader(lambda: span(reader_rec, "release", "r", "r", b.rw_lock(name).read.release))
        assert upgraded.result(timeout=LONG) is True
        assert not wrote.done()  # the writer still waits
        holder(lambda: span(up_rec, "release", "w", me, up.downgrade))
        assert pending(wrote)  # still excluded by the upgradeable reader
        assert not gets(lambda: b.rw_lock(name).write)  # as is any other writer
        holder(lambda: span(up_rec, "release", "u", me, up.release))
        wrote.result(timeout=LONG)
    report = check(load(path))
    assert report.ok, report.format()
    modes = [(h.mode, h.owner == me) for h in report.holds]
    assert sorted(modes) == [("r", False), ("u", True), ("w", False), ("w", True)]


def test_a_timed_out_upgrade_leaves_an_upgradeable_reader_and_lets_readers_in(
    masters: list[str],
) -> None:
    with LockManager(masters, lease=LONG) as a, LockManager(masters, lease=LONG) as b:
        rw = a.rw_lock("slow")
        assert rw.upgradeable.acquire()
        reader = Other()
        assert reader(lambda: b.rw_lock("slow").read.acquire())
        # A reader that comes while the upgrade waits is held up, and let in after it.
        late = Other()
        came: list[bool] = []

        def late_reader() -> None:
            wait_until(lambda: all(waiting_writers(masters, "slow")), "the upgrade waiting")
            got = b.rw_lock("slow").read.acquire(timeout=LONG)
            came.append(got)
            b.rw_lock("slow").read.release()

        arrived = late.start(late_reader)
        assert rw.upgradeable.upgrade(timeout=1.0) is False
        assert rw.upgradeable.is_owned() and rw.upgradeable.hold_count == 1
        assert not rw.write.is_owned() and rw.write.hold_count == 0
        assert all(q == [] for q in waiting_writers(masters, "slow"))  # intent withdrawn
        arrived.result(timeout=LONG)
        assert came == [True]
        assert gets(lambda: b.rw_lock("slow").read)
        assert not gets(lambda: b.rw_lock("slow").write)
        reader(b.rw_lock("slow").read.release)
        assert rw.upgradeable.upgrade(timeout=LONG)
        rw.upgradeable.release()  # the last release ends the upgrade too
        assert not rw.write.is_owned()


def test_a_downgrade_lets_readers_in_and_wakes_them(masters: list[str]) -> None:
    with LockManager(masters, lease=LONG) as a, LockManager(masters, lease=LONG) as b:
        rw = a.rw_lock("down")
        assert rw.upgradeable.acquire()
        assert rw.upgradeable.upgrade(timeout=5)
        readers = [Other(), Other()]
        got = [r.start(lambda: b.rw_lock("down").read.acquire(timeout=LONG)) for r in readers]
        channel = aux_key("down", "rw:wake:r")
        wait_until(lambda: subscribed(masters, channel), "the readers wait")
        released = time.monotonic()
        rw.upgradeable.downgrade()
        assert all(g.result(timeout=LONG) is True for g in got)
        assert time.monotonic() - released < 10.0  # woken: the write hold's lease is 60 s
        assert rw.upgradeable.is_owned() and not rw.write.is_owned()
        assert not gets(lambda: b.rw_lock("down").write)
        for r in readers:
            r(b.rw_lock("down").read.release)
        rw.upgradeable.release()


def test_two_upgradeable_readers_never_both_hold_so_upgrades_never_deadlock(
    masters: list[str],
) -> None:
    with LockManager(masters, lease=LONG) as a, LockManager(masters, lease=LONG) as b:
        mine, theirs = a.rw_lock("two").upgradeable, b.rw_lock("two").upgradeable
        assert mine.acquire()
        other = Other()
        assert not other(lambda: theirs.acquire(blocking=False))
        second = other.start(lambda: (theirs.acquire(timeout=LONG), theirs.upgrade(timeout=LONG)))
        assert mine.upgrade(timeout=5)  # the other one waits holding nothing
        mine.downgrade()
        released = time.monotonic()
        mine.release()
        assert second.result(timeout=LONG) == (True, True)  # woken by that release
        assert time.monotonic() - released < 10.0
        other(theirs.release)


def test_the_last_release_frees_the_upgrade_also_where_the_upgradeable_read_was_refused(
    urls: list[str],
) -> None:
    # The race behind a flaky leak of test_two_upgradeable_readers_never_both_hold_...:
    # the previous holder's release reaches one master after the next holder's try,
    # which that master refuses (a quorum granted it elsewhere), but before its upgrade,
    # which that master then grants as a plain write hold. Here a manager of that master
    # alone stands for the previous holder, its release forced between the two.
    with LockManager(urls, lease=LONG) as mgr, LockManager(urls[-1:], lease=LONG) as last:
        up, before = mgr.rw_lock("late").upgradeable, last.rw_lock("late").upgradeable
        assert before.acquire(blocking=False)
        assert up.acquire(blocking=False)  # granted by the others: a quorum
        before.release()
        assert up.upgrade(timeout=5)  # granted by every master, the last one too
        up.release()  # the upgrade ends with it, on every master
        assert on_masters(urls, lambda r: r.exists(*rw_keys("late"))) == [0] * len(urls)


def test_the_holder_may_read_and_write_and_each_side_keeps_its_count(masters: list[str]) -> None:
    with LockManager(masters, lease=LONG) as a, LockManager(masters, lease=LONG) as b:
        rw = a.rw_lock("mixed")
        up = rw.upgradeable
        assert up.acquire()
        writer = Other()
        wrote = writer.start(lambda: b.rw_lock("mixed").write.acquire(timeout=LONG))
        wait_until(lambda: all(waiting_writers(masters, "mixed")), "the writer is waiting")
        # Inside already: a read is granted at once, although a writer waits.
        assert rw.read.acquire(blocking=False)
        # Taking the write lock is an upgrade, its own read hold no obstacle.
        assert rw.write.acquire(timeout=5)
        assert up.upgrade(timeout=5)  # re-enters the write lock
        assert (up.hold_count, rw.write.hold_count, rw.read.hold_count) == (1, 2, 1)
        up.downgrade()
        assert rw.write.hold_count == 1
        assert up.acquire()  # re-entry
        up.release()
        assert (up.hold_count, rw.write.hold_count) == (1, 1)
        up.release()  # the last one: the upgrade ends with it
        assert (up.hold_count, rw.write.hold_count, rw.read.hold_count) == (0, 0, 1)
        with pytest.raises(LockNotOwnedError):
            rw.write.release()
        with pytest.raises(LockNotOwnedError):
            up.downgrade()
        with pytest.raises(LockNotOwnedError):
            up.upgrade()
        assert pending(wrote) and not gets(lambda: b.rw_lock("mixed").write)  # it reads
        rw.read.release()
        assert wrote.result(timeout=LONG) is True
        writer(b.rw_lock("mixed").write.release)


def test_an_upgrade_of_a_fenced_lock_gets_a_larger_token(masters: list[str]) -> None:
    with LockManager(masters, fencing=True) as mgr:
        rw = mgr.rw_lock("fenced")
        with rw.write:
            before = rw.write.token
        with rw.upgradeable:
            with pytest.raises(FencingError):
                _ = rw.upgradeable.token  # it shares with readers: no token of its own
            assert rw.upgradeable.upgrade()
            first = rw.write.token
            rw.upgradeable.downgrade()
            assert rw.upgradeable.upgrade()
            second = rw.write.token
            rw.upgradeable.downgrade()
        with rw.write:
            after = rw.write.token
        assert before < first < second < after
    with LockManager(masters) as mgr, mgr.rw_lock("fenced", fencing=False).upgradeable as up:
        assert up.upgrade()
        with pytest.raises(FencingError):
            _ = mgr.rw_lock("fenced").write.token
    delete_everywhere(masters, aux_key("fenced", "rw:fence"))


# -- loss ----------------------------------------------------------------------------------


def test_a_lost_upgradeable_hold_is_reported(masters: list[str]) -> None:
    reported: list[Any] = []
    with LockManager(masters, lease=1.5, on_lost=reported.append) as mgr:
        rw = mgr.rw_lock("gone")
        up = rw.upgradeable
        assert up.acquire()
        assert up.upgrade()
        signal, write_signal = up.lost, rw.write.lost
        up.ensure_held()
        delete_everywhere(masters, *rw_keys("gone"))
        assert signal.wait(5) and write_signal.wait(5)  # the next renewal finds them gone
        with pytest.raises(LockLostError):
            up.ensure_held()
        with pytest.raises(LockLostError):
            up.upgrade()
        wait_until(lambda: len(reported) == 2, "both holds reported")
        assert {type(lock).__name__ for lock in reported} == {"UpgradeableReadLock", "WriteLock"}
        with pytest.raises(LockLostError):
            up.release()
        assert not rw.write.is_owned()  # the last release took the write hold along


#: a process that takes a side of ``rw_lock('crashed')`` and holds it until killed
HOLDER = """
import sys, time
from redreentrant import LockManager
with LockManager(sys.argv[1].split(','), lease=float(sys.argv[2])) as mgr:
    rw = mgr.rw_lock('crashed')
    side = sys.argv[3]
    (rw.read if side == 'read' else rw.upgradeable).acquire()
    if side == 'upgrade':
        rw.upgradeable.upgrade()
    print('held', flush=True)
    time.sleep(3600)
"""


def spawn_holder(masters: list[str], lease: float, side: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [PY, "-c", HOLDER, ",".join(masters), str(lease), side], stdout=subprocess.PIPE, text=True
    )
    assert read_line(proc) == "held\n"
    return proc


@pytest.mark.parametrize("side", ["upgradeable", "upgrade"])
def test_a_killed_upgradeable_holder_frees_the_lock_within_its_lease(
    masters: list[str], side: str
) -> None:
    lease = 1.0
    proc = spawn_holder(masters, lease, side)
    try:
        with LockManager(masters, lease=LONG) as mgr:
            writer = mgr.rw_lock("crashed").write
            assert writer.acquire(blocking=False) is False
            stop(proc)
            killed = time.monotonic()
            assert writer.acquire(timeout=LONG)
            assert time.monotonic() - killed <= lease + 5.0  # its lease, not LONG
            writer.release()
    finally:
        if proc.poll() is None:
            stop(proc)


def test_an_upgrade_waiting_for_a_killed_reader_goes_on_when_the_readers_lease_ends(
    masters: list[str],
) -> None:
    # A lease's end publishes nothing: the upgrade is told how long the other holds
    # have left, and tries again then (not a third of its own 60 s lease later).
    lease = 1.0
    proc = spawn_holder(masters, lease, "read")
    try:
        with LockManager(masters, lease=LONG) as mgr:
            up = mgr.rw_lock("crashed").upgradeable
            assert up.acquire()
            stop(proc)
            killed = time.monotonic()
            assert up.upgrade(timeout=LONG)
            assert time.monotonic() - killed <= lease + 5.0
            up.release()
    finally:
        if proc.poll() is None:
            stop(proc)


# -- mutual exclusion, on a history -------------------------------------------------------


def test_mutual_exclusion_holds_on_a_recorded_history(masters: list[str], tmp_path: Path) -> None:
    name = "hist"
    counters = {"w": 0, "u": 0}
    rounds = 6
    path = tmp_path / "history.jsonl"
    managers = [LockManager(masters, lease=5.0) for _ in range(2)]
    upgrades: list[bool] = []

    def incr(rec: Recorder, counter: str) -> None:
        # Not atomic: a second holder in the section would lose an update.
        seen = counters[counter]
        time.sleep(0.002)
        counters[counter] = seen + 1
        rec.ok("incr", counter, value=seen + 1)

    def held(rec: Recorder, lock: Any, mode: str, owner: str, **kw: Any) -> bool:
        with rec.span("acquire", name, mode, owner=owner) as out:
            got = bool(lock.acquire(**kw))
            if got:
                out.update(valid_until=int(lock.valid_until * 1e9))
            else:
                out.fail()
        return got

    def reader(rec: Recorder, mgr: LockManager) -> None:
        lock = mgr.rw_lock(name).read
        for _ in range(rounds * 2):
            if held(rec, lock, "r", mgr.owner_id()):
                time.sleep(0.003)
                with rec.span("release", name, "r", owner=mgr.owner_id()):
                    lock.release()

    def writer(rec: Recorder, mgr: LockManager) -> None:
        lock = mgr.rw_lock(name).write
        for _ in range(rounds):
            assert held(rec, lock, "w", mgr.owner_id(), timeout=30)
            incr(rec, "w")
            with rec.span("release", name, "w", owner=mgr.owner_id()):
                lock.release()

    def upgrader(rec: Recorder, mgr: LockManager) -> None:
        rw = mgr.rw_lock(name)
        me = mgr.owner_id()
        for i in range(rounds):
            assert held(rec, rw.upgradeable, "u", me, timeout=30)
            incr(rec, "u")
            if i % 2 == 0:
                with rec.span("acquire", name, "w", owner=me) as out:
                    ok = rw.upgradeable.upgrade(timeout=30)
                    out.update(valid_until=int(rw.write.valid_until * 1e9))
                upgrades.append(ok)
                incr(rec, "w")
                with rec.span("release", name, "w", owner=me):
                    rw.upgradeable.downgrade()
            with rec.span("release", name, "u", owner=me):
                rw.upgradeable.release()

    with Recorder(path, "p") as rec:
        roles = [reader, reader, writer, upgrader, upgrader]
        children = [(role, rec.child(f"t{i}"), managers[i % 2]) for i, role in enumerate(roles)]
        threads = in_threads(lambda role, *args: role(*args), children, timeout=120)
        for m in managers:
            m.close()
        assert not any(t.is_alive() for t in threads)
    expected = {"w": rounds + 2 * ((rounds + 1) // 2), "u": 2 * rounds}
    assert counters == expected and upgrades == [True] * (2 * ((rounds + 1) // 2))
    report = check(load(path), final_counter=counters)
    assert report.ok, report.format()


# -- asyncio ---------------------------------------------------------------------------------


async def gets_async(lock_of: Callable[[], Any]) -> bool:
    """Whether a new owner (another task) gets the lock at once (released again)."""

    async def go() -> bool:
        lock = lock_of()
        got = bool(await lock.acquire(blocking=False))
        if got:
            await lock.release()
        return got

    return await asyncio.ensure_future(go())


async def registered_as_writer(masters: list[str], name: str) -> None:
    """Return once every master has a waiting writer (or upgrade) of ``name``."""
    while not all(await asyncio.to_thread(waiting_writers, masters, name)):
        await asyncio.sleep(0.01)


def test_asyncio_shares_upgrades_when_woken_and_times_out(masters: list[str]) -> None:
    async def main() -> None:
        async with (
            aio.LockManager(masters, lease=LONG) as a,
            aio.LockManager(masters, lease=LONG) as b,
        ):
            rw = a.rw_lock("aio")
            up = rw.upgradeable
            assert isinstance(up, aio.UpgradeableReadLock)
            reader_in, reader_go = asyncio.Event(), asyncio.Event()

            async def reader() -> None:
                async with b.rw_lock("aio").read:
                    reader_in.set()
                    await reader_go.wait()

            assert await up.acquire()
            task = asyncio.ensure_future(reader())
            await reader_in.wait()  # it shares with the reader
            assert not await gets_async(lambda: b.rw_lock("aio").upgradeable)
            assert not await gets_async(lambda: b.rw_lock("aio").write)
            assert await up.upgrade(timeout=0.5) is False  # the reader stays
            assert up.is_owned() and not rw.write.is_owned()
            assert await gets_async(lambda: b.rw_lock("aio").read)  # readers enter again

            released: list[float] = []

            async def let_go() -> None:
                await registered_as_writer(masters, "aio")  # the upgrade waits
                channel = aux_key("aio", "rw:wake:u")
                while not await asyncio.to_thread(subscribed, masters, channel):
                    await asyncio.sleep(0.01)
                assert not await gets_async(lambda: b.rw_lock("aio").read)
                released.append(time.monotonic())
                reader_go.set()

            helper = asyncio.ensure_future(let_go())
            assert await up.upgrade(timeout=LONG) is True
            assert time.monotonic() - released[0] < 10.0  # woken, not by a periodic retry
            await helper
            await task
            assert rw.write.hold_count == 1
            assert not await gets_async(lambda: b.rw_lock("aio").read)
            await up.downgrade()
            assert await gets_async(lambda: b.rw_lock("aio").read)
            assert not await gets_async(lambda: b.rw_lock("aio").write)
            await up.release()
            assert await gets_async(lambda: b.rw_lock("aio").write)

    run(main())


def test_asyncio_a_cancelled_upgrade_leaves_an_upgradeable_reader(masters: list[str]) -> None:
    async def main() -> None:
        async with (
            aio.LockManager(masters, lease=LONG) as a,
            aio.LockManager(masters, lease=LONG) as b,
        ):
            up = a.rw_lock("cancel").upgradeable
            go, reading, cancelled = asyncio.Event(), asyncio.Event(), asyncio.Event()

            async def reader() -> None:
                async with b.rw_lock("cancel").read:
                    reading.set()
                    await go.wait()

            async def holder() -> list[str]:
                seen = []
                async with up:
                    try:
                        await up.upgrade()
                    except asyncio.CancelledError:
                        seen.append("cancelled")
                        uncancel = getattr(asyncio.current_task(), "uncancel", None)
                        if uncancel is not None:  # Python 3.11+: this task goes on
                            uncancel()
                        cancelled.set()
                    if up.is_owned() and not a.rw_lock("cancel").write.is_owned():
                        seen.append("still upgradeable")
                    if all(q == [] for q in waiting_writers(masters, "cancel")):
                        seen.append("intent withdrawn")
                    if await gets_async(lambda: b.rw_lock("cancel").read):
                        seen.append("readers enter")
                    go.set()
                    async with a.rw_lock("cancel").read:  # the holder may read, and
                        if await up.upgrade(timeout=5):  # upgrade: its read no obstacle
                            seen.append("upgraded")
                if not a.rw_lock("cancel").write.is_owned():
                    seen.append("ended with the last release")
                return seen

            task = asyncio.ensure_future(reader())
            await reading.wait()
            held = asyncio.ensure_future(holder())
            await registered_as_writer(masters, "cancel")
            # Again until it is seen: on Python 3.11 a cancellation that comes as an
            # inner wait ends can be lost (asyncio.wait_for).
            while not cancelled.is_set() and not held.done():
                held.cancel()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(cancelled.wait(), 0.5)
            assert await held == [
                "cancelled",
                "still upgradeable",
                "intent withdrawn",
                "readers enter",
                "upgraded",
                "ended with the last release",
            ]
            await task

    run(main())


def test_asyncio_excludes_on_a_recorded_history(masters: list[str], tmp_path: Path) -> None:
    name = "aio-hist"
    path = tmp_path / "history.jsonl"
    counter = {"w": 0}

    async def main(rec: Recorder) -> None:
        async with aio.LockManager(masters, lease=5.0) as a, aio.LockManager(masters) as b:

            async def span(r: Recorder, op: str, mode: str, owner: str, call: Any) -> Any:
                with r.span(op, name, mode, owner=owner):
                    return await call

            async def upgrader(r: Recorder, mgr: aio.LockManager) -> None:
                for _ in range(4):
                    rw = mgr.rw_lock(name)
                    me = mgr.owner_id()
                    await span(r, "acquire", "u", me, rw.upgradeable.acquire())
                    assert await span(r, "acquire", "w", me, rw.upgradeable.upgrade())
                    seen = counter["w"]
                    await asyncio.sleep(0.002)
                    counter["w"] = seen + 1
                    r.ok("incr", "w", value=seen + 1)
                    # The last release of "u" ends the write phase too, in the same call.
                    r.record("release", "invoke", name, "w", owner=me)
                    await span(r, "release", "u", me, rw.upgradeable.release())

            async def reader(r: Recorder, mgr: aio.LockManager) -> None:
                for _ in range(8):
                    rw = mgr.rw_lock(name)
                    me = mgr.owner_id()
                    await span(r, "acquire", "r", me, rw.read.acquire())
                    await asyncio.sleep(0.003)
                    await span(r, "release", "r", me, rw.read.release())

            async def writer(r: Recorder, mgr: aio.LockManager) -> None:
                for _ in range(4):
                    rw = mgr.rw_lock(name)
                    me = mgr.owner_id()
                    await span(r, "acquire", "w", me, rw.write.acquire())
                    seen = counter["w"]
                    await asyncio.sleep(0.002)
                    counter["w"] = seen + 1
                    r.ok("incr", "w", value=seen + 1)
                    await span(r, "release", "w", me, rw.write.release())

            await asyncio.gather(
                upgrader(rec.child("u1"), a),
                upgrader(rec.child("u2"), b),
                reader(rec.child("r1"), a),
                reader(rec.child("r2"), b),
                writer(rec.child("w1"), b),
            )

    with Recorder(path, "aio") as rec:
        run(main(rec))
    assert counter["w"] == 12
    report = check(load(path), final_counter=counter)
    assert report.ok, report.format()
    # On a loaded machine a write hold may be left on a minority of the masters after
    # the managers closed (an open defect: a late call of the holder reached a master
    # after its release). It must lapse within its lease (5 s), as documented for
    # holds a release could not remove.
    clients = [redis.Redis.from_url(url) for url in masters]
    try:
        wait_until(
            lambda: not any(c.keys(f"*{{{name}}}*") for c in clients), "leftovers lapsed", 10
        )
    finally:
        for c in clients:
            c.close()


# -- the history checker knows the upgradeable mode (no server) -----------------------------


def history(*rows: tuple[int, str, str, str, str]) -> list[Event]:
    """Events from ``(t, client, op, phase, mode)`` rows, lock "L", owner = client."""
    return [Event(client=c, op=op, phase=ph, t=t, lock="L", mode=m) for t, c, op, ph, m in rows]


def held_rows(t0: int, t1: int, client: str, mode: str) -> list[tuple[int, str, str, str, str]]:
    return [
        (t0, client, "acquire", "invoke", mode),
        (t0 + 1, client, "acquire", "ok", mode),
        (t1, client, "release", "invoke", mode),
        (t1 + 1, client, "release", "ok", mode),
    ]


def test_the_checker_lets_readers_share_with_an_upgrade_and_its_write_phase_follow() -> None:
    rows = held_rows(0, 100, "U", "u") + held_rows(10, 40, "R", "r") + held_rows(60, 80, "U", "w")
    rows += held_rows(110, 120, "W", "w") + held_rows(130, 140, "V", "u")
    report = check(history(*sorted(rows)))
    assert report.ok, report.format()


@pytest.mark.parametrize(
    ("rows", "kind"),
    [
        # two upgradeable readers at once
        (held_rows(0, 50, "U", "u") + held_rows(20, 70, "V", "u"), "overlap"),
        # a writer while an upgradeable reader holds
        (held_rows(0, 50, "U", "u") + held_rows(20, 30, "W", "w"), "reader-writer"),
        # an upgrade's write phase with a reader still inside
        (
            held_rows(0, 100, "U", "u") + held_rows(10, 70, "R", "r") + held_rows(60, 80, "U", "w"),
            "reader-writer",
        ),
        # a writer between the upgrade's wait and its grant
        (
            [
                *held_rows(0, 100, "U", "u"),
                (20, "U", "acquire", "invoke", "w"),
                (30, "W", "acquire", "ok", "w"),
                (35, "W", "release", "invoke", "w"),
                (50, "U", "acquire", "ok", "w"),
                (60, "U", "release", "invoke", "w"),
            ],
            "upgrade-gap",
        ),
    ],
)
def test_the_checker_catches_what_the_upgradeable_mode_forbids(
    rows: list[tuple[int, str, str, str, str]], kind: str
) -> None:
    report = check(history(*sorted(rows)))
    assert kind in report.kinds(), report.format()


def test_the_checker_catches_an_upgrade_granted_after_its_upgradeable_hold_ended() -> None:
    events = [
        Event("U", "acquire", "invoke", 0, "L", "u"),
        Event("U", "acquire", "ok", 1, "L", "u", valid_until=30),
        Event("U", "acquire", "invoke", 10, "L", "w"),
        Event("U", "acquire", "ok", 50, "L", "w"),  # after the validity of its "u" hold
        Event("U", "release", "invoke", 60, "L", "w"),
        Event("U", "release", "invoke", 70, "L", "u"),
    ]
    assert "upgrade-gap" in check(events).kinds()
