"""The local Sentinel group of the test harness (redreentrant.testing.LocalSentinelGroup):
a master, its replicas and three sentinels, all real processes on 127.0.0.1; replication,
a failover after the master is killed and one asked of a sentinel, a killed master back
as a replica, and nothing left running after stop() or after its parent is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import gone, require_redis_server, wait_until

import redreentrant
from redreentrant.testing import LocalSentinelGroup, LocalServer


def _client(server: LocalServer) -> redis.Redis:
    return redis.Redis(port=server.port, socket_timeout=5, decode_responses=True)


def _role(server: LocalServer) -> list[Any]:
    with _client(server) as r:
        role: list[Any] = r.execute_command("ROLE")
    return role


def test_the_group_starts_and_its_replicas_replicate_a_write(
    sentinel_group: LocalSentinelGroup,
) -> None:
    master = sentinel_group.master()
    assert master is sentinel_group.servers[0]
    assert _role(master)[0] == "master"
    replicas = sentinel_group.replicas()
    assert replicas == sentinel_group.servers[1:]
    assert len(sentinel_group.sentinels) == 3
    ports = ",".join(f"127.0.0.1:{s.port}" for s in sentinel_group.sentinels)
    assert sentinel_group.url == f"redis+sentinel://{ports}/locks/0"
    assert sentinel_group.sentinel_addresses == [
        ("127.0.0.1", s.port) for s in sentinel_group.sentinels
    ]

    with _client(master) as r:
        r.set("written", "on the master")
    sentinel_group.wait_replicas_in_sync()
    for replica in replicas:
        assert _role(replica)[:3] == ["slave", "127.0.0.1", master.port]
        with _client(replica) as r:
            assert r.get("written") == "on the master"
            with pytest.raises(redis.ReadOnlyError):
                r.set("written", "on a replica")


def test_a_killed_master_is_failed_over_and_comes_back_as_a_replica(
    sentinel_group: LocalSentinelGroup,
) -> None:
    old = sentinel_group.kill_master()
    assert not old.running
    new = sentinel_group.wait_for_master(not_this=old)
    assert new is not old and new in sentinel_group.servers
    assert sentinel_group.master() is new
    with _client(new) as r:
        r.set("after", "the failover")

    old.start()  # comes back as a replica of the new master, with its data
    sentinel_group.wait_replicas_in_sync()
    assert _role(old)[:3] == ["slave", "127.0.0.1", new.port]
    with _client(old) as r:
        assert r.get("after") == "the failover"
    assert sorted(s.port for s in sentinel_group.replicas()) == sorted(
        s.port for s in sentinel_group.servers if s is not new
    )


def test_a_failover_asked_of_a_sentinel_promotes_a_replica(
    sentinel_group: LocalSentinelGroup,
) -> None:
    before = sentinel_group.failover()
    assert before is sentinel_group.servers[0]
    new = sentinel_group.wait_for_master(not_this=before)
    assert new is not before
    assert _role(new)[0] == "master"
    with _client(new) as r:
        r.set("after", "the failover")
        assert r.get("after") == "the failover"


@pytest.mark.integration
def test_stop_leaves_no_process_and_no_directory(tmp_path: Path) -> None:
    require_redis_server("the Sentinel group's tests")
    group = LocalSentinelGroup(replicas=1, base_dir=str(tmp_path)).start()
    assert len(group.servers) == 2
    processes = group.servers + group.sentinels
    pids = [s.pid for s in processes]
    assert all(pid is not None and not gone(pid) for pid in pids)
    group.servers[1].pause()  # a paused server does not hold stop() up

    group.stop()
    assert all(pid is not None and gone(pid) for pid in pids)
    assert not any(s.running for s in processes)
    assert not os.path.exists(group.directory)
    assert list(tmp_path.iterdir()) == []
    group.stop()  # idempotent
    with pytest.raises(RuntimeError, match="stopped"):
        group.start()


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="replicas"):
        LocalSentinelGroup(replicas=3)
    with pytest.raises(ValueError, match="quorum"):
        LocalSentinelGroup(sentinels=1)
    with pytest.raises(ValueError, match="service"):
        LocalSentinelGroup(service="two words")


# A process that starts a group, says what it started, and sleeps until it is killed.
_STARTER = """
import json, sys, time
from redreentrant.testing import LocalSentinelGroup
g = LocalSentinelGroup(replicas=1, base_dir=sys.argv[1]).start()
print(json.dumps({"pids": [s.pid for s in g.servers + g.sentinels], "dir": g.directory}))
sys.stdout.flush()
time.sleep(3600)
"""


@pytest.mark.integration
def test_the_group_dies_with_a_killed_parent(tmp_path: Path) -> None:
    require_redis_server("the Sentinel group's tests")
    root = str(Path(redreentrant.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    starter = subprocess.Popen(
        [sys.executable, "-c", _STARTER, str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert starter.stdout is not None
        report = json.loads(starter.stdout.readline())
    finally:
        starter.send_signal(signal.SIGKILL)  # no atexit, no finally: only the reaper
        starter.communicate()
    pids: list[int] = report["pids"]
    try:
        assert len(pids) == 5
        wait_until(lambda: all(gone(pid) for pid in pids), "gone: the group outlived its parent")
        wait_until(lambda: not os.path.exists(report["dir"]), "removed: the group's directory")
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
