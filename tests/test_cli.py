"""The ``redreentrant`` command line, run as a subprocess against real masters."""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import redis
from helpers import (
    CLI,
    PY,
    WORKERS,
    clean_env,
    free_port,
    gone,
    read_line,
    run_cli,
    stop,
    wait_until,
)

import redreentrant.__main__ as dunder_main
from redreentrant import FencingError, LockLostError, LockManager, __version__
from redreentrant._core.kinds import EXCLUSIVE
from redreentrant.cli import app as cli_app
from redreentrant.cli import ensemble as cli_ensemble
from redreentrant.cli import main as cli_main
from redreentrant.cli import run as cli_run
from redreentrant.cli.common import MASTERS_ENV, CliError
from redreentrant.cli.ensemble import STATE_ENV
from redreentrant.testing import LocalEnsemble

LINUX = sys.platform.startswith("linux")


def assert_one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The user-error contract: exit ``code``, one ``redreentrant: ...`` line, no traceback."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("redreentrant: "), result.stderr
    return lines[0]


def start_cli(
    *args: str, masters: list[str], run_lease: float | None = None, **env: str
) -> subprocess.Popen[str]:
    """Start the CLI; ``run_lease`` replaces ``run``'s watchdog lease (30 s)."""
    command = [*CLI, *args]
    if run_lease is not None:
        code = "import sys; from redreentrant.cli import main, run; "
        code += f"run.RUN_LEASE = {run_lease}; sys.exit(main())"
        command = [PY, "-c", code, *args]
    # Own session: no controlling terminal, so a SIGINT sent here is always forwarded.
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(**{MASTERS_ENV: ",".join(masters)}, **env),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def read_err_until(process: subprocess.Popen[str], text: str, limit: float = 30.0) -> str:
    """Read the process's stderr until a line holds ``text``; that line."""
    assert process.stderr is not None
    deadline = time.monotonic() + limit
    seen = []
    while time.monotonic() < deadline:
        readable, _, _ = select.select([process.stderr], [], [], 0.5)
        if readable:
            line = process.stderr.readline()
            if not line:
                break
            if text in line:
                return line
            seen.append(line)
    raise AssertionError(f"no {text!r} on stderr; saw {seen!r}, status {process.poll()}")


# -- help ---------------------------------------------------------------------------


def test_help_and_version_exit_0() -> None:
    assert run_cli("--version").stdout.strip() == f"redreentrant {__version__}"
    helped = run_cli("run", "--help")
    assert helped.returncode == 0
    assert "lost" in helped.stdout and "SIGTERM" in helped.stdout
    assert "--conflict-exit-code" in helped.stdout and "--wait-masters" in helped.stdout
    for command in ("demo", "inspect", "top", "unlock", "ensemble"):
        assert run_cli(command, "--help").returncode == 0


def test_the_console_script_and_python_m_run_the_same_main() -> None:
    # pyproject: redreentrant = "redreentrant.cli:main"; python -m: redreentrant.__main__.
    [script] = [ep for ep in entry_points(group="console_scripts") if ep.name == "redreentrant"]
    assert script.value == "redreentrant.cli:main"
    assert script.load() is cli_main is cli_app.main is dunder_main.main
    helped = run_cli("--help")
    assert helped.returncode == 0
    commands = ("demo", "run", "inspect", "top", "unlock", "ensemble")
    assert all(c in helped.stdout for c in commands)


# -- run ----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["before", "after", "env"])
def test_run_passes_the_exit_status_through(urls: list[str], where: str) -> None:
    masters = ",".join(urls)
    command = ["job", "--", "sh", "-c", "exit 7"]
    if where == "before":
        result = run_cli("--masters", masters, "run", *command)
    elif where == "after":
        result = run_cli("run", "--masters", masters, *command)
    else:
        result = run_cli("run", *command, masters=urls)
    assert result.returncode == 7, result.stderr
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("flags", "kind", "mode"),
    [
        ([], "lock", None),
        (["--shared"], "rw", "read"),
        (["--write"], "rw", "write"),
        (["--fair"], "fair", None),
    ],
)
def test_run_holds_the_lock_while_the_command_runs(
    urls: list[str], flags: list[str], kind: str, mode: str | None
) -> None:
    # The command looks at the lock itself, through the CLI.
    look = [PY, "-m", "redreentrant", "inspect", "--json", "held"]
    result = run_cli("run", *flags, "held", "--", *look, masters=urls, ok=True)
    seen = json.loads(result.stdout)
    assert seen["state"] == "held"
    for view in seen["masters"]:
        assert view["error"] is None
        [lock] = view["locks"]
        assert (lock["kind"], lock["mode"]) == (kind, mode)
        assert list(lock["holders"].values()) == [1]
        assert 0 < lock["ttl"] <= cli_run.RUN_LEASE
    with LockManager(urls) as mgr:
        assert not mgr.lock("held").locked()
        assert all(not v.locks for v in mgr.inspect("held"))


def test_run_gives_up_after_its_timeout(
    manager: LockManager, urls: list[str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    with manager.lock("busy"):
        for timeout in ("0.3", "0"):
            started = time.monotonic()
            result = run_cli(
                "run", "--timeout", timeout, "busy", "--", "touch", str(marker),
                masters=urls,
            )  # fmt: skip
            line = assert_one_error_line(result, 1)
            assert "busy" in line and "not obtained" in line
            assert time.monotonic() - started < 5
    assert not marker.exists()


@pytest.mark.parametrize(
    ("signum", "child", "status"),
    [
        (signal.SIGTERM, "signal.signal(signal.SIGTERM, lambda *a: sys.exit(5))", 5),
        (signal.SIGTERM, "pass", 128 + signal.SIGTERM),
        (signal.SIGINT, "signal.signal(signal.SIGINT, signal.SIG_DFL)", 128 + signal.SIGINT),
    ],
    ids=["sigterm-handled", "sigterm-default", "sigint-default"],
)
def test_a_signal_is_forwarded_and_the_lock_released(
    urls: list[str], signum: int, child: str, status: int
) -> None:
    code = f"import signal, sys, time; {child}; print('ready', flush=True); time.sleep(60)"
    process = start_cli("run", "sig", "--", PY, "-c", code, masters=urls)
    try:
        assert read_line(process) == "ready\n"
        with LockManager(urls) as mgr:
            assert mgr.lock("sig").locked()
            process.send_signal(signum)
            assert process.wait(timeout=10) == status
            assert not mgr.lock("sig").locked()
    finally:
        process.kill()
        process.communicate()


def test_shared_runs_overlap(urls: list[str], tmp_path: Path) -> None:
    # Each command announces itself and waits for the other: both succeed only if they
    # ran at the same time.
    rendezvous = (
        "import pathlib, sys, time\n"
        "mine, theirs = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])\n"
        "mine.touch()\n"
        "deadline = time.monotonic() + 10\n"
        "while not theirs.exists():\n"
        "    if time.monotonic() > deadline: sys.exit(9)\n"
        "    time.sleep(0.02)\n"
    )
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    runs = [
        start_cli("run", "--shared", "--timeout", "10", "books", "--", PY, "-c", rendezvous, x, y,
                  masters=urls)
        for x, y in ((a, b), (b, a))
    ]  # fmt: skip
    for process in runs:
        _, err = process.communicate(timeout=30)
        assert process.returncode == 0, err


def test_write_runs_exclude_shared_holders(manager: LockManager, urls: list[str]) -> None:
    with manager.rw_lock("books").read:
        result = run_cli("run", "--write", "--timeout", "0.3", "books", "--", "true", masters=urls)
        line = assert_one_error_line(result, 1)
        assert "held elsewhere" in line
    result = run_cli(
        "run", "--write", "--timeout", "5", "books", "--", "true", masters=urls, ok=True
    )


def test_run_stops_the_command_when_its_fixed_lease_runs_out(urls: list[str]) -> None:
    started = time.monotonic()
    result = run_cli("run", "--lease", "1", "short", "--", "sleep", "30", masters=urls)
    line = assert_one_error_line(result, 1)
    assert "lost" in line and "fixed lease ran out" in line
    assert time.monotonic() - started < 10


def test_run_stops_the_command_when_the_watchdog_loses_the_lock(
    urls: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # In-process, to shorten the watchdog's lease (renewed every 0.5 s here).
    monkeypatch.setattr(cli_run, "RUN_LEASE", 1.5)
    monkeypatch.setattr(cli_app, "setup_logging", lambda: None)  # leave logging alone
    monkeypatch.setenv(MASTERS_ENV, ",".join(urls))

    def steal() -> None:
        time.sleep(0.6)
        with LockManager(urls) as mgr:
            mgr.force_unlock("stolen")

    thief = threading.Thread(target=steal)
    thief.start()
    started = time.monotonic()
    try:
        status = cli_main(["run", "stolen", "--", "sleep", "30"])
    finally:
        thief.join()
    assert status == 1
    assert time.monotonic() - started < 5  # the command was stopped, not waited for
    assert "stopping it" in capsys.readouterr().err


def test_run_reports_a_missing_command(urls: list[str]) -> None:
    result = run_cli("run", "nocmd", "--", "no-such-command-here", masters=urls)
    assert_one_error_line(result, 127)
    with LockManager(urls) as mgr:
        assert not mgr.lock("nocmd").locked()


# A command that prints its pid, then sleeps.
SLEEPER = "import os, time; print(os.getpid(), flush=True); time.sleep(3600)"

# A command that writes to argv[2] whether the process argv[1] is "alive" or "gone".
PROBE = (
    "import os, sys\n"
    "pid = int(sys.argv[1])\n"
    "try:\n"
    "    os.kill(pid, 0)\n"
    "    with open(f'/proc/{pid}/stat') as f:\n"
    "        state = 'gone' if f.read().rpartition(')')[2].split()[0] == 'Z' else 'alive'\n"
    "except ProcessLookupError:\n"
    "    state = 'gone'\n"
    "except OSError:\n"
    "    state = 'alive'\n"
    "open(sys.argv[2], 'w').write(state)\n"
)


@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux's")
def test_the_command_dies_with_a_run_killed_by_sigkill(urls: list[str], tmp_path: Path) -> None:
    # A short watchdog lease, so the orphaned lock frees itself soon (the command has no
    # time limit, unlike with --lease).
    first = start_cli("run", "orphan", "--", PY, "-c", SLEEPER, masters=urls, run_lease=3.0)
    second = None
    command = 0
    report = tmp_path / "second-saw"
    try:
        command = int(read_line(first))
        # The second run waits for the lock; once it has it, its command looks at the
        # first run's command.
        second = start_cli(
            "run", "orphan", "--", PY, "-c", PROBE, str(command), str(report), masters=urls
        )
        assert not gone(command)
        assert not report.exists()
        first.send_signal(signal.SIGKILL)
        first.wait()
        wait_until(lambda: gone(command), "gone: the command outlived its killed run", 30)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 0, err
        assert report.read_text() == "gone"  # never two commands under one lock
    finally:
        if command and not gone(command):  # first, or it keeps first's stdout open
            os.kill(command, signal.SIGKILL)
        stop(first)
        stop(second)


@pytest.mark.parametrize("flag", ["-E", "--conflict-exit-code"])
def test_conflict_exit_code_when_the_lock_is_held(
    manager: LockManager, urls: list[str], tmp_path: Path, flag: str
) -> None:
    marker = tmp_path / "ran"
    with manager.lock("busy"):
        for timeout in ("0", "0.3"):
            result = run_cli(
                "run", flag, "75", "--timeout", timeout, "busy", "--", "touch", str(marker),
                masters=urls,
            )  # fmt: skip
            assert "not obtained" in assert_one_error_line(result, 75)
    assert not marker.exists()
    # The command's own status is still passed through, 1 included.
    own = run_cli("run", flag, "75", "busy", "--", "sh", "-c", "exit 1", masters=urls)
    assert own.returncode == 1, own.stderr


def test_conflict_exit_code_when_the_masters_are_unavailable(
    ensemble: LocalEnsemble, urls: list[str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    for index in (0, 2, 4):  # a quorum is 3 of 5: out of reach
        ensemble[index].kill()
    result = run_cli("run", "-E", "75", "down", "--", "touch", str(marker), masters=urls)
    assert "masters unavailable" in assert_one_error_line(result, 75)
    # --wait-masters waits for them until --timeout, and then gives up the same way.
    result = run_cli(
        "run", "-E", "75", "--wait-masters", "--timeout", "1", "down", "--", "touch", str(marker),
        masters=urls,
    )  # fmt: skip
    assert result.returncode == 75, result.stderr
    assert "waiting for the masters" in result.stderr
    last = result.stderr.splitlines()[-1]
    assert "not obtained within 1 s" in last and "masters unavailable" in last
    assert not marker.exists()


def test_wait_masters_waits_out_an_outage(ensemble: LocalEnsemble, urls: list[str]) -> None:
    for index in (0, 2, 4):  # an outage that costs no data (killed, they would be quarantined)
        ensemble[index].pause()
    process = start_cli(
        "run", "--wait-masters", "outage", "--", PY, "-c", "print('ran')", masters=urls
    )
    try:
        read_err_until(process, "waiting for the masters")
        assert process.poll() is None  # still waiting, the command not run
        for index in (0, 2, 4):
            ensemble[index].resume()
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        assert out == "ran\n"
    finally:
        stop(process)
    with LockManager(urls) as mgr:
        assert not mgr.lock("outage").locked()


# -- inspect ------------------------------------------------------------------------


def test_inspect_shows_the_holder_and_hold_count(manager: LockManager, urls: list[str]) -> None:
    lock = manager.lock("shown")
    with lock, lock:
        owner = manager.owner_id()
        table = run_cli("inspect", "shown", masters=urls, ok=True)
        lines = table.stdout.splitlines()
        assert lines[0].startswith("lock 'shown' on 5 masters, quorum 3: held")
        rows = [line for line in lines if line.startswith("127.0.0.1:")]
        assert len(rows) == 5
        # A quorum holds it; a master the acquire did not need may not (a round stops
        # reading once decided, and a master restarted by an earlier test may then
        # still lack the script: its NOSCRIPT is not read).
        holding = [row for row in rows if f"{owner} x2" in row and " lock " in row]
        assert len(holding) >= 3, table.stdout
        assert all(row in holding or "(free)" in row for row in rows), table.stdout

        document = json.loads(run_cli("inspect", "--json", "shown", masters=urls).stdout)
        assert document["name"] == "shown" and document["quorum"] == 3
        assert document["state"] == "held"
        assert [v["master"] for v in document["masters"]] == list(manager.masters)
        host, pid, _, token = owner.rsplit(":", 3)
        assert int(pid) == os.getpid()
        views = [view for view in document["masters"] if view["locks"]]
        assert len(views) >= 3
        for view in views:
            assert view["locks"] == [
                {
                    "kind": "lock",
                    "mode": None,
                    "ttl": view["locks"][0]["ttl"],
                    "holders": {owner: 2},
                    "queue": [],
                    "owners": {
                        owner: {
                            "host": host,
                            "pid": os.getpid(),
                            "kind": "thread",
                            "token": token,
                            "name": None,  # known only in this process, not in inspect's
                        }
                    },
                }
            ]
    free = run_cli("inspect", "--json", "shown", masters=urls)
    assert json.loads(free.stdout)["state"] == "free"
    assert "(free)" in run_cli("inspect", "shown", masters=urls).stdout


def start_holder(urls: list[str], name: str, kind: str) -> subprocess.Popen[str]:
    """Another process that takes ``name`` (printing "waiting", then "held")."""
    return subprocess.Popen(
        [PY, str(WORKERS), "hold", ",".join(urls), name, "30", kind],
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("kind", "summary"), [("lock", "lock"), ("fair", "fair"), ("write", "rw/write")]
)
def test_inspect_shows_host_pid_and_thread_of_holders_and_waiters(
    ensemble: LocalEnsemble, manager: LockManager, urls: list[str], kind: str, summary: str
) -> None:
    holder = start_holder(urls, "who", kind)
    waiter = None
    try:
        assert read_line(holder) == "waiting\n" and read_line(holder) == "held\n"
        waiter = start_holder(urls, "who", kind)
        assert read_line(waiter) == "waiting\n"

        def queued() -> bool:
            views = manager.inspect("who")
            return all(v.error is None and v.locks and v.locks[0].queue for v in views)

        wait_until(queued, "queued on every master", 30)
        document = json.loads(run_cli("inspect", "--json", "who", masters=urls).stdout)
        # A read/write lock names its holders once per side: "<owner id> (write)".
        [holder_key] = document["masters"][0]["locks"][0]["holders"]
        [waiter_id] = document["masters"][0]["locks"][0]["queue"]
        holder_id = holder_key.removesuffix(" (write)")
        expected = {
            holder_key: {"pid": holder.pid, "token": holder_id.rsplit(":", 1)[1]},
            waiter_id: {"pid": waiter.pid, "token": waiter_id.rsplit(":", 1)[1]},
        }
        for view in document["masters"]:
            [lock] = view["locks"]
            assert set(lock["owners"]) == {holder_key, waiter_id}
            for owner, info in lock["owners"].items():
                assert info == {
                    "host": owner.split(":", 1)[0],
                    "kind": "thread",
                    "name": None,  # a thread name is known only in its own process
                    **expected[owner],
                }

        table = run_cli("inspect", "who", masters=urls, ok=True)
        lines = table.stdout.splitlines()
        host = holder_id.split(":", 1)[0]
        assert f"held: {summary} by host {host} pid {holder.pid} thread" in lines[0]
        header = lines.index(next(line for line in lines if line.startswith("OWNER ")))
        assert lines[header].split() == ["OWNER", "HOST", "PID", "THREAD/TASK", "HOLDS", "ON",
                                         "QUEUED", "ON"]  # fmt: skip
        rows = {line.split()[0]: line.split() for line in lines[header + 1 :]}
        assert set(rows) == {holder_id, waiter_id}
        for owner, process, holds, queued_on in (
            (holder_id, holder, "5 of 5", "-"),
            (waiter_id, waiter, "-", "5 of 5"),
        ):
            token = owner.rsplit(":", 1)[1]
            # The pid in a column of its own, whole.
            assert rows[owner] == [owner, owner.split(":", 1)[0], str(process.pid), "thread",
                                   token, *holds.split(), *queued_on.split()]  # fmt: skip
    finally:
        stop(holder)
        stop(waiter)
        ensemble.flushall()  # what the killed workers left (a hold, a place in the queue)


# -- unlock -------------------------------------------------------------------------


def test_unlock_force_frees_a_held_lock(manager: LockManager, urls: list[str]) -> None:
    lock = manager.lock("stuck")
    lock.acquire()
    result = run_cli("unlock", "--force", "stuck", masters=urls, ok=True)
    assert "unlocked 'stuck'" in result.stdout
    with LockManager(urls) as other:
        assert other.lock("stuck").acquire(blocking=False)
        other.lock("stuck").release()
    with pytest.raises(LockLostError):
        lock.release()
    again = run_cli("unlock", "--force", "stuck", masters=urls)
    assert again.returncode == 0 and "nothing was deleted" in again.stdout


def test_unlock_without_force_is_refused(manager: LockManager, urls: list[str]) -> None:
    with manager.lock("kept") as lock:
        line = assert_one_error_line(run_cli("unlock", "kept", masters=urls), 2)
        assert "--force" in line
        assert lock.is_owned() and lock.locked()


def test_fence_raises_the_counters_so_the_next_token_is_larger(
    ensemble: LocalEnsemble, urls: list[str]
) -> None:
    result = run_cli(
        "fence", "fenced", "--at-least", "5000", "--kind", "fair", masters=urls, ok=True
    )
    assert "to at least 5000 on 5 of 5 masters" in result.stdout
    with LockManager(urls, fencing=True) as mgr, mgr.fair_lock("fenced") as lock:
        assert lock.token == 5001
    refused = assert_one_error_line(run_cli("fence", "fenced", "--at-least", "-1", masters=urls), 2)
    assert "--at-least" in refused
    ensemble.flushall()  # the counters outlive locks on purpose


def test_fence_without_a_token_raises_the_counters_past_every_token_handed_out(
    ensemble: LocalEnsemble, urls: list[str]
) -> None:
    with LockManager(urls, fencing=True) as mgr, mgr.lock("lost") as lock:
        last = lock.token
    counter = EXCLUSIVE.fence_key("lost")
    for i, url in enumerate(urls):  # lost on three; two missed the last write-backs
        with redis.Redis.from_url(url) as r:
            if i < 3:
                r.delete(counter)
            else:
                r.set(counter, last - 100)
    with LockManager(urls, fencing=True, quarantine=0) as mgr, pytest.raises(FencingError):
        mgr.lock("lost").acquire()
    result = run_cli("fence", "lost", masters=urls, ok=True)
    floor = int(re.findall(r"to at least (\d+) on 5 of 5 masters", result.stdout)[0])
    assert floor > last
    with LockManager(urls, fencing=True) as mgr, mgr.lock("lost") as lock:
        assert lock.token == floor + 1
    ensemble.flushall()  # the counters outlive locks on purpose


# -- errors -------------------------------------------------------------------------


#: a command of each kind that needs the masters
NEEDS_MASTERS = pytest.mark.parametrize(
    "args",
    [["run", "x", "--", "true"], ["inspect", "x"], ["unlock", "--force", "x"]],
    ids=["run", "inspect", "unlock"],
)


@NEEDS_MASTERS
def test_no_masters_is_a_usage_error(args: list[str]) -> None:
    line = assert_one_error_line(run_cli(*args), 2)
    assert "no masters" in line and "ensemble up" in line


@NEEDS_MASTERS
def test_unreachable_masters_fail_with_one_line(args: list[str]) -> None:
    nowhere = [f"redis://127.0.0.1:{free_port()}/0", f"127.0.0.1:{free_port()}"]
    result = run_cli(*args, masters=nowhere)
    assert "masters unavailable" in assert_one_error_line(result, 1)


MALFORMED = "redis//127.0.0.1:6379"


@pytest.mark.parametrize(
    "args",
    [["run", "x", "--", "true"], ["inspect", "x"], ["unlock", "--force", "x"], ["demo"]],
    ids=["run", "inspect", "unlock", "demo"],
)
def test_a_malformed_master_is_a_usage_error(urls: list[str], args: list[str]) -> None:
    # Not a failure to resolve a host "redis": one line, exit 2, naming the entry.
    given = run_cli("--masters", f"{urls[0]},{MALFORMED}", *args)
    assert MALFORMED in assert_one_error_line(given, 2)
    from_env = run_cli(*args, env={MASTERS_ENV: f"{urls[0]},{MALFORMED}"})
    line = assert_one_error_line(from_env, 2)
    assert MALFORMED in line and MASTERS_ENV in line


def test_masters_come_from_the_environment_unless_given(urls: list[str]) -> None:
    addresses = [url.removeprefix("redis://") for url in urls]  # "127.0.0.1:PORT/0"
    bare = ",".join(address.removesuffix("/0") for address in addresses)  # host:port
    for masters in (",".join(urls), bare):
        result = run_cli("inspect", "--json", "x", env={MASTERS_ENV: masters}, ok=True)
        assert [v["master"] for v in json.loads(result.stdout)["masters"]] == addresses
    # --masters wins: the variable, malformed here, is not even read.
    run_cli("--masters", bare, "inspect", "x", env={MASTERS_ENV: MALFORMED}, ok=True)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["inspect", ""], "empty"),
        (["run", "", "--", "true"], "empty"),
        (["unlock", "--force", ""], "empty"),
        (["run", "x"], "after '--'"),
        (["run", "x", "sleep", "1"], "after '--'"),
        (["run", "x", "--"], "no command"),
        (["run", "--shared", "--fair", "x", "--", "true"], "not allowed"),
        (["run", "--timeout", "-1", "x", "--", "true"], "--timeout"),
        (["run", "--lease", "0", "x", "--", "true"], "--lease"),
        (["run", "--lease", "0.001", "x", "--", "true"], "too short"),
        (["run", "-E", "256", "x", "--", "true"], "--conflict-exit-code"),
        (["run", "--conflict-exit-code", "x", "x", "--", "true"], "--conflict-exit-code"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
        (["--masters", "bogus://x", "inspect", "x"], "bad masters"),
        (["ensemble", "up", "--size", "0"], "--size"),
    ],
)
def test_bad_input_is_a_usage_error(urls: list[str], args: list[str], expected: str) -> None:
    assert expected in assert_one_error_line(run_cli(*args, masters=urls), 2)


# -- ensemble -----------------------------------------------------------------------


def test_ensemble_up_status_down(redis_binary: str, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    ports_file = tmp_path / "ports"
    up = run_cli("ensemble", "up", "--size", "3", "--state", str(state),
                 "--port-file", str(ports_file))  # fmt: skip
    pids: list[int] = []
    try:
        assert up.returncode == 0, up.stderr
        [line] = up.stdout.splitlines()
        assert line.startswith(f"{MASTERS_ENV}=")
        masters = line.partition("=")[2].split(",")
        ports = [int(p) for p in ports_file.read_text().split()]
        assert masters == [f"redis://127.0.0.1:{p}/0" for p in ports] and len(ports) == 3
        recorded = json.loads(state.read_text())
        pids = [s["pid"] for s in recorded["servers"]]
        directory = Path(recorded["dir"])
        assert directory.is_dir()

        # The state file may also come from the environment.
        status = run_cli("ensemble", "status", env={STATE_ENV: str(state)}, ok=True)
        assert status.stdout.count(" up") == 3

        # The servers outlived the 'up' command, and they are usable masters.
        assert run_cli("run", "dev", "--", "sh", "-c", "exit 3", masters=masters).returncode == 3

        again = run_cli("ensemble", "up", "--state", str(state))
        assert "already up" in assert_one_error_line(again, 1)

        run_cli("ensemble", "down", "--state", str(state), ok=True)
        deadline = time.monotonic() + 10
        while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(gone(pid) for pid in pids)
        assert not state.exists() and not directory.exists()
        after = run_cli("ensemble", "status", "--state", str(state))
        assert after.returncode == 1 and "no ensemble" in after.stdout
        assert run_cli("ensemble", "down", "--state", str(state)).returncode == 0
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def _default_state(monkeypatch: pytest.MonkeyPatch, tmp: Path, runtime: Path | None) -> str:
    """Where the state file goes by default, with ``tmp`` as the temp directory and
    ``runtime`` as $XDG_RUNTIME_DIR (None: unset); its directory is made."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    if runtime is None:
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    path, default = cli_ensemble._state_path(argparse.Namespace(state=None), create=True)
    assert default
    return path


def test_the_state_file_is_in_a_directory_of_the_users_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    path = _default_state(monkeypatch, tmp_path, runtime)
    assert path == str(runtime / "redreentrant" / "ensemble.json")
    assert stat.S_IMODE(os.stat(runtime / "redreentrant").st_mode) == 0o700

    # No runtime directory (or none of ours): one of our own in the temp directory.
    path = _default_state(monkeypatch, tmp_path, None)
    own = tmp_path / f"redreentrant-{os.getuid()}"
    assert path == str(own / "ensemble.json")
    assert stat.S_IMODE(os.stat(own).st_mode) == 0o700
    own.chmod(0o777)  # loosened by hand: tightened again
    _default_state(monkeypatch, tmp_path, tmp_path / "missing")
    assert stat.S_IMODE(os.stat(own).st_mode) == 0o700

    # Someone else's directory (seen as ours by another uid), or a link: refused.
    monkeypatch.setattr(os, "getuid", lambda: os.stat(own).st_uid + 1)
    theirs = tmp_path / f"redreentrant-{os.getuid()}"
    theirs.mkdir(mode=0o700)
    with pytest.raises(CliError, match="not by you"):
        _default_state(monkeypatch, tmp_path, None)
    monkeypatch.undo()
    own.rmdir()
    own.symlink_to(theirs)
    with pytest.raises(CliError, match="not a directory"):
        _default_state(monkeypatch, tmp_path, None)


# -- demo ---------------------------------------------------------------------------


STAGES = [f"== Stage {n}/5: " for n in range(1, 6)]


def test_demo_runs_every_stage_and_cleans_up(redis_binary: str) -> None:
    started = time.monotonic()
    result = run_cli("demo", "--quick", timeout=120, ok=True)
    assert result.stderr == ""
    positions = [result.stdout.index(stage) for stage in STAGES]
    assert positions == sorted(positions)
    assert "FAIL" not in result.stdout and "all 9 checks passed" in result.stdout
    assert "\033[" not in result.stdout  # no colour when stdout is not a terminal
    assert time.monotonic() - started < 60
    # Every server it started is gone.
    ports = [int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)/0", result.stdout.splitlines()[0])]
    assert len(ports) == 5
    for port in ports:
        with socket.socket() as sock, pytest.raises(OSError):
            sock.connect(("127.0.0.1", port))


def test_demo_killed_by_sigkill_leaves_no_server_or_directory(
    redis_binary: str, tmp_path: Path
) -> None:
    # Its temp directory goes under tmp_path, where we can look for it.
    demo = subprocess.Popen(
        [*CLI, "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(TMPDIR=str(tmp_path)),
        stdin=subprocess.DEVNULL,
    )
    pids: list[int] = []
    try:
        ports = [int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)/0", read_line(demo))]
        assert len(ports) == 5
        for port in ports:
            with redis.Redis(port=port, socket_timeout=5) as client:
                pids.append(int(client.info("server")["process_id"]))
        assert list(tmp_path.glob("redreentrant-ensemble-*"))
        demo.send_signal(signal.SIGKILL)
        demo.communicate()
        wait_until(lambda: all(gone(pid) for pid in pids), "gone: servers outlived the demo", 30)
        wait_until(
            lambda: not list(tmp_path.glob("redreentrant-ensemble-*")),
            "removed: the demo's directory",
            30,
        )
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        stop(demo)


def test_demo_on_given_masters_skips_the_crash_stage(urls: list[str]) -> None:
    result = run_cli("demo", "--quick", timeout=120, masters=urls, ok=True)
    crash = result.stdout.split(STAGES[3])[1].split(STAGES[4])[0]
    assert "skipped" in crash
    assert "all 7 checks passed" in result.stdout


@pytest.fixture(autouse=True)
def _no_stray_masters_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # In-process calls of the CLI's main must not see a developer's variables either.
    monkeypatch.delenv(MASTERS_ENV, raising=False)
    monkeypatch.delenv(STATE_ENV, raising=False)
    yield


def test_run_takes_a_quarantine_and_refuses_one_shorter_than_its_lease(urls: list[str]) -> None:
    # A master whose memory began lately does not vote for the quarantine: it must
    # cover the longest lease in use (see docs/cli.md, "Quarantine").
    short = run_cli("run", "q", "--quarantine", "5", "--", "true", masters=urls)
    assert short.returncode == 2 and "lease 30s is longer than quarantine=5s" in short.stderr
    ok = run_cli("run", "q", "--quarantine", "60", "--lease", "5", "--", "true", masters=urls)
    assert ok.returncode == 0, ok.stderr
