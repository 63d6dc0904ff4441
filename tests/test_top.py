"""``redreentrant top``: snapshots (``--once``, ``--json``) and the live view, driven in a
pseudo-terminal and read off an emulated screen (pyte), against real masters."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyte
import pytest
from helpers import PY, WORKERS, clean_env, read_line, run_cli, stop, wait_until

from redreentrant import LockManager
from redreentrant._core.owner import host_name
from redreentrant.cli.common import MASTERS_ENV
from redreentrant.cli.ensemble import STATE_ENV
from redreentrant.testing import LocalEnsemble

# The CLI with 'rich' made impossible to import.
NO_RICH = (
    "import sys; sys.modules['rich'] = None; from redreentrant.cli import main; sys.exit(main())"
)


def top_json(urls: list[str], *args: str) -> dict[str, Any]:
    result = run_cli("top", "--json", *args, masters=urls, ok=True)
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def start_worker(urls: list[str], name: str, kind: str) -> subprocess.Popen[str]:
    """Another process that takes ``name`` (printing "waiting", then "held")."""
    process = subprocess.Popen(
        [PY, str(WORKERS), "hold", ",".join(urls), name, "30", kind],
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
    )
    assert read_line(process) == "waiting\n"
    return process


def table(text: str, header: str, sections: bool = False) -> list[dict[str, str]]:
    """The rows of the table whose header line starts with ``header``, as dicts: cells
    cut at the header's column starts (a cell may hold a space). The table ends at a
    blank line, or with ``sections`` (the live view's blank lines between locks) at a
    line that does not keep to its columns. Rules (``───``) are skipped."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    names = lines[start].split()
    starts = [lines[start].index(name) for name in names]
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            if sections:
                continue
            break
        if set(line.strip()) == {"─"}:
            continue
        if any(line[s - 2 : s].strip() for s in starts[1:] if len(line) > s):
            break
        cells = [line[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)]
        rows.append(dict(zip(names, cells, strict=True)))
    return rows


def lock_rows(text: str, sections: bool = False) -> dict[str, list[dict[str, str]]]:
    """The locks' table, per ``name/kind``: the rows of its holders and waiters."""
    out: dict[str, list[dict[str, str]]] = {}
    key = ""
    for row in table(text, "LOCK ", sections):
        if row["KIND"]:
            key = f"{row['LOCK']}/{row['KIND']}"
        out.setdefault(key, []).append(row)
    return out


def on_a_quorum(cell: str) -> bool:
    """An ON cell ("4/5") that counts a quorum of the five masters, the stopped one not
    among them (a grant needs a quorum, not every master)."""
    on, _, total = cell.partition("/")
    return total == "5" and 3 <= int(on) <= 4


# -- snapshots ------------------------------------------------------------------------


def test_an_upgradeable_reader_shows_as_one(manager: LockManager, urls: list[str]) -> None:
    with manager.rw_lock("upgrades").upgradeable:
        result = run_cli("top", "--once", masters=urls, ok=True)
        [row] = lock_rows(result.stdout)["upgrades/rw"]
        assert row["ROLE"] == "upgradeable" and row["STATE"] == "held", row


def test_once_shows_holders_queue_mode_ttl_and_a_stopped_master(
    ensemble: LocalEnsemble, manager: LockManager, urls: list[str]
) -> None:
    fair_holder = fair_waiter = reader = None
    lock = manager.lock("jobs")
    try:
        with lock, lock:
            fair_holder = start_worker(urls, "queue", "fair")
            assert read_line(fair_holder) == "held\n"
            fair_waiter = start_worker(urls, "queue", "fair")
            reader = start_worker(urls, "tree", "read")
            assert read_line(reader) == "held\n"

            def queued() -> bool:
                views = manager.inspect("queue")
                return all(v.error is None and v.locks and v.locks[0].queue for v in views)

            wait_until(queued, "queued on every master", 30)
            ensemble[4].kill()

            result = run_cli("top", "--once", masters=urls, ok=True)
            text = result.stdout
            assert text.splitlines()[0].startswith("redreentrant top ")
            assert "pattern '*'  5 masters, 4 up, quorum 3  3 locks" in text.splitlines()[0]

            health = {row["MASTER"]: row for row in table(text, "MASTER ")}
            assert list(health) == list(manager.masters)
            stopped = manager.masters[4]
            assert health[stopped]["STATUS"] == "down" and health[stopped]["LATENCY"] == "-"
            assert health[stopped]["ERROR"] != "-"
            for master in manager.masters[:4]:
                assert health[master]["STATUS"] == "up", health[master]
                assert re.fullmatch(r"\d+\.\d\d ms", health[master]["LATENCY"])
                assert health[master]["ERROR"] == "-"

            locks = lock_rows(text)
            assert list(locks) == ["jobs/lock", "queue/fair", "tree/rw"]
            host = host_name()
            token = manager.owner_id().rsplit(":", 1)[1]
            [jobs] = locks["jobs/lock"]
            assert jobs["STATE"] == "held" and jobs["MODE"] == "-"
            assert re.fullmatch(r"\d+\.\ds|\d+\.\d\.\.\d+\.\ds", jobs["TTL"]), jobs["TTL"]
            assert (jobs["ROLE"], jobs["HOST"], jobs["PID"], jobs["THREAD/TASK"]) == (
                "holder",
                host,
                str(os.getpid()),
                f"thread {token}",
            )
            assert jobs["HOLDS"] == "2" and on_a_quorum(jobs["ON"])

            holder, waiter = locks["queue/fair"]
            assert holder["STATE"] == "held" and holder["TTL"] != "-"
            assert (holder["ROLE"], holder["PID"], holder["HOLDS"]) == (
                "holder",
                str(fair_holder.pid),
                "1",
            )
            assert (waiter["ROLE"], waiter["PID"], waiter["HOLDS"]) == (
                "waiter 1",
                str(fair_waiter.pid),
                "-",
            )
            assert on_a_quorum(holder["ON"]) and on_a_quorum(waiter["ON"])
            assert waiter["HOST"] == host and waiter["THREAD/TASK"].startswith("thread t")

            [tree] = locks["tree/rw"]
            assert (tree["MODE"], tree["STATE"], tree["ROLE"], tree["PID"]) == (
                "read",
                "held",
                "reader",
                str(reader.pid),
            )
    finally:
        stop(fair_holder, fair_waiter, reader)
        ensemble.flushall()  # what the killed workers left (holds, a place in the queue)


def test_json_shows_every_master_and_a_plain_locks_registered_waiters(
    ensemble: LocalEnsemble, manager: LockManager, urls: list[str]
) -> None:
    waiter = None
    try:
        with manager.rw_lock("doc").write:
            with manager.lock("doc"):
                waiter = start_worker(urls, "doc", "lock")

                def registered() -> bool:
                    locks = top_json(urls)["locks"]
                    return any(lock["kind"] == "lock" and lock["waiters"] for lock in locks)

                wait_until(registered, "registered as a waiter", 30)
                document = top_json(urls, "doc")
            owner = manager.owner_id()
            assert document["pattern"] == "doc" and document["quorum"] == 3
            assert (document["matched"], document["limit"], document["cut"]) == (1, 50, 0)
            assert [m["master"] for m in document["masters"]] == list(manager.masters)
            for master in document["masters"]:
                assert master["up"] is True and master["error"] is None
                assert isinstance(master["latency_ms"], float)
            plain, rw = document["locks"]
            assert (plain["name"], plain["kind"], plain["state"], plain["mode"]) == (
                "doc",
                "lock",
                "held",
                None,
            )
            assert 0 < plain["ttl_min"] <= plain["ttl"]
            who = {
                "host": host_name(),
                "pid": os.getpid(),
                "kind": "thread",
                "token": owner.rsplit(":", 1)[1],
                "name": None,  # a thread's name is known only in its own process
            }
            # A grant needs a quorum, not every master: where one missed the round (a
            # master restarted by an earlier test, say), a waiter's try may hold it there
            # for a moment. Every master's own view is shown, as it is.
            [ours] = [h for h in plain["holders"] if h["owner"] == owner]
            assert ours == {"owner": owner, "side": None, "hold_count": 1, "on": ours["on"],
                            "who": who}  # fmt: skip
            assert ours["on"] >= 3
            views = plain["masters"]
            assert len(views) == 5 and all(v["error"] is None for v in views)
            assert sum(v["holders"].get(owner) == 1 for v in views) == ours["on"]
            [registered_waiter] = plain["waiters"]
            assert registered_waiter["position"] == 1
            assert registered_waiter["who"]["pid"] == waiter.pid
            assert 1 <= registered_waiter["on"] <= 5
            assert set().union(*(v["waiters"] for v in views)) == {registered_waiter["owner"]}
            assert (rw["kind"], rw["mode"], rw["state"]) == ("rw", "write", "held")
            [ours] = rw["holders"]
            assert ours == {"owner": owner, "side": "write", "hold_count": 1, "on": ours["on"],
                            "who": who}  # fmt: skip
            assert ours["on"] >= 3 and rw["waiters"] == []
            assert sum(v["holders"] == {f"{owner} (write)": 1} for v in rw["masters"]) >= 3
    finally:
        stop(waiter)
        ensemble.flushall()


def test_json_shows_an_elections_leader(
    ensemble: LocalEnsemble, manager: LockManager, urls: list[str]
) -> None:
    with manager.election("leaders").campaign(value=b"a"):
        top = json.loads(run_cli("top", "--json", "leaders", masters=urls).stdout)
        [row] = top["locks"]
        assert row["kind"] == "election" and row["state"] == "held"
        assert [h["owner"] for h in row["holders"]] == [manager.owner_id()]
    ensemble.flushall()  # the terms' counters stay, as fencing counters do


def test_the_pattern_and_the_limit(
    ensemble: LocalEnsemble, manager: LockManager, urls: list[str]
) -> None:
    names = ["a1", "a2", "b1", "c}1", "c%7D1"]
    locks = [manager.lock(name) for name in names]
    for lock in locks:
        lock.acquire()
    try:
        # Fencing counters outlive their locks: a name with only those is no lock.
        assert run_cli("fence", "fenced", "--at-least", "7", masters=urls).returncode == 0

        def shown(*args: str) -> list[str]:
            return [lock["name"] for lock in top_json(urls, *args)["locks"]]

        assert shown() == sorted(names)
        assert shown("a*") == ["a1", "a2"]
        assert shown("?1") == ["a1", "b1"]
        assert shown("[ab]2") == ["a2"]
        # A name holding "}" has its keys escaped: found by the pattern all the same.
        assert shown("c}*") == ["c}1"]
        assert shown("c*") == ["c%7D1", "c}1"]
        assert shown("fenced") == []

        limited = top_json(urls, "--limit", "2")
        assert [lock["name"] for lock in limited["locks"]] == ["a1", "a2"]
        assert (limited["matched"], limited["limit"], limited["cut"]) == (5, 2, 3)
        text = run_cli("top", "--once", "--limit", "2", masters=urls, ok=True)
        assert "3 more matching name(s) not shown" in text.stdout
        assert "--limit" in text.stdout

        nothing = run_cli("top", "--once", "zzz*", masters=urls)
        assert nothing.returncode == 0 and "no locks match 'zzz*'" in nothing.stdout
    finally:
        for lock in locks:
            lock.release()
        ensemble.flushall()  # the fencing counters


def test_without_a_quorum_the_snapshot_is_shown_and_exit_is_1(
    ensemble: LocalEnsemble, urls: list[str]
) -> None:
    for index in (2, 3, 4):
        ensemble[index].kill()
    result = run_cli("top", "--once", masters=urls)
    assert result.returncode == 1
    assert result.stdout.count(" down ") == 3
    [line] = result.stderr.splitlines()
    assert line.startswith("redreentrant: masters unavailable: only 2 of 5 answered")


def test_bad_arguments_are_usage_errors(urls: list[str]) -> None:
    for args, expected in (
        (["--interval", "0"], "--interval"),
        (["--interval", "x"], "--interval"),
        (["--limit", "0"], "--limit"),
    ):
        result = run_cli("top", *args, masters=urls)
        assert result.returncode == 2, result
        [line] = result.stderr.splitlines()
        assert line.startswith("redreentrant: ") and expected in line


def test_masters_come_from_the_local_ensemble_when_not_given(
    redis_binary: str, tmp_path: Path
) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime), "TMPDIR": str(tmp_path)}
    none = run_cli("top", "--once", env=env)
    assert none.returncode == 2 and "no masters" in none.stderr

    up = run_cli("ensemble", "up", "--size", "3", env=env)
    state = runtime / "redreentrant" / "ensemble.json"
    try:
        assert up.returncode == 0, up.stderr
        assert state.is_file() and (state.parent.stat().st_mode & 0o777) == 0o700
        masters = up.stdout.strip().partition("=")[2].split(",")
        with LockManager(masters) as mgr, mgr.fair_lock("dev"):
            result = run_cli("top", "--once", env=env, ok=True)
            assert "3 masters (local ensemble), 3 up, quorum 2  1 lock" in result.stdout
            health = table(result.stdout, "MASTER ")
            assert [row["MASTER"] for row in health] == list(mgr.masters)
            assert all(row["STATUS"] == "up" for row in health)
            [row] = lock_rows(result.stdout)["dev/fair"]
            assert row["PID"] == str(os.getpid()) and row["ON"] == "3/3"
    finally:
        run_cli("ensemble", "down", env=env, ok=True)
    assert not state.exists()


def test_once_and_json_need_no_rich(urls: list[str]) -> None:
    env = clean_env(**{MASTERS_ENV: ",".join(urls)})
    for flag in ("--once", "--json"):
        result = subprocess.run(
            [PY, "-c", NO_RICH, "top", flag],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 0, result.stderr
        assert "5 up" in result.stdout or json.loads(result.stdout)["quorum"] == 3


# -- the live view, in a pseudo-terminal --------------------------------------------


# Makes the pseudo-terminal the controlling terminal of the new session, so that a
# Ctrl-C typed on it (the byte 0x03) is a SIGINT from the terminal, then runs the rest.
LAUNCHER = (
    "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


class Terminal:
    """A process on a pseudo-terminal of ``rows`` x ``cols``, its output on a screen."""

    def __init__(self, argv: list[str], env: dict[str, str], rows: int = 40, cols: int = 160):
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        try:
            self.process = subprocess.Popen(
                [PY, "-c", LAUNCHER, *argv],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env={**env, "TERM": "xterm-256color"},
                start_new_session=True,
            )
        finally:
            os.close(slave)
        self.fd = master
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.output = bytearray()
        self.closed = False

    def pump(self, timeout: float = 0.1) -> None:
        """Feed the screen what the process wrote, waiting up to ``timeout`` for it."""
        while not self.closed:
            readable, _, _ = select.select([self.fd], [], [], timeout)
            if not readable:
                return
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # EIO: the process and its terminal are gone
                data = b""
            if not data:
                self.closed = True
                return
            self.output += data
            self.stream.feed(data)
            timeout = 0

    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display)

    def wait_for(self, condition: Callable[[str], bool], what: str, limit: float = 30.0) -> str:
        """Read the screen until ``condition(screen text)``; that text."""
        deadline = time.monotonic() + limit
        while True:
            self.pump()
            text = self.text()
            if condition(text):
                return text
            if time.monotonic() > deadline or (self.closed and self.process.poll() is not None):
                raise AssertionError(f"the screen never showed {what}:\n{text}")

    def type(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait(self, limit: float = 30.0) -> int:
        deadline = time.monotonic() + limit
        while self.process.poll() is None and time.monotonic() < deadline:
            self.pump()
        return self.process.wait(timeout=1)

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        os.close(self.fd)


@pytest.fixture
def terminal() -> Iterator[Callable[..., Terminal]]:
    started: list[Terminal] = []

    def start(*argv: str, env: dict[str, str]) -> Terminal:
        started.append(Terminal(list(argv), env))
        return started[-1]

    yield start
    for term in started:
        term.close()


def pids(text: str, name: str) -> list[str]:
    """The pids of the holders and waiters of lock ``name`` on a screen."""
    if not any(line.startswith("LOCK ") for line in text.splitlines()):
        return []
    locks = lock_rows(text, sections=True)
    return [row["PID"] for key, rows in locks.items() if key.startswith(f"{name}/") for row in rows]


def test_the_live_view_refreshes_in_place_and_quits_on_ctrl_c(
    ensemble: LocalEnsemble,
    manager: LockManager,
    urls: list[str],
    terminal: Callable[..., Terminal],
) -> None:
    worker = None
    env = clean_env(**{MASTERS_ENV: ",".join(urls)})
    try:
        lock = manager.lock("live")
        lock.acquire()
        term = terminal("-m", "redreentrant", "top", "--interval", "0.2", "li*", env=env)
        me = str(os.getpid())
        screen = term.wait_for(lambda text: pids(text, "live") == [me], "our hold")
        assert "5 masters, 5 up, quorum 3  1 lock" in screen
        assert "Ctrl-C quits" in screen
        assert screen.count(" up ") == 5

        lock.release()
        worker = start_worker(urls, "live", "lock")
        assert read_line(worker) == "held\n"
        pid = str(worker.pid)
        screen = term.wait_for(lambda text: pids(text, "live") == [pid], "the new holder")
        # Redrawn in place: the screen shows one view, not one per refresh.
        assert screen.count("MASTER ") == 1 and screen.count("LOCK ") == 1

        term.type(b"\x03")  # Ctrl-C
        assert term.wait() == 0
        assert b"Traceback" not in term.output
        assert b"\x1b[?25h" in term.output  # the cursor is shown again
    finally:
        stop(worker)
        ensemble.flushall()


def test_the_live_view_without_rich_says_which_extra_to_install(
    urls: list[str], terminal: Callable[..., Terminal]
) -> None:
    env = clean_env(**{MASTERS_ENV: ",".join(urls)})
    term = terminal("-c", NO_RICH, "top", env=env)
    assert term.wait() == 1
    term.pump()
    text = term.text()
    assert "redreentrant: the live view needs the 'rich' package" in text
    assert "pip install 'redreentrant[cli]'" in text and "--once" in text


@pytest.fixture(autouse=True)
def _no_stray_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MASTERS_ENV, raising=False)
    monkeypatch.delenv(STATE_ENV, raising=False)
