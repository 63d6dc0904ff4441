"""The command line of leader election (``elect``, ``leader``) and of fencing tokens
(``run --fencing``), run as subprocesses against real masters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from helpers import (
    CLI,
    PY,
    clean_env,
    free_port,
    gone,
    lock_keys,
    read_line,
    run_cli,
    stop,
    wait_until,
)

from redreentrant import LockManager, parse_owner
from redreentrant._core.kinds import ELECTION
from redreentrant.cli.common import MASTERS_ENV
from redreentrant.cli.leader import EXIT_NOBODY
from redreentrant.testing import LocalEnsemble

pytestmark = pytest.mark.integration

LINUX = sys.platform.startswith("linux")

#: a short lease, so that a leader killed hard is followed soon
LEASE = 1.5

#: a command that prints $REDREENTRANT_FENCE and its own pid, then waits until the file
#: argv[1] exists (or an hour, if not given)
FENCED_WAIT = (
    "import os, pathlib, sys, time\n"
    "print(os.environ['REDREENTRANT_FENCE'], os.getpid(), flush=True)\n"
    "go = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else None\n"
    "deadline = time.monotonic() + 3600\n"
    "while time.monotonic() < deadline and not (go and go.exists()):\n"
    "    time.sleep(0.02)\n"
)


@pytest.fixture
def urls(ensemble: LocalEnsemble) -> Iterator[list[str]]:
    """Three masters; afterwards only fencing counters (elections always fence, and
    counters outlive their locks on purpose) may be left, and are removed."""
    yield ensemble.urls[:3]

    def only_counters() -> bool:
        return all(k.endswith(":fence") for keys in lock_keys(ensemble).values() for k in keys)

    wait_until(only_counters, "only fencing counters left")
    ensemble.flushall()


def start(*args: str, urls: list[str]) -> subprocess.Popen[str]:
    """Start the CLI in a session of its own (so a SIGINT sent is always forwarded),
    its output buffered as it is for any pipe (its lines must be flushed)."""
    env = clean_env(**{MASTERS_ENV: ",".join(urls)})
    env.pop("PYTHONUNBUFFERED", None)
    return subprocess.Popen(
        [*CLI, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def queued(urls: list[str], name: str) -> int:
    """How many candidates wait to lead ``name`` on a quorum of the masters."""
    with LockManager(urls) as mgr:
        counts = sorted(
            (sum(len(lv.queue) for lv in view.locks if lv.kind == "election") for view in
             mgr.inspect(name)),
            reverse=True,
        )  # fmt: skip
    return counts[len(urls) // 2]


def leader_json(urls: list[str], name: str) -> dict[str, object]:
    result = run_cli("leader", "--json", name, masters=urls)
    document: dict[str, object] = json.loads(result.stdout)
    assert result.returncode == (0 if document["leader"] else EXIT_NOBODY), result.stderr
    return document


def test_help_of_the_new_commands() -> None:
    for command in ("elect", "leader"):
        run_cli(command, "--help", ok=True)
    assert "REDREENTRANT_FENCE" in run_cli("elect", "--help").stdout
    assert "--fencing" in run_cli("run", "--help").stdout
    assert all(c in run_cli("--help").stdout for c in ("elect", "leader"))


# -- elect ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [("host-a", "host-a"), ("", ""), ("caf\u00e9-\udcff", "caf\u00e9-\\xff")],
    ids=["text", "empty", "not-utf8"],
)
def test_elect_runs_the_command_while_leading_with_the_term_in_its_environment(
    urls: list[str], value: str, shown: str
) -> None:
    # The command looks at the election itself, through the CLI: $PPID is elect's pid.
    look = f'echo "$REDREENTRANT_FENCE $PPID"; {PY} -m redreentrant leader --json vote'
    result = run_cli(
        "elect", "--value", value, "vote", "--", "sh", "-c", look, masters=urls, ok=True
    )
    first, rest = result.stdout.split("\n", 1)
    fence, elect_pid = map(int, first.split())
    leader = json.loads(rest)["leader"]
    assert leader["term"] == fence
    assert leader["value"] == shown
    assert leader["who"]["pid"] == elect_pid and leader["who"]["name"] == "MainThread"
    assert 0 < leader["validity"] <= 30
    # Resigned when the command ended.
    assert leader_json(urls, "vote")["leader"] is None


def test_elect_passes_the_exit_status_through(urls: list[str]) -> None:
    result = run_cli("elect", "vote", "--", "sh", "-c", "exit 7", masters=urls)
    assert result.returncode == 7 and result.stderr == ""
    missing = run_cli("elect", "vote", "--", "no-such-command-here", masters=urls)
    assert missing.returncode == 127
    no_command = run_cli("elect", "vote", masters=urls)
    assert no_command.returncode == 2 and "after '--'" in no_command.stderr
    # A lease too short for its drift allowance: the message names the lease, not the
    # masters alone.
    short = run_cli("elect", "--lease", "0.001", "vote", "--", "true", masters=urls)
    assert short.returncode == 2 and "bad masters or settings" in short.stderr
    assert "lease" in short.stderr.split("):", 1)[1]


def test_a_second_elect_waits_and_leads_when_the_first_command_ends(
    urls: list[str], tmp_path: Path
) -> None:
    go = tmp_path / "go"
    first = start("elect", "--value", "a", "vote", "--", PY, "-c", FENCED_WAIT, str(go), urls=urls)
    second = None
    try:
        first_fence = int(read_line(first).split()[0])
        second = start("elect", "--value", "b", "vote", "--", PY, "-c", FENCED_WAIT, urls=urls)
        wait_until(lambda: queued(urls, "vote") == 1, "the second candidate in line")
        leader = leader_json(urls, "vote")["leader"]
        assert isinstance(leader, dict) and leader["value"] == "a"
        assert leader["term"] == first_fence
        go.touch()  # the first command ends: the first elect resigns
        assert first.wait(timeout=30) == 0
        second_fence = int(read_line(second).split()[0])
        assert second_fence > first_fence
        leader = leader_json(urls, "vote")["leader"]
        assert isinstance(leader, dict) and leader["value"] == "b"
        assert leader["term"] == second_fence
        second.send_signal(signal.SIGTERM)  # forwarded; the command dies of it
        assert second.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        stop(first, second)
    assert leader_json(urls, "vote")["leader"] is None


def test_a_waiting_elect_interrupted_leaves_the_line(urls: list[str], tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with LockManager(urls) as mgr, mgr.election("vote").campaign(b"held"):
        waiting = start("elect", "vote", "--", "touch", str(marker), urls=urls)
        try:
            wait_until(lambda: queued(urls, "vote") == 1, "the candidate in line")
            waiting.send_signal(signal.SIGTERM)
            _, err = waiting.communicate(timeout=30)
            assert waiting.returncode == 128 + signal.SIGTERM
            assert "before the command started" in err
            wait_until(lambda: queued(urls, "vote") == 0, "the line empty")
        finally:
            stop(waiting)
    assert not marker.exists()


def test_elect_with_timeout_0_runs_nothing_when_someone_leads(urls: list[str]) -> None:
    with LockManager(urls) as mgr, mgr.election("vote").campaign(b"held"):
        result = run_cli("elect", "--timeout", "0", "-E", "75", "vote", "--", "true", masters=urls)
        assert result.returncode == 75
        assert "held elsewhere" in result.stderr


@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux's")
def test_a_standby_leads_about_one_lease_after_the_leader_is_killed(urls: list[str]) -> None:
    lease = str(LEASE)
    leader = start("elect", "--lease", lease, "vote", "--", PY, "-c", FENCED_WAIT, urls=urls)
    standby = None
    try:
        leader_fence, leader_command = map(int, read_line(leader).split())
        standby = start("elect", "--lease", lease, "vote", "--", PY, "-c", FENCED_WAIT, urls=urls)
        wait_until(lambda: queued(urls, "vote") == 1, "the standby in line")
        killed = time.monotonic()
        leader.kill()  # SIGKILL: no resignation; the lease runs out
        wait_until(lambda: gone(leader_command), "the leader's command dead with it")
        # A bound on an observable event, generous: one lease, plus slack for a slow host.
        standby_fence = int(read_line(standby, limit=LEASE + 10).split()[0])
        assert time.monotonic() - killed < LEASE + 10
        assert standby_fence > leader_fence
        standby.send_signal(signal.SIGTERM)
        assert standby.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        stop(leader, standby)


def test_lost_leadership_stops_the_command_as_run_does(urls: list[str]) -> None:
    elect = start("elect", "--lease", str(LEASE), "vote", "--", PY, "-c", FENCED_WAIT, urls=urls)
    try:
        read_line(elect)
        assert run_cli("unlock", "--force", "vote", masters=urls).returncode == 0
        _, err = elect.communicate(timeout=30)
        assert elect.returncode == 1  # run's status for a lock lost while CMD ran
        assert "leadership of 'vote' lost while the command ran" in err
        assert "stopping it" in err
    finally:
        stop(elect)


def test_fence_raises_the_terms_of_an_election(urls: list[str]) -> None:
    raised = run_cli(
        "fence", "vote", "--at-least", "5000", "--kind", "election", masters=urls, ok=True
    )
    assert "(election) to at least 5000 on 3 of 3 masters" in raised.stdout
    look = 'echo "$REDREENTRANT_FENCE"'
    result = run_cli("elect", "vote", "--", "sh", "-c", look, masters=urls)
    assert result.returncode == 0 and result.stdout == "5001\n"


def test_fence_without_a_token_resumes_an_election_whose_terms_were_lost(
    urls: list[str],
) -> None:
    # The FencingError's advice, as written: `redreentrant fence NAME --kind election`.
    look = 'echo "$REDREENTRANT_FENCE"'
    first = run_cli("elect", "vote", "--", "sh", "-c", look, masters=urls, ok=True)
    counter = ELECTION.fence_key("vote")
    for url in urls[:2]:  # lost on a majority, kept on one
        with redis.Redis.from_url(url) as r:
            assert r.delete(counter) == 1
    # (The counters deleted on masters that kept their memory: the refusal is that of a
    # manager without a quarantine; with one, their clocks would stand for them.)
    quarantine = ["--quarantine", "0"]
    refused = run_cli("elect", "vote", *quarantine, "--", "sh", "-c", look, masters=urls)
    assert refused.returncode == 1 and "fencing counter was lost" in refused.stderr
    assert "redreentrant fence NAME" in refused.stderr
    raised = run_cli("fence", "vote", "--kind", "election", masters=urls, ok=True)
    assert "(election) to at least" in raised.stdout and "on 3 of 3 masters" in raised.stdout
    again = run_cli("elect", "vote", "--", "sh", "-c", look, masters=urls, ok=True)
    assert int(again.stdout) > int(first.stdout)


# -- run --fencing -------------------------------------------------------------------

#: docs/cli.md's example, as written there
FENCE_EXAMPLE = ["sh", "-c", 'echo "fence=$REDREENTRANT_FENCE"']


@pytest.mark.parametrize("flags", [[], ["--fair"], ["--write"]], ids=["lock", "fair", "write"])
def test_run_fencing_exports_a_token_that_grows(urls: list[str], flags: list[str]) -> None:
    tokens = []
    for _ in range(2):
        result = run_cli(
            "run", "--fencing", *flags, "orders", "--", *FENCE_EXAMPLE, masters=urls, ok=True
        )
        key, _, token = result.stdout.strip().partition("=")
        assert key == "fence"
        tokens.append(int(token))
    assert tokens[1] > tokens[0]
    with LockManager(urls, fencing=True) as mgr:
        lock = mgr.fair_lock("orders") if flags == ["--fair"] else mgr.lock("orders")
        if flags == ["--write"]:
            lock = mgr.rw_lock("orders").write
        with lock:
            assert lock.token > tokens[1]  # the same sequence as the library's


def test_run_without_fencing_exports_no_token(urls: list[str]) -> None:
    look = 'echo "fence=${REDREENTRANT_FENCE-none}"'
    result = run_cli("run", "orders", "--", "sh", "-c", look, masters=urls)
    assert result.returncode == 0 and result.stdout == "fence=none\n"


@pytest.mark.parametrize("flags", [["--shared"], ["--permits", "2"]], ids=["shared", "permits"])
def test_run_fencing_refuses_holds_without_a_token(
    urls: list[str], flags: list[str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    result = run_cli("run", "--fencing", *flags, "orders", "--", "touch", str(marker), masters=urls)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("redreentrant: --fencing does not go with " + flags[0])
    assert not marker.exists()


# -- leader --------------------------------------------------------------------------


def test_unreachable_masters_fail_with_one_line() -> None:
    urls = [f"redis://127.0.0.1:{free_port()}/0" for _ in range(3)]
    for args, status in [
        (["leader", "vote"], 1),
        (["leader", "--watch", "vote"], 1),  # at the start: nothing to watch
        (["elect", "-E", "75", "vote", "--", "true"], 75),
    ]:
        result = run_cli(*args, masters=urls)
        assert result.returncode == status, (args, result.stderr)
        [line] = result.stderr.splitlines()
        assert line.startswith("redreentrant: ") and "masters unavailable" in line
        assert result.stdout == ""


def test_leader_when_nobody_leads(urls: list[str]) -> None:
    result = run_cli("leader", "vote", masters=urls)
    assert result.returncode == EXIT_NOBODY
    assert result.stdout == "election 'vote': nobody leads\n" and result.stderr == ""
    document = leader_json(urls, "vote")
    assert document["name"] == "vote" and document["leader"] is None


def test_leader_shows_who_leads(urls: list[str]) -> None:
    with LockManager(urls) as mgr, mgr.election("vote").campaign(b"10.0.0.7:5432") as led:
        result = run_cli("leader", "vote", masters=urls, ok=True)
        line = result.stdout.strip()
        me = parse_owner(mgr.owner_id())
        assert me is not None and line.startswith(f"election 'vote': led by host {me.host} ")
        assert f"pid {os.getpid()} thread MainThread, term {led.term}, " in line
        assert 'value "10.0.0.7:5432"' in line and line.endswith(f"(owner {mgr.owner_id()})")


def test_leader_watch_json_prints_each_change(urls: list[str]) -> None:
    watch = start("leader", "--watch", "--json", "vote", urls=urls)
    try:

        def next_state() -> dict[str, object] | None:
            document = json.loads(read_line(watch))
            assert document["name"] == "vote"
            leader: dict[str, object] | None = document["leader"]
            return leader

        assert next_state() is None
        with LockManager(urls) as mgr:
            election = mgr.election("vote").campaign(b"one")
            state = next_state()
            assert state is not None
            assert (state["owner"], state["value"], state["term"]) == (
                mgr.owner_id(),
                "one",
                election.term,
            )
            election.proclaim(b"two")
            state = next_state()
            assert state is not None and (state["value"], state["term"]) == ("two", election.term)
            election.resign()
            assert next_state() is None
        watch.send_signal(signal.SIGINT)  # Ctrl-C quits, with 0
        out, err = watch.communicate(timeout=30)
        assert watch.returncode == 0 and out == "" and err == ""
    finally:
        stop(watch)
