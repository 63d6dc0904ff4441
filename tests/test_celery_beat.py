"""``redreentrant.celery.LeaderScheduler``: several ``celery beat`` processes, one sends;
a killed leader is followed within a lease, a stopped one at once; no entry is sent twice
for one due time; a deposed leader's late send is refused by the store's fence; a lost
leadership is seen within the lease.

The beats are real ``celery beat`` processes (app: tests/celery_beat_app.py) on a broker
of the test's own (a Redis that is not one of the masters); no worker runs: the tests
read the messages the beats left on the broker's ``celery`` list.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.signals import before_task_publish
from celery_beat_app import INTERVALS
from helpers import drop_counters, start_celery, stop_celery, wait_until

from redreentrant import FencedStore, LockManager
from redreentrant.celery import LeaderScheduler
from redreentrant.celery.beat import state_key
from redreentrant.testing import LocalEnsemble

#: how much earlier than its interval an entry's next send may come: the time between
#: a send's reserve (which sets last_run_at) and its message, under a loaded machine
EARLY = 0.1
#: what a takeover may take beyond the lease: the successor's tick and its first send
MARGIN = 2.0


@dataclass(frozen=True)
class Sent:
    """One message a beat put on the broker."""

    entry: str
    pid: int
    at: float  # time.time() of the send


@pytest.fixture
def queue(broker: str) -> str:
    """The beats' broker (a Redis of its own, not one of the masters), emptied."""
    with redis.Redis.from_url(broker) as r:
        r.flushall()
    return broker


def start_beat(tmp_path: Path, queue: str, urls: list[str], lease: float, name: str,
               index: int) -> subprocess.Popen[str]:  # fmt: skip
    """A ``celery beat`` process with the leader scheduler; its output goes to
    ``beat<index>.log`` in ``tmp_path``."""
    env = {
        "BEAT_BROKER": queue,
        "BEAT_MASTERS": ",".join(urls),
        "BEAT_LEASE": str(lease),
        "BEAT_NAME": name,
    }
    return start_celery(
        "-A", "celery_beat_app", "beat", "-S", "redreentrant.celery.LeaderScheduler",
        "--loglevel=INFO", "--schedule", str(tmp_path / f"schedule{index}"),
        env=env, log=tmp_path / f"beat{index}.log",
    )  # fmt: skip


def show_logs(tmp_path: Path) -> None:
    """Print the beats' logs (pytest shows them when the test failed)."""
    for log in sorted(tmp_path.glob("beat*.log")):
        print(f"--- {log.name}\n{log.read_text()}")


def sent(queue: str) -> list[Sent]:
    """The messages on the broker's ``celery`` list, oldest first."""
    with redis.Redis.from_url(queue) as r:
        raw = r.lrange("celery", 0, -1)
    out = []
    for item in raw:
        headers = json.loads(item)["headers"]
        out.append(Sent(headers["beat_entry"], headers["beat_pid"], headers["beat_sent_at"]))
    return sorted(out, key=lambda s: s.at)


def from_pid(history: list[Sent], pid: int) -> list[Sent]:
    return [s for s in history if s.pid == pid]


def check_history(history: list[Sent], store_url: str, name: str) -> None:
    """No entry was sent twice for one due time: each entry's sends, whoever sent them,
    are at least its interval apart (less ``EARLY``), and the run count the store kept
    for it matches its sends (one more when a leader was killed between the count's
    write and the send)."""
    with redis.Redis.from_url(store_url) as r:
        for entry, every in INTERVALS.items():
            times = [s.at for s in history if s.entry == entry]
            gaps = [b - a for a, b in itertools.pairwise(times)]
            assert times and min(gaps) >= every - EARLY, (entry, gaps)
            stored = json.loads(r.get(state_key(name, f"entry:{entry}")) or "{}")
            assert stored["total_run_count"] - len(times) in (0, 1), (entry, stored, times)


def leading(store_url: str, name: str) -> str | None:
    """The value of the last leader that took over, as the store's marker has it."""
    with redis.Redis.from_url(store_url) as r:
        raw = r.get(state_key(name, "leader"))
    return None if raw is None else str(json.loads(raw)["leader"])


@contextlib.contextmanager
def running_beats(
    tmp_path: Path, queue: str, urls: list[str], lease: float, name: str, count: int
) -> Iterator[list[subprocess.Popen[str]]]:
    """``count`` beats, once one of them sends: the leader first, then the others;
    all stopped at the end (their logs printed)."""
    beats = [start_beat(tmp_path, queue, urls, lease, name, i) for i in range(count)]
    try:
        wait_until(lambda: len(sent(queue)) >= 3, "sending", limit=30)
        leader = sent(queue)[0].pid
        yield sorted(beats, key=lambda b: b.pid != leader)
    finally:
        for beat in beats:
            stop_celery(beat)
        show_logs(tmp_path)


def terminate(process: subprocess.Popen[str]) -> int:
    """Stop a beat as a supervisor does (SIGTERM); its exit status."""
    process.send_signal(signal.SIGTERM)
    return process.wait(15)


def test_one_beat_sends_and_a_killed_leader_is_followed_within_a_lease(
    ensemble: LocalEnsemble, urls: list[str], queue: str, tmp_path: Path
) -> None:
    lease, name = 2.0, "beat-killed"
    with running_beats(tmp_path, queue, urls, lease, name, 2) as (leader, other):
        leader_pid = leader.pid
        so_far = len(sent(queue))
        wait_until(lambda: len(sent(queue)) >= so_far + 6, "six more sends")  # 2 s or so
        assert {s.pid for s in sent(queue)} == {leader_pid}  # the other one only waits
        assert other.poll() is None

        leader.kill()
        killed_at = time.time()
        leader.wait()
        wait_until(lambda: from_pid(sent(queue), other.pid), "the successor sending", 30)
        took = from_pid(sent(queue), other.pid)[0].at - killed_at
        print(f"the successor's first send {took:.2f} s after the kill")
        assert took < lease + MARGIN, f"took over {took:.2f} s after the kill"
        wait_until(lambda: len(from_pid(sent(queue), other.pid)) >= 6, "the successor's sends")
        assert terminate(other) == 0  # resigns: nothing of the election is left but its terms

        history = sent(queue)
        assert {s.pid for s in history} == {leader_pid, other.pid}
        assert all(s.at <= killed_at for s in from_pid(history, leader_pid))
        check_history(history, urls[0], name)
    drop_counters(ensemble)


def test_a_stopped_follower_leaves_the_line_and_a_stopped_leader_is_followed_at_once(
    ensemble: LocalEnsemble, urls: list[str], queue: str, tmp_path: Path
) -> None:
    lease, name = 4.0, "beat-stopped"
    with running_beats(tmp_path, queue, urls, lease, name, 3) as (leader, standby, gone):
        leader_pid = leader.pid
        assert (leading(urls[0], name) or "").endswith(f":{leader_pid}")
        # A follower stopped while it campaigns leaves at once (and leaves nothing behind:
        # the fixture checks that only the election's terms are left at the end).
        stopped_at = time.monotonic()
        assert terminate(gone) == 0
        assert time.monotonic() - stopped_at < lease / 2

        stopped_at = time.monotonic()
        assert terminate(leader) == 0
        wait_until(lambda: (leading(urls[0], name) or "").endswith(f":{standby.pid}"), "followed")
        took = time.monotonic() - stopped_at
        print(f"the successor took over {took:.2f} s after the stop")
        assert took < lease / 2, f"took over {took:.2f} s after the stop"  # woken, not expired
        wait_until(lambda: len(from_pid(sent(queue), standby.pid)) >= 3, "the successor's sends")
        assert terminate(standby) == 0

        history = sent(queue)
        assert {s.pid for s in history} == {leader_pid, standby.pid}
        check_history(history, urls[0], name)
    drop_counters(ensemble)


def beat_app(urls: list[str], name: str, every: float) -> Celery:
    """An in-process app with one entry (``e``, every ``every`` seconds), the election
    ``name``, and a broker in memory."""
    app = Celery(name, broker="memory://")
    app.conf.update(
        redreentrant_masters=urls,
        redreentrant_beat_name=name,
        beat_schedule={"e": {"task": f"{name}.noop", "schedule": every}},
    )
    return app


def test_a_deposed_leaders_late_send_is_refused(
    ensemble: LocalEnsemble, urls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    name = "beat-deposed"
    app = beat_app(urls, name, 0.2)
    published: list[float] = []

    def count(headers: dict[str, Any] | None = None, **_: Any) -> None:
        if headers is not None and headers.get("task") == f"{name}.noop":
            published.append(time.monotonic())

    before_task_publish.connect(count, weak=False)
    # The old leader's lease is long: its watchdog does not learn of its end during the
    # test, so it still believes it leads when it sends late.
    with LockManager(urls, lease=30.0) as slow, LockManager(urls, lease=2.0) as fast:
        old = LeaderScheduler(app, manager=slow)
        new = LeaderScheduler(app, manager=fast)
        try:
            while not published:  # the old leader leads and sends
                time.sleep(max(0.0, old.tick()))
            old_term = old.term
            assert old_term is not None
            assert fast.election(name).force_unlock()  # its leadership ends: it is not told
            new.tick()
            assert new.term is not None and new.term > old_term

            before = len(published)
            deadline = time.monotonic() + 5
            while old.term is not None and time.monotonic() < deadline:
                # The entry comes due: the old leader tries to send it.
                time.sleep(max(0.0, old.tick()))
            assert old.term is None  # it stopped leading ...
            assert len(published) == before  # ... and sent nothing
            assert f"the store refused term {old_term}" in caplog.text
            with redis.Redis.from_url(urls[0]) as r:
                term_key = state_key(name, "term")
                store = FencedStore(r, state_key(name, "entry:e"), token_key=term_key)
                assert store.largest_token() == new.term
                state = json.loads(store.read() or b"{}")
            assert state["term"] in (old_term, new.term)  # the new leader's, once it sent
            assert datetime.fromisoformat(state["last_run_at"]).tzinfo is not None
        finally:
            before_task_publish.disconnect(count)
            old.close()
            new.close()
    drop_counters(ensemble)


def test_a_lost_leadership_is_seen_within_the_lease_and_the_beat_campaigns_again(
    ensemble: LocalEnsemble, urls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    name = "beat-lost"
    with LockManager(urls, lease=2.0) as mgr, LockManager(urls, lease=2.0) as operator:
        scheduler = LeaderScheduler(beat_app(urls, name, 0.2), manager=mgr)
        try:
            scheduler.tick()
            first = scheduler.term
            assert first is not None
            assert operator.election(name).force_unlock()  # seen at the next renewal
            ended_at = time.monotonic()
            while scheduler.term in (first, None) and time.monotonic() < ended_at + 5:
                time.sleep(max(0.0, scheduler.tick()))
            took = time.monotonic() - ended_at
            assert scheduler.term is not None and scheduler.term > first
            assert took < mgr.lease, f"led again {took:.2f} s after the leadership ended"
            assert "its leadership was lost" in caplog.text
        finally:
            scheduler.close()
    drop_counters(ensemble)


def test_without_masters_in_the_configuration_a_store_must_be_named(urls: list[str]) -> None:
    with LockManager(urls, lease=2.0) as mgr:
        app = beat_app([], "beat-no-store", 1.0)
        with pytest.raises(ValueError, match="redreentrant_beat_store"):
            LeaderScheduler(app, manager=mgr)
        app.conf.redreentrant_beat_store = urls[1]
        scheduler = LeaderScheduler(app, manager=mgr)
        try:
            assert scheduler.max_interval <= mgr.lease / 3
        finally:
            scheduler.close()


def test_a_lazy_scheduler_connects_nowhere() -> None:
    # celery beat makes one for its banner: no masters needed, nothing opened.
    scheduler = LeaderScheduler(beat_app([], "beat-lazy", 1.0), lazy=True)
    assert "beat-lazy" in scheduler.info
