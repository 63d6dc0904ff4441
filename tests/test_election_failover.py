"""Failover of a leader election: candidate processes campaign on one name, the test
kills the leader (SIGKILL) again and again, and an observer in the test process watches.

Each candidate is a ``lead`` worker of the fault suite (``fault_worker.py``, mode
``hold``): its own manager with a short lease, it campaigns (with no time limit),
prints ``held TERM`` once it leads, and records what it saw (history.py). Leadership
must always move on to a live candidate, about a lease after the leader died; every
new leader's term must be larger; the observer must see each leader, with terms that
only grow; the candidates' histories must pass the checker; and at the end nothing of
the election is left on the masters but its fencing counter, which persists by design.
An observer that starts while a leader leads must report each leader once.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from helpers import heal, wait_until

from redreentrant import LeaderView, LockManager
from redreentrant._core.keys import PREFIX
from redreentrant.cli._process import die_with_parent
from redreentrant.testing import LocalEnsemble, LocalServer
from redreentrant.testing.history import check, load

pytestmark = pytest.mark.integration  # starts its own resource server, and candidates

WORKER = Path(__file__).with_name("fault_worker.py")
NAME = "failover"
#: the candidates' lease: short, so that a dead leader's lease ends soon
LEASE = 1.0
#: a generous bound on a failover (a lease, then the next candidate's turn), for waits
FAILOVER_LIMIT = LEASE + 9.0
#: candidates alive at any time (each one killed is replaced), and leaders killed
CANDIDATES = 3
KILLS = 4


class Candidates:
    """The candidate processes, whose output lines arrive on one queue."""

    def __init__(self, tmp: Path, urls: list[str], resource: str) -> None:
        self.tmp = tmp
        self.urls = urls
        self.resource = resource
        self.processes: dict[str, subprocess.Popen[str]] = {}
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self.count = 0

    def start(self) -> str:
        """Start one more candidate (from the test's thread: it dies with the test);
        its name."""
        client = f"c{self.count}"
        self.count += 1
        spec = {
            "urls": self.urls,
            "resource": self.resource,
            "lock": NAME,
            "kind": "lead",
            "mode": "hold",
            "client": client,
            "history": str(self.tmp / f"{client}.jsonl"),
            "manager_lease": LEASE,
            "timeout": -1,  # campaign with no time limit: stay in line
        }
        process = subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent(),
        )
        self.processes[client] = process

        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                self.lines.put((client, line.strip()))
            self.lines.put((client, "<eof>"))

        threading.Thread(target=read, daemon=True).start()
        return client

    def next_leader(self, limit: float) -> tuple[str, int]:
        """The next candidate to say it leads, and its term (failing after ``limit``
        seconds, or if a candidate ends first)."""
        end = time.monotonic() + limit
        while True:
            try:
                client, line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no candidate led within {limit:g} s")
            if line.startswith("held "):
                return client, int(line.split()[1])
            if line == "<eof>" and self.processes[client].returncode is None:
                self.processes[client].wait(5)
                if self.processes[client].returncode != -signal.SIGKILL:
                    pytest.fail(f"candidate {client} ended unasked")

    def kill(self, client: str) -> None:
        process = self.processes[client]
        process.kill()
        process.wait()

    def resign(self, client: str) -> None:
        """Tell a leading candidate to go on: it writes under its term, resigns, ends."""
        process = self.processes[client]
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
        process.wait(20)
        assert process.returncode == 0, f"candidate {client} exited with {process.returncode}"

    def wait_renewed(self, client: str) -> None:
        """Return once the candidate recorded a renewal of its lease."""
        history = self.tmp / f"{client}.jsonl"
        wait_until(
            lambda: any(e.op == "renew" for e in load(history)), f"{client} renewing its lease"
        )

    def alive(self, client: str) -> bool:
        return self.processes[client].poll() is None

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()


class Observer:
    """``observe()`` of the election in a thread of the test process: every report,
    with when it came."""

    def __init__(self, mgr: LockManager) -> None:
        self.seen: list[tuple[float, LeaderView | None]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._mgr = mgr
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for view in self._mgr.election(NAME).observe():
                self.seen.append((time.monotonic(), view))
                if self.stop.is_set():
                    return
        except BaseException as error:  # the test reports it
            self.error = error

    def wait_for(self, term: int) -> None:
        """Return once it reported a leader of ``term``."""
        wait_until(
            lambda: any(v is not None and v.term == term for _, v in self.seen),
            f"the observer seeing term {term}",
        )

    def join(self, limit: float) -> None:
        self._thread.join(limit)
        assert not self._thread.is_alive(), "the observer did not see the last change"
        assert self.error is None, f"the observer failed: {self.error!r}"

    def terms(self) -> list[int]:
        """The terms of the leaders it saw, in the order it reported them."""
        return [v.term for _, v in self.seen if v is not None]


@pytest.fixture(scope="module")
def resource() -> Iterator[LocalServer]:
    """The resource the leaders write to under their terms (not a master)."""
    with LocalServer() as server:
        yield server


@pytest.fixture
def masters(_ensemble5: LocalEnsemble) -> Iterator[LocalEnsemble]:
    heal(_ensemble5)
    _ensemble5.flushall()
    yield _ensemble5
    heal(_ensemble5)
    _ensemble5.flushall()


def left_on_masters(masters: LocalEnsemble) -> dict[str, list[str]]:
    """The library's keys on each master that has any but the election's fencing
    counter (which outlives the election on purpose)."""
    out = {}
    for url, keys in masters.keys(PREFIX + "{*").items():
        rest = [k for k in keys if not k.endswith(":election:fence")]
        if rest:
            out[url] = rest
    return out


def test_leadership_moves_on_as_leaders_are_killed_in_turn(
    masters: LocalEnsemble, resource: LocalServer, tmp_path: Path
) -> None:
    candidates = Candidates(tmp_path, masters.urls, resource.url)
    leaders: list[tuple[str, int]] = []
    killed: set[str] = set()
    failovers: list[float] = []  # seconds from a leader's death to the next leader

    def next_leader(observer: Observer, died: float | None) -> str:
        """The next leader: a live candidate, with a larger term, that the observer
        sees lead."""
        leader, term = candidates.next_leader(FAILOVER_LIMIT if leaders else 15.0)
        if died is not None:
            failovers.append(time.monotonic() - died)
        assert leader not in killed and candidates.alive(leader), (leader, killed)
        assert not leaders or term > leaders[-1][1], f"term {term} after {leaders}"
        leaders.append((leader, term))
        observer.wait_for(term)
        return leader

    with LockManager(masters.urls, lease=LEASE) as mgr:
        observer = Observer(mgr)
        try:
            wait_until(lambda: observer.seen, "the observer's first report")
            assert observer.seen[0][1] is None  # nobody leads yet
            for _ in range(CANDIDATES):
                candidates.start()
            died = None
            for _ in range(KILLS):
                leader = next_leader(observer, died)
                # Killed once its lease was renewed: the history holds the validity
                # its renewal reported, which the next leader must wait out.
                candidates.wait_renewed(leader)
                candidates.kill(leader)
                died = time.monotonic()
                killed.add(leader)
                candidates.start()  # a new candidate joins the line
            # The last ones lead in turn and resign; the observer then sees nobody.
            for i in range(CANDIDATES):
                leader = next_leader(observer, died if i == 0 else None)
                if i == CANDIDATES - 1:
                    observer.stop.set()  # the next report, nobody, is its last
                candidates.resign(leader)
            observer.join(FAILOVER_LIMIT)
        finally:
            candidates.close()
    # Every leader was seen by the observer, whose terms only grew.
    terms = [term for _, term in leaders]
    seen = observer.terms()
    assert seen == sorted(set(seen)), f"the observer saw terms go back or repeat: {seen}"
    assert set(terms) <= set(seen), f"leaders the observer missed: {set(terms) - set(seen)}"
    assert observer.seen[-1][1] is None
    # A killed leader's lease ran out before the next one led: about a lease each.
    assert len(failovers) == KILLS, failovers
    assert all(f < FAILOVER_LIMIT for f in failovers), failovers
    # The histories: one leader at a time, terms growing, no stale fenced write.
    events = load(sorted(tmp_path.glob("*.jsonl")))
    report = check(events)
    assert report.ok, report.format()
    assert [h.token for h in report.holds] == terms
    assert {h.ended_by for h in report.holds[:KILLS]} == {"validity"}
    with redis.Redis.from_url(resource.url) as r:
        assert int(r.get(f"{{{NAME}}}:fenced:fencing-token") or 0) == terms[-1]
    # Nothing of the election is left on the masters but its fencing counter.
    wait_until(lambda: not left_on_masters(masters), "the election's keys gone", LEASE + 5)


def test_an_observer_that_joins_under_a_leader_sees_each_leader_once(
    masters: LocalEnsemble, resource: LocalServer, tmp_path: Path
) -> None:
    # The observer starts while a leader leads; that leader is killed, the next one
    # leads and resigns. Reported: the first leader, (nobody,) the second, nobody.
    candidates = Candidates(tmp_path, masters.urls, resource.url)
    with LockManager(masters.urls, lease=LEASE) as mgr:
        try:
            candidates.start()
            first, first_term = candidates.next_leader(15.0)
            candidates.start()
            observer = Observer(mgr)
            observer.wait_for(first_term)
            candidates.kill(first)
            second, second_term = candidates.next_leader(FAILOVER_LIMIT)
            assert second != first and second_term > first_term
            observer.wait_for(second_term)
            observer.stop.set()
            candidates.resign(second)
            observer.join(FAILOVER_LIMIT)
        finally:
            candidates.close()
    seen = [None if v is None else v.term for _, v in observer.seen]
    assert [t for t in seen if t is not None] == [first_term, second_term], (
        f"the observer reported {seen}: a leader reported twice in a row is no change "
        "(observe() yields the leader its first read found, then that same leader again)"
    )
    assert seen[-1] is None
