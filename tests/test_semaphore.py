"""The semaphore against real masters: at most P holders, permits owned, reentrant,
renewed and lost like locks, waiters woken by releases; and the per-master counting
semaphore that a quorum makes unsound, failing where this one holds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import CLI, PY, clean_env, in_threads, lock_keys, on_masters, run, run_cli, wait_until

import redreentrant.asyncio as ra
from redreentrant import LockLostError, LockManager, LockNotOwnedError, Semaphore
from redreentrant._core.keys import aux_key
from redreentrant.testing import LocalEnsemble


class Gauge:
    """How many holders are inside at once: the most ever seen, and how many entered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.inside = 0
        self.most = 0
        self.entered = 0

    def enter(self) -> None:
        with self._lock:
            self.inside += 1
            self.entered += 1
            self.most = max(self.most, self.inside)

    def leave(self) -> None:
        with self._lock:
            self.inside -= 1


@pytest.mark.parametrize("permits", [1, 3])
def test_at_most_p_threads_hold_a_permit_and_p_do(masters: list[str], permits: int) -> None:
    gauge = Gauge()
    # Each thread a manager of its own: every holder is another client.
    managers = [LockManager(masters, lease=5.0) for _ in range(6)]
    try:

        def work(m: LockManager) -> None:
            for _ in range(4):
                with m.semaphore("api", permits=permits):
                    gauge.enter()
                    time.sleep(0.03)
                    gauge.leave()

        in_threads(work, [(m,) for m in managers])
        assert gauge.entered == 24
        assert gauge.most == permits  # never more, and as many as allowed
    finally:
        for m in managers:
            m.close()


@pytest.mark.parametrize("shared", [True, False], ids=["one-manager", "manager-per-thread"])
def test_waiters_are_served_in_turn(ensemble: LocalEnsemble, shared: bool) -> None:
    """16 threads on 5 masters contend for P = 1, each coming straight back after its
    release: the thread that gets the fewest permits gets at least half the mean (a
    free slot is kept for the waiter woken, so the releasing thread queues behind it)."""
    managers = [LockManager(ensemble.urls, lease=5.0) for _ in range(1 if shared else 16)]
    counts = [0] * 16
    counter = {"n": 0}
    stop = time.monotonic() + 3.0

    def work(i: int) -> None:
        sem = managers[0 if shared else i].semaphore("turns", permits=1)
        while time.monotonic() < stop:
            if sem.acquire(timeout=max(0.01, stop - time.monotonic())):
                try:
                    n = counter["n"]
                    time.sleep(0.001)  # a non-atomic increment: read, pause, write
                    counter["n"] = n + 1
                    counts[i] += 1
                finally:
                    sem.release()

    try:
        in_threads(work, [(i,) for i in range(16)], timeout=30)
    finally:
        for m in managers:
            m.close()
    mean = sum(counts) / len(counts)
    assert counter["n"] == sum(counts) > 16
    assert min(counts) >= mean / 2, sorted(counts)


def test_asyncio_tasks_share_p_permits(masters: list[str]) -> None:
    async def main() -> int:
        inside = most = 0
        async with ra.LockManager(masters, lease=5.0) as m:

            async def work() -> None:
                nonlocal inside, most
                for _ in range(3):
                    async with m.semaphore("api", permits=2):
                        inside += 1
                        most = max(most, inside)
                        await asyncio.sleep(0.02)
                        inside -= 1

            await asyncio.gather(*(work() for _ in range(5)))
        return most

    assert run(main()) == 2


def test_a_permit_is_owned_reentrant_and_counted_once(mgr: LockManager) -> None:
    sem = mgr.semaphore("owned", permits=2)
    assert sem.permits == 2 and sem.available() == 2
    with sem, sem:
        assert sem.hold_count == 2 and sem.is_owned()
        assert sem.available() == 1  # one owner, one permit, however deep
        assert list(sem.holders()) == [mgr.owner_id()]
        info = sem.holders()[mgr.owner_id()]
        assert info is not None and info.kind == "thread"
        errors: list[BaseException] = []

        def other() -> None:
            try:
                sem.release()
            except BaseException as error:  # reported below
                errors.append(error)

        in_threads(other, timeout=None)
        assert len(errors) == 1 and isinstance(errors[0], LockNotOwnedError)
    assert sem.available() == 2 and not sem.is_owned()


def test_a_full_semaphore_refuses_and_a_release_wakes_a_waiter(masters: list[str]) -> None:
    with LockManager(masters, lease=30.0) as a, LockManager(masters, lease=30.0) as b:
        held = [a.semaphore("full", permits=2) for _ in range(2)]
        taken = threading.Event()
        got: list[float] = []

        def holder(sem: Semaphore) -> None:
            with sem:
                taken.set()
                time.sleep(0.5)

        # Two owners (threads of a) take both permits.
        holders = [threading.Thread(target=holder, args=(s,)) for s in held]
        for t in holders:
            t.start()
        wait_until(lambda: b.semaphore("full", permits=2).available() == 0, "both taken")
        sem = b.semaphore("full", permits=2)
        assert sem.locked()
        assert not sem.acquire(blocking=False)
        started = time.monotonic()
        assert sem.acquire(timeout=20)
        got.append(time.monotonic() - started)
        sem.release()
        for t in holders:
            t.join()
    # Woken by the first release (about 0.5 s), not by a lease (30 s) or a poll.
    assert got[0] < 10


def test_a_waiter_that_gives_up_passes_its_wake_up_on(ensemble: LocalEnsemble) -> None:
    urls = ensemble.urls[:3]
    with (
        LockManager(urls, lease=30.0) as a,
        LockManager(urls, lease=30.0) as b,
        LockManager(urls, lease=30.0) as c,
    ):
        first = a.semaphore("pass", permits=1)
        assert first.acquire()
        outcome: dict[str, object] = {}

        def wait(name: str, m: LockManager, timeout: float) -> None:
            started = time.monotonic()
            sem = m.semaphore("pass", permits=1)
            outcome[name] = sem.acquire(timeout=timeout)
            outcome[name + "-after"] = time.monotonic() - started
            if outcome[name]:
                sem.release()

        quitter = threading.Thread(target=wait, args=("b", b, 1.0))
        quitter.start()
        wait_until(lambda: _registered(urls, "pass") == 1, "b registered")
        patient = threading.Thread(target=wait, args=("c", c, 20.0))
        patient.start()
        wait_until(lambda: _registered(urls, "pass") == 2, "c registered")
        first.release()  # wakes b, which may be just giving up
        quitter.join()
        patient.join()
    assert outcome["c"] is True
    assert outcome["c-after"] < 10  # woken, not left to its registration's end


def _registered(urls: list[str], name: str) -> int:
    return min(on_masters(urls, lambda r: r.zcard(aux_key(name, "sem:waiters"))))


def test_the_watchdog_renews_a_permit_and_a_fixed_lease_ends(masters: list[str]) -> None:
    with LockManager(masters, lease=1.0) as m:
        sem = m.semaphore("renewed", permits=1)
        with sem:
            time.sleep(2.5)  # more than two leases
            sem.ensure_held()
            assert m.semaphore("renewed", permits=1).available() == 0
        assert sem.acquire(lease=0.5)
        wait_until(lambda: m.semaphore("renewed", permits=1).available() == 1, "the lease ended")
        with pytest.raises(LockLostError):
            sem.release()


def test_a_permit_whose_slot_vanished_is_reported_lost(ensemble: LocalEnsemble) -> None:
    urls = ensemble.urls[:3]
    lost: list[object] = []
    with LockManager(urls, lease=1.0, on_lost=lost.append) as m:
        sem = m.semaphore("vanish", permits=3)
        sem.acquire()
        signal = sem.lost
        for url in urls[:2]:  # a quorum forgets every slot
            with redis.Redis.from_url(url) as r:
                for key in r.keys(aux_key("vanish", "sem:*")):
                    r.delete(key)
        assert signal.wait(5)
        wait_until(lambda: lost, "on_lost called")
        assert isinstance(lost[0], Semaphore) and lost[0].permits == 3
        with pytest.raises(LockLostError):
            sem.release()
    ensemble.flushall()


def test_inspect_shows_a_semaphores_holders_and_waiters(ensemble: LocalEnsemble) -> None:
    urls = ensemble.urls[:3]
    with LockManager(urls, lease=30.0) as a, LockManager(urls, lease=30.0) as b:
        held = a.semaphore("seen", permits=1)
        held.acquire()
        got: list[bool] = []

        def wait_then_release() -> None:
            sem = b.semaphore("seen", permits=1)
            got.append(sem.acquire(timeout=5))
            if got[0]:
                sem.release()

        waiting = threading.Thread(target=wait_then_release)
        waiting.start()
        wait_until(lambda: _registered(urls, "seen") == 1, "a waiter registered")
        views = a.inspect("seen")
        for view in views:
            [lock] = view.locks
            assert lock.kind == "semaphore" and list(lock.holders) == [a.owner_id()]
            assert lock.slots == {a.owner_id(): 0} and len(lock.queue) == 1
        held.release()
        waiting.join()
        assert got == [True]
    wait_until(lambda: not any(lock_keys(ensemble).values()), "freed everywhere")


def test_clients_with_another_number_of_permits_use_their_own_slots(mgr: LockManager) -> None:
    # The rule when permits differ: each client takes slots below its own number, and
    # a hold keeps its slot. So while both are in use, up to the larger number hold.
    big = [mgr.semaphore("resized", permits=3) for _ in range(3)]
    small = mgr.semaphore("resized", permits=2)
    done = threading.Event()

    def hold(sem: Semaphore) -> None:
        with sem:
            done.wait(10)

    threads = [threading.Thread(target=hold, args=(s,)) for s in big]
    for t in threads:
        t.start()
    wait_until(lambda: mgr.semaphore("resized", permits=3).available() == 0, "three held")
    assert small.available() == 0 and not small.acquire(blocking=False)
    done.set()
    for t in threads:
        t.join()
    assert small.available() == 2


def test_permits_must_be_a_positive_int(mgr: LockManager) -> None:
    for bad in (0, -1, 1025):
        with pytest.raises(ValueError, match="permits"):
            mgr.semaphore("x", permits=bad)
    for wrong in (1.5, True, "2"):
        with pytest.raises(TypeError, match="permits"):
            mgr.semaphore("x", permits=wrong)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no fencing counter"):
        mgr.semaphore("x", permits=2).raise_fence(10)


# -- the naive semaphore, and ours, with masters frozen in turn -------------------------

# A per-master counting semaphore: each master takes up to P holders into a set, and a
# holder is whoever a quorum took. A try is taken back (in order, on the same
# connection) on every master that did not take it in time. It looks right on one
# master; over a quorum it is not.
NAIVE_TAKE = """
if redis.call('sismember', KEYS[1], ARGV[2]) == 1 then return 1 end
if redis.call('scard', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('sadd', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


class Naive:
    def __init__(self, urls: list[str], permits: int) -> None:
        self.permits = permits
        self.conns = [_connection(u) for u in urls]
        for conn in self.conns:
            conn.connect()  # now: a connection's handshake would wait on a frozen master
        self.owed = [0] * len(urls)

    def _catch_up(self, i: int) -> None:
        while self.owed[i]:
            if not self.conns[i].can_read(timeout=1.0):  # what it was sent was lost
                self.conns[i].disconnect()
                self.conns[i].connect()
                self.owed[i] = 0
                return
            self.conns[i].read_response()
            self.owed[i] -= 1

    def acquire(self, who: str) -> bool:
        for i, conn in enumerate(self.conns):
            self._catch_up(i)
            conn.send_command("EVAL", NAIVE_TAKE, 1, "naive:holders", self.permits, who)
        took = []
        for i, conn in enumerate(self.conns):
            if conn.can_read(timeout=0.3):
                took.append(conn.read_response() == 1)
            else:  # no answer in time: its reply is read later
                self.owed[i] += 1
                took.append(False)
        held = sum(took) >= len(self.conns) // 2 + 1
        for i, conn in enumerate(self.conns):
            if not (held and took[i]):
                conn.send_command("SREM", "naive:holders", who)
                self.owed[i] += 1
        return held

    def close(self) -> None:
        for i, conn in enumerate(self.conns):
            self._catch_up(i)
            conn.send_command("DEL", "naive:holders")
            conn.read_response()
            conn.disconnect()


def _connection(url: str) -> redis.Connection:
    kwargs = redis.connection.parse_url(url)
    return redis.Connection(host=kwargs["host"], port=kwargs["port"], db=kwargs.get("db", 0))


@pytest.mark.parametrize("fault", ["frozen", "cut off"])
def test_the_naive_semaphore_lets_three_hold_two_permits_and_ours_does_not(
    ensemble: LocalEnsemble, fault: str
) -> None:
    """Holders X (on masters A and B), Y (B, C) and Z (A, C) of a 2-permit semaphore
    over 3 masters, each taken while the third master is frozen (SIGSTOP: it runs what
    it was sent when it resumes) or cut off (what it is sent is lost): every master
    counts two holders, yet three hold. Ours refuses Z: no slot is free on both A and C
    (or, frozen, the late tries filled the masters)."""
    from redreentrant.testing.proxy import TcpProxy

    servers = [ensemble[0], ensemble[1], ensemble[2]]
    with contextlib.ExitStack() as stack:
        if fault == "frozen":
            urls = ensemble.urls[:3]
            stop, go = [s.pause for s in servers], [s.resume for s in servers]
        else:
            proxies = [stack.enter_context(TcpProxy(s.port)) for s in servers]
            urls = [p.url() for p in proxies]
            stop, go = [p.blackhole for p in proxies], [p.pass_through for p in proxies]

        def without(i: int, act: Any) -> Any:
            stop[i]()
            try:
                return act()
            finally:
                go[i]()

        naive = Naive(urls, 2)
        try:
            took = [
                without(2, lambda: naive.acquire("X")),  # X on A, B
                without(0, lambda: naive.acquire("Y")),  # Y on B, C
                without(1, lambda: naive.acquire("Z")),  # Z on A, C
            ]
            assert took == [True, True, True]  # three holders of two permits
        finally:
            naive.close()

        managers = [LockManager(urls, lease=30.0, master_timeout=0.3) for _ in range(3)]
        try:
            sems = [m.semaphore("xyz", permits=2) for m in managers]
            x = without(2, lambda: sems[0].acquire(timeout=5))
            y = without(0, lambda: sems[1].acquire(timeout=10))
            z = without(1, lambda: sems[2].acquire(timeout=3))
            assert (x, y, z) == (True, True, False)
            # Every master answers again: still only the two permits can be held.
            assert not sems[2].acquire(timeout=2)
            sems[0].release()
            assert sems[2].acquire(timeout=10)
            sems[1].release()
            sems[2].release()
        finally:
            for m in managers:
                m.close()
    wait_until(lambda: not any(lock_keys(ensemble).values()), "freed everywhere")


# -- the command line ---------------------------------------------------------------------


def test_run_with_permits_runs_at_most_p_commands_at_once(
    ensemble: LocalEnsemble, tmp_path: Path
) -> None:
    urls = ensemble.urls[:3]
    log = tmp_path / "log"
    # Each command notes its start and end; four run, two permits.
    script = (
        f"import time; f = open({str(log)!r}, 'a'); f.write('+\\n'); f.flush(); "
        "time.sleep(0.6); f.write('-\\n'); f.close()"
    )
    runs = [
        subprocess.Popen(
            [*CLI, "run", "--permits", "2", "batch", "--", PY, "-c", script],
            env=clean_env(REDREENTRANT_MASTERS=",".join(urls)),
            stdin=subprocess.DEVNULL,
        )
        for _ in range(4)
    ]
    assert [r.wait(60) for r in runs] == [0, 0, 0, 0]
    inside = most = 0
    for line in log.read_text().split():
        inside += 1 if line == "+" else -1
        most = max(most, inside)
    assert most == 2
    bad = run_cli("run", "--permits", "0", "batch", "--", "true", masters=urls)
    assert bad.returncode == 2 and "permits" in bad.stderr


def test_inspect_and_top_show_a_semaphores_holders_and_waiters(ensemble: LocalEnsemble) -> None:
    urls = ensemble.urls[:3]
    with LockManager(urls, lease=30.0) as a, LockManager(urls, lease=30.0) as b:
        held = a.semaphore("gate", permits=1)
        held.acquire()
        waiter: list[str] = []

        def wait() -> None:
            waiter.append(b.owner_id())
            with b.semaphore("gate", permits=1):
                pass

        waiting = threading.Thread(target=wait)
        waiting.start()
        wait_until(lambda: _registered(urls, "gate") == 1, "a waiter registered")
        document = json.loads(run_cli("inspect", "--json", "gate", masters=urls).stdout)
        for view in document["masters"]:
            [lock] = view["locks"]
            assert lock["kind"] == "semaphore" and lock["slots"] == {a.owner_id(): 0}
            assert list(lock["holders"]) == [a.owner_id()] and lock["queue"] == waiter
        assert document["state"] == "held"
        top = json.loads(run_cli("top", "--json", "gate", masters=urls).stdout)
        [row] = top["locks"]
        assert row["kind"] == "semaphore" and row["state"] == "held"
        assert [h["owner"] for h in row["holders"]] == [a.owner_id()]
        assert [w["owner"] for w in row["waiters"]] == waiter
        held.release()
        waiting.join()
    wait_until(lambda: not any(lock_keys(ensemble).values()), "freed everywhere")
