"""Faults: masters down or frozen, holders killed, leases lost, scripts flushed, forks."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from helpers import WORKERS, cluster_port, delete_everywhere, lock_keys, on_masters, wait_until

from redreentrant import (
    LockLostError,
    LockManager,
    LockNotOwnedError,
    QuorumUnavailableError,
)
from redreentrant._core.keys import PREFIX, lock_key
from redreentrant.testing import LocalEnsemble, LocalServer

#: every test here meets real masters (some start a server of their own)
pytestmark = pytest.mark.integration

# -- quorum -------------------------------------------------------------------------


def test_two_of_five_masters_down_still_lock(ensemble: LocalEnsemble) -> None:
    ensemble[1].kill()
    ensemble[4].kill()
    with LockManager(ensemble.urls) as mgr, mgr.lock("two-down") as lock:
        assert lock.is_owned() and lock.locked()
        assert len(lock_keys(ensemble)) == 3
    assert lock_keys(ensemble) == {}


def test_two_of_five_masters_frozen_cost_one_master_timeout(ensemble: LocalEnsemble) -> None:
    ensemble[0].pause()
    ensemble[2].pause()
    with LockManager(ensemble.urls, lease=30.0, master_timeout=2.0) as mgr:
        started = time.monotonic()
        assert mgr.lock("frozen").acquire(blocking=False)
        # One round: the frozen masters are waited for once (2 s), not once each (4 s).
        assert time.monotonic() - started < 2.0 * 1.75
        mgr.lock("frozen").release()
        # Thawed while the manager is open: they run the queued calls, the release last.
        # (A manager closed first leaves them to the server's reading: see
        # docs/safety.md, "Late answers and stray grants".)
        for i in (0, 2):
            ensemble[i].resume()
        wait_until(lambda: not lock_keys(ensemble), "the frozen masters released")


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_three_of_five_down_fails_in_time_and_leaves_no_keys(
    ensemble: LocalEnsemble, fault: str
) -> None:
    for i in (0, 2, 4):
        getattr(ensemble[i], fault)()
    with LockManager(ensemble.urls, master_timeout=0.1) as mgr:
        started = time.monotonic()
        with pytest.raises(QuorumUnavailableError) as raised:
            mgr.lock("three-down").acquire(timeout=3)
        assert time.monotonic() - started < 3
        assert len(raised.value.errors) == 3
        assert set(raised.value.errors) == {mgr.masters[i] for i in (0, 2, 4)}
        with pytest.raises(QuorumUnavailableError):
            mgr.lock("three-down").acquire(blocking=False)
        if fault == "pause":  # thawed while the manager is open: the undos run
            for i in (0, 2, 4):
                ensemble[i].resume()
            wait_until(lambda: not lock_keys(ensemble), "the thawed masters undone")
    assert lock_keys(ensemble) == {}  # the survivors granted, and were undone


def test_a_restarted_master_loses_one_vote_not_the_lock(ensemble: LocalEnsemble) -> None:
    with LockManager(ensemble.urls) as mgr, mgr.lock("restart") as lock:
        ensemble[3].restart()  # its copy of the lock is gone
        with lock:
            assert lock.hold_count == 2
        assert lock.is_owned()
    assert lock_keys(ensemble) == {}


def test_scripts_flushed_from_the_masters_are_loaded_again(ensemble: LocalEnsemble) -> None:
    with LockManager(ensemble.urls) as mgr:
        with mgr.lock("noscript"):
            pass
        on_masters(ensemble.urls, lambda r: r.script_flush())
        with mgr.lock("noscript") as lock:
            assert lock.is_owned()


def test_a_split_vote_is_undone_also_on_masters_that_lost_their_scripts(
    ensemble: LocalEnsemble,
) -> None:
    # A split: another owner holds masters 2 to 4, so a try wins 0 and 1 only and must
    # undo them. Masters that forgot the scripts (a restart, SCRIPT FLUSH) answer the
    # undo with NOSCRIPT: the undo must be made again there, not dropped, or the try's
    # grants would stay for a whole lease and keep every later try split.
    with LockManager(ensemble.urls) as mgr:
        with mgr.lock("warm"):  # every script loaded on every master...
            pass
        key = lock_key("split")
        for i, server in enumerate(ensemble.servers):
            with redis.Redis.from_url(server.url) as r:
                r.script_flush()  # ...and forgotten
                if i >= 2:
                    r.hset(key, "someone:else", 1)
                    r.pexpire(key, 30_000)
        lock = mgr.lock("split")
        assert not lock.acquire(blocking=False)
        # The split's grant was left on no master.
        assert on_masters(ensemble.urls[:2], lambda r: r.exists(key)) == [0, 0]
        delete_everywhere(ensemble.urls[2:], key)


def test_a_restarted_master_knows_every_script_it_was_sent(ensemble: LocalEnsemble) -> None:
    # Calls whose replies a round does not read (a release decided without that master)
    # must not meet NOSCRIPT: a connection loads each script before its first call of it.
    from redreentrant._core.scripts import ACQUIRE, RELEASE

    with LockManager(ensemble.urls) as mgr:
        with mgr.lock("known"):
            pass
        ensemble[0].restart()
        for _ in range(3):  # the first round may meet the old, closed connection
            try:
                with mgr.lock("known"):
                    pass
                break
            except QuorumUnavailableError:
                continue
        with mgr.lock("known"):  # every master, on a connection made since the restart
            pass
        with redis.Redis.from_url(ensemble[0].url) as r:
            assert all(r.script_exists(ACQUIRE.sha, RELEASE.sha))
            assert not r.exists(lock_key("known"))  # its release ran there too


# -- the watchdog and lost leases ----------------------------------------------------


def test_watchdog_keeps_a_one_second_lease_alive_for_five_seconds(urls: list[str]) -> None:
    with LockManager(urls, lease=1.0) as mgr, LockManager(urls) as rival:
        lock = mgr.lock("kept")
        lock.acquire()
        end = time.monotonic() + 5
        while time.monotonic() < end:
            assert rival.lock("kept").acquire(blocking=False) is False
            assert lock.is_owned() and 0 < lock.remaining() <= 1.0
            time.sleep(0.25)
        lock.release()
        assert rival.lock("kept").acquire(blocking=False)
        rival.lock("kept").release()


def test_a_fixed_lease_is_not_renewed_and_its_late_release_reports_the_loss(
    urls: list[str],
) -> None:
    with LockManager(urls, lease=1.0) as mgr, LockManager(urls) as rival:
        lock = mgr.lock("fixed")
        assert lock.acquire(lease=0.5)
        time.sleep(0.8)
        assert not lock.is_owned()
        assert rival.lock("fixed").acquire(blocking=False)
        with pytest.raises(LockLostError):
            lock.release()
        assert lock.hold_count == 0
        rival.lock("fixed").release()


def test_a_holder_killed_with_sigkill_frees_the_lock_within_its_lease(urls: list[str]) -> None:
    lease = 1.0
    holder = subprocess.Popen(
        [sys.executable, str(WORKERS), "hold", ",".join(urls), "crash", str(lease)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "waiting"
        assert holder.stdout.readline().strip() == "held"
        with LockManager(urls) as mgr:
            lock = mgr.lock("crash")
            assert lock.acquire(blocking=False) is False
            holder.send_signal(signal.SIGKILL)
            holder.wait()
            killed = time.monotonic()
            drift = lease * 0.01 + 0.002
            # The watchdog renewed at most lease/3 before the kill, so the lock must be
            # free within one lease (plus drift and one master round) from the kill.
            assert lock.acquire(timeout=lease + drift + 0.5)
            assert time.monotonic() - killed <= lease + drift + 0.5
            lock.release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_a_lease_deleted_under_its_owner_is_reported(
    ensemble: LocalEnsemble,
) -> None:
    lost: list[object] = []
    seen = threading.Event()

    def on_lost(lock: object) -> None:
        lost.append(lock)
        seen.set()

    with LockManager(ensemble.urls, lease=1.0, on_lost=on_lost) as mgr:
        lock = mgr.lock("deleted")
        lock.acquire()
        delete_everywhere(ensemble.urls, lock_key("deleted"))
        assert seen.wait(timeout=3), "on_lost was not called"
        assert getattr(lost[0], "name", None) == "deleted"
        assert not lock.is_owned()
        with pytest.raises(LockLostError):
            lock.acquire()  # re-entry of a lost lock
        with pytest.raises(LockLostError):
            lock.release()
        assert lock.hold_count == 0


def test_with_blocks_unwind_a_lost_lock_with_one_lock_lost_error(
    ensemble: LocalEnsemble,
) -> None:
    seen = threading.Event()
    with LockManager(ensemble.urls, lease=1.0, on_lost=lambda _: seen.set()) as mgr:
        lock = mgr.lock("unwind")
        with pytest.raises(LockLostError) as raised, lock, lock:
            delete_everywhere(ensemble.urls, lock_key("unwind"))
            assert seen.wait(timeout=3)
        assert raised.value.__context__ is None  # not masked by a second error
        assert lock.hold_count == 0


def test_loss_by_unreachable_masters_is_reported_before_validity_ends(
    ensemble: LocalEnsemble,
) -> None:
    reported: list[float] = []
    lease = 1.5
    with LockManager(
        ensemble.urls,
        lease=lease,
        master_timeout=0.1,
        on_lost=lambda _: reported.append(time.monotonic()),
    ) as mgr:
        lock = mgr.lock("unreachable")
        lock.acquire()
        valid_until = time.monotonic() + lock.remaining()
        for i in (0, 1, 2):
            ensemble[i].pause()
        deadline = time.monotonic() + 2 * lease
        while not reported and time.monotonic() < deadline:
            time.sleep(0.05)
            # The watchdog renewed before the pause: the validity moves on.
            if lock.remaining() > 0:
                valid_until = time.monotonic() + lock.remaining()
        assert reported, "the loss was not reported"
        assert reported[0] < valid_until
        for i in (0, 1, 2):
            ensemble[i].resume()
        with pytest.raises(LockLostError):
            lock.release()


# -- fork ---------------------------------------------------------------------------


def _child(lock_name: str, urls: list[str], conn: object) -> None:
    from redreentrant import LockManager as _LM  # noqa: F401  (the inherited one is used)

    mgr = _FORK_STATE["mgr"]
    lock = mgr.lock(lock_name)
    result: dict[str, object] = {"count": lock.hold_count, "owned": lock.is_owned()}
    try:
        lock.release()
        result["release"] = "released"
    except LockNotOwnedError:
        result["release"] = "not owned"
    result["try"] = lock.acquire(blocking=False)
    conn.send(result)  # type: ignore[attr-defined]


_FORK_STATE: dict[str, LockManager] = {}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
# Forking a process that runs the watchdog's threads is the point here (Python 3.12+
# warns of it).
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_neither_releases_nor_renews_the_parents_lock(urls: list[str]) -> None:
    ctx = multiprocessing.get_context("fork")
    with LockManager(urls, lease=1.0) as mgr:
        _FORK_STATE["mgr"] = mgr
        lock = mgr.lock("forked")
        lock.acquire()
        parent_end, child_end = ctx.Pipe()
        child = ctx.Process(target=_child, args=("forked", urls, child_end))
        child.start()
        result = parent_end.recv()
        child.join(timeout=10)
        assert result == {"count": 0, "owned": False, "release": "not owned", "try": False}
        time.sleep(1.5)  # past the 1 s lease: only the parent's watchdog renews it
        assert lock.is_owned()
        lock.release()
        _FORK_STATE.clear()


# -- Redis Cluster node ---------------------------------------------------------------


def test_locks_work_on_a_redis_cluster_node(tmp_path: Path) -> None:
    node = LocalServer(
        port=cluster_port(),
        directory=str(tmp_path),
        extra_args=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"],
    )
    with node:
        with redis.Redis.from_url(node.url) as r:
            r.execute_command("CLUSTER", "ADDSLOTS", *range(16384))
            deadline = time.monotonic() + 10
            while b"cluster_state:ok" not in r.execute_command("CLUSTER", "INFO"):
                assert time.monotonic() < deadline, "cluster did not come up"
                time.sleep(0.05)
        with LockManager([node.url], lease=3.0) as mgr:
            a, b = mgr.lock("orders"), mgr.lock("invoices")  # different hash slots
            with a, b, a:
                time.sleep(1.0)
                mgr._watchdog.tick()  # the batched renewal must split by slot
                assert mgr._watchdog.cluster == {0}
                # Renewed just now, not 1 s ago at the acquire.
                assert a.is_owned() and b.is_owned()
                assert a.remaining() > 2.5 and b.remaining() > 2.5
                assert a.locked() and b.locked()
        with redis.Redis.from_url(node.url) as r:
            assert r.keys(PREFIX + "{*") == []
