"""Singleton Celery tasks (``redreentrant.celery.Singleton``) with a real Celery: a Redis
broker on a local server, worker processes with the prefork pool, five lock masters.
Duplicates skipped, waited for and refused; the key taken at send and handed to the
worker; a worker SIGKILLed mid-task, and a task killed by its hard time limit, free
the key within one lease; two workers on two "hosts" never run one key at once (a
history checked, and a non-atomic counter). The tasks are in tests/celery_app.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import TESTS, drop_counters, start_celery, stop_celery, wait_until

from redreentrant import LockLostError, LockManager
from redreentrant._core.keys import MEMORY_KEY
from redreentrant.celery import DuplicateTaskError, Singleton, skipped
from redreentrant.testing import LocalEnsemble
from redreentrant.testing.history import check, load

LEASE = 2.0
#: what a worker's readiness is told by in its log
READY = "ready."


@pytest.fixture
def celery(broker: str, urls: list[str], tmp_path: Path) -> Iterator[Any]:
    """The tests' app (tests/celery_app.py) configured for ``broker`` and the masters;
    ``celery.start(name)`` starts a worker (stopped after the test)."""
    redis.Redis.from_url(broker).flushall()
    redis.Redis.from_url(broker.replace("/0", "/1")).flushall()
    history = tmp_path / "history"
    history.mkdir()
    env = {
        "CELERY_TEST_BROKER": broker,
        "CELERY_TEST_MASTERS": ",".join(urls),
        "CELERY_TEST_LEASE": str(LEASE),
        "CELERY_TEST_HISTORY": str(history),
    }
    os.environ.update(env)  # the app module reads them when imported here
    import celery_app

    celery_app.app.conf.update(
        broker_url=broker,
        result_backend=broker.replace("/0", "/1"),
        redreentrant_masters=urls,
    )
    workers: list[subprocess.Popen[str]] = []

    def start(name: str, concurrency: int = 2) -> subprocess.Popen[str]:
        log = tmp_path / f"{name}.log"
        worker = start_celery(
            "-A", "celery_app", "worker", "--pool=prefork", f"--concurrency={concurrency}",
            "-n", f"{name}@{name}", "--without-gossip", "--without-mingle",
            "--without-heartbeat", "--loglevel=INFO",
            env=env, log=log,
        )  # fmt: skip
        workers.append(worker)
        wait_until(lambda: READY in log.read_text(), f"worker {name} ready", limit=60)
        return worker

    celery_app.start = start
    celery_app.history = history
    try:
        yield celery_app
    finally:
        for worker in workers:
            stop_celery(worker, signal.SIGTERM)
        # The results' subscriber: closed, so that a result collected after the broker
        # stopped does not try to unsubscribe (and reconnect) there.
        consumer = celery_app.app.backend.result_consumer
        consumer.stop()
        consumer._pubsub = None
        for key in ("CELERY_TEST_BROKER", "CELERY_TEST_MASTERS", "CELERY_TEST_HISTORY"):
            os.environ.pop(key, None)


def counter(broker: str, key: str) -> int:
    return int(redis.Redis.from_url(broker).get(f"counter:{key}") or 0)


def no_overlap(history: Path, runs: int | None = None) -> None:
    events = load(sorted(history.glob("*.jsonl")))
    report = check(events)
    assert not report.violations, report.violations
    if runs is not None:
        assert sum(e.op == "acquire" for e in events) == runs


def test_a_duplicate_is_skipped_and_its_result_says_so(celery: Any, broker: str) -> None:
    celery.start("one")
    first = celery.skip.delay("k", 1.5)
    wait_until(lambda: counter(broker, "k") == 1, "the first runs")
    second = celery.skip.delay("k", 0)
    assert skipped(second.get(timeout=30))
    assert second.get() == {"skipped": "duplicate", "key": 'celery:celery_app.skip:{"key":"k"}'}
    assert isinstance(first.get(timeout=30), int)
    third = celery.skip.delay("k", 0)  # the key is free again
    assert not skipped(third.get(timeout=30))
    other = celery.skip.delay("another", 0)  # another key: never a duplicate
    assert not skipped(other.get(timeout=30))
    assert counter(broker, "k") == 2
    no_overlap(celery.history, runs=3)


def test_a_call_refused_by_quarantined_masters_is_not_skipped_but_waits_for_them(
    celery: Any, broker: str, urls: list[str]
) -> None:
    # Masters whose memory began now (as after a restart without their data): their
    # votes do not count for a lease. A call then is no duplicate: it runs once they do.
    celery.start("one")
    for url in urls:
        redis.Redis.from_url(url).delete(MEMORY_KEY)
    with LockManager(urls, lease=LEASE) as mgr:
        assert max(mgr.quarantined()) > 0  # this round made the records anew
    result = celery.skip.delay("fresh", 0)
    assert not skipped(result.get(timeout=30))
    assert counter(broker, "fresh") == 1


def test_calls_as_the_quarantine_ends_are_never_skipped(urls: list[str]) -> None:
    """Each call right after the masters' memory began anew: its try is refused, and
    tries again when (and as long as) the manager counts too few votes, never skipped."""
    from celery import Celery

    app = Celery("fresh", broker="memory://")
    clients = [redis.Redis.from_url(url) for url in urls]
    with LockManager(urls, lease=0.1) as mgr:  # quarantined for 0.1 s

        @app.task(base=Singleton, singleton_manager=mgr)
        def fresh(n: int) -> int:
            return n

        for n in range(20):
            for r in clients:
                r.delete(MEMORY_KEY)
            started = time.monotonic()
            assert fresh.apply((n,)).get() == n
            assert time.monotonic() - started >= 0.1  # not before its votes counted
    for r in clients:
        r.close()


def test_a_duplicate_waits_for_the_running_one(celery: Any, broker: str) -> None:
    celery.start("one", concurrency=3)
    results = [celery.wait.delay("w", 0.3) for _ in range(3)]
    assert all(isinstance(r.get(timeout=60), int) for r in results)
    assert counter(broker, "w") == 3
    no_overlap(celery.history, runs=3)


def test_a_duplicate_raises_when_asked_to(celery: Any, broker: str) -> None:
    celery.start("one")
    first = celery.refuse.delay("r", 1.5)
    wait_until(lambda: counter(broker, "r") == 1, "the first runs")
    second = celery.refuse.delay("r", 0)
    with pytest.raises(DuplicateTaskError, match=r"celery_app\.refuse"):
        second.get(timeout=30)
    first.get(timeout=30)


def test_the_key_taken_at_send_travels_with_the_message(celery: Any, broker: str) -> None:
    # No worker yet: the message waits, and its hold with it.
    first = celery.at_send.delay("s", 0)
    second = celery.at_send.delay("s", 0)
    assert skipped(second.get(timeout=5))  # refused at send, ready at once
    with LockManager(celery.app.conf.redreentrant_masters) as mgr:
        assert mgr.lock('celery:celery_app.at_send:{"key":"s"}').locked()
        celery.start("one")
        assert isinstance(first.get(timeout=30), int)
        assert not mgr.lock('celery:celery_app.at_send:{"key":"s"}').locked()
    # A message that waited longer than the hold lasts takes the key anew.
    late = celery.at_send.delay("t", 0)
    assert isinstance(late.get(timeout=30), int)
    no_overlap(celery.history, runs=2)


def test_a_send_that_fails_frees_the_key_at_once(urls: list[str]) -> None:
    from celery import Celery
    from kombu.exceptions import OperationalError

    from redreentrant.testing.loopback import free_ports

    port = free_ports(1)[0]  # nothing listens there: every send fails
    app = Celery("down", broker=f"redis://127.0.0.1:{port}/0")
    app.conf.update(task_publish_retry=False, broker_transport_options={"max_retries": 0})
    with LockManager(urls, lease=60) as mgr, LockManager(urls, lease=LEASE) as other:

        @app.task(base=Singleton, singleton_manager=mgr, singleton_at_send=True)
        def sent(n: int) -> None: ...

        with pytest.raises(OperationalError):
            sent.delay(1)
        lock = other.lock(sent.singleton_name((1,), {}))
        assert lock.acquire(blocking=False)  # free at once, not after the send lease (60 s)
        lock.release()


def test_a_message_never_run_frees_its_key_within_the_lease(celery: Any) -> None:
    celery.at_send.delay("never", 0)  # no worker runs it
    name = 'celery:celery_app.at_send:{"key":"never"}'
    with LockManager(celery.app.conf.redreentrant_masters) as mgr:
        assert mgr.lock(name).locked()
        sent = time.monotonic()
        wait_until(lambda: not mgr.lock(name).locked(), "the key is free", limit=LEASE * 3)
        assert time.monotonic() - sent < LEASE + 1.0
    redis.Redis.from_url(celery.app.conf.broker_url).flushdb()  # drop the message


def sigkill_frees(celery: Any, broker: str, kill: Callable[[int, Any], None]) -> None:
    """Start a long task, kill it with ``kill(pid of the process running it, worker)``:
    the key is free within one lease, and the task runs again."""
    worker = celery.start("victim")
    celery.skip.delay("killed", 60)
    wait_until(lambda: counter(broker, "killed") == 1, "the task runs")
    (line,) = (p for p in celery.history.glob("*.jsonl"))
    running = int(line.stem)
    name = 'celery:celery_app.skip:{"key":"killed"}'
    with LockManager(celery.app.conf.redreentrant_masters) as mgr:
        assert mgr.lock(name).locked()
        kill(running, worker)
        killed = time.monotonic()
        wait_until(lambda: not mgr.lock(name).locked(), "the key is free", limit=LEASE * 3)
        assert time.monotonic() - killed < LEASE + 1.0
    if worker.poll() is not None:
        celery.start("after")
    again = celery.skip.delay("killed", 0)
    assert not skipped(again.get(timeout=30))
    assert counter(broker, "killed") == 2


def test_a_worker_sigkilled_mid_task_frees_the_key_within_one_lease(
    celery: Any, broker: str
) -> None:
    sigkill_frees(celery, broker, lambda pid, worker: stop_celery(worker))


def test_a_pool_process_sigkilled_mid_task_frees_the_key(celery: Any, broker: str) -> None:
    sigkill_frees(celery, broker, lambda pid, worker: os.kill(pid, signal.SIGKILL))


def test_a_task_that_raises_frees_its_key_at_once(celery: Any) -> None:
    celery.start("one")
    with pytest.raises(ValueError, match="boom"):
        celery.failing.delay("boom", 0).get(timeout=30)
    with LockManager(celery.app.conf.redreentrant_masters) as mgr:
        assert not mgr.lock('celery:celery_app.failing:{"key":"boom"}').locked()


def test_a_hard_time_limit_frees_the_key_within_one_lease(celery: Any, broker: str) -> None:
    celery.start("one")
    name = 'celery:celery_app.limited:{"key":"limit"}'
    result = celery.limited.delay("limit", 60)
    wait_until(lambda: counter(broker, "limit") == 1, "the task runs")
    with pytest.raises(Exception, match=r"TimeLimitExceeded|time limit"):
        result.get(timeout=30)
    ended = time.monotonic()
    with LockManager(celery.app.conf.redreentrant_masters) as mgr:
        wait_until(lambda: not mgr.lock(name).locked(), "the key is free", limit=LEASE * 3)
    assert time.monotonic() - ended < LEASE + 1.0


def test_two_hosts_never_run_one_key_at_once(celery: Any, broker: str) -> None:
    celery.start("host1")
    celery.start("host2")
    # Each key is a task's name and its arguments: two keys of waiting calls, one of
    # calls skipped while one runs.
    results = [celery.wait.delay(f"shared{i % 2}", 0.05) for i in range(16)]
    results += [celery.skip.delay("skipped", 0.05) for _ in range(8)]
    values = [r.get(timeout=120) for r in results]
    ran = sum(not skipped(v) for v in values)
    assert 17 <= ran < 24  # every waiting call ran, and some skipped ones did not
    assert len({v for v in values if not skipped(v)}) >= 2  # several processes ran them
    counted = sum(counter(broker, k) for k in ("shared0", "shared1", "skipped"))
    assert counted == ran
    no_overlap(celery.history, runs=ran)


def test_the_task_reads_its_fencing_token(celery: Any, ensemble: LocalEnsemble) -> None:
    celery.start("one")
    first = celery.fenced.delay("f", 0).get(timeout=30)
    second = celery.fenced.delay("f", 0).get(timeout=30)
    assert 0 < first < second
    drop_counters(ensemble)  # they outlive the locks by design


def test_a_task_learns_that_its_lock_was_lost_and_ends_with_lock_lost_error(
    celery: Any, broker: str
) -> None:
    celery.start("one")
    result = celery.watch.delay("lost", 30)
    wait_until(lambda: counter(broker, "lost") == 1, "the task runs")
    with LockManager(celery.app.conf.redreentrant_masters) as mgr:
        assert mgr.lock('celery:celery_app.watch:{"key":"lost"}').force_unlock()
    started = time.monotonic()
    with pytest.raises(LockLostError):  # the task saw it (lost.wait), then ended so
        result.get(timeout=30)
    assert time.monotonic() - started < LEASE * 2


def test_the_key_is_the_task_name_and_its_arguments() -> None:
    from celery import Celery

    app = Celery("keys", broker="memory://")

    @app.task(base=Singleton)
    def plain(a: int, b: str = "x") -> None: ...

    @app.task(base=Singleton, singleton_key=("a",))
    def by_name(a: int, b: str) -> None: ...

    @app.task(base=Singleton, singleton_key=lambda a, b: f"mine:{a}")
    def by_callable(a: int, b: str) -> None: ...

    assert plain.singleton_name((1,), {}) == plain.singleton_name((), {"a": 1, "b": "x"})
    assert plain.singleton_name((1,), {}).startswith(f"celery:{plain.name}:")
    assert plain.singleton_name((1,), {}) != plain.singleton_name((2,), {})
    assert by_name.singleton_name((1, "x"), {}) == by_name.singleton_name((1, "y"), {})
    assert by_callable.singleton_name((1, "x"), {}) == "mine:1"
    long = plain.singleton_name(("y" * 500,), {})
    assert len(long) < 120 and long.startswith(f"celery:{plain.name}:")


def test_the_example_project_runs(
    broker: str, urls: list[str], ensemble: LocalEnsemble, tmp_path: Path
) -> None:
    # docs/examples/celery: a worker and two beats, as the docs start them.
    redis.Redis.from_url(broker).flushall()
    project = TESTS.parent / "docs" / "examples" / "celery"
    env = {"REDREENTRANT_MASTERS": ",".join(urls), "CELERY_BROKER_URL": broker}
    env["REFRESH_EVERY"] = "0.5"
    beat = ["-A", "tasks", "beat", "-S", "redreentrant.celery.LeaderScheduler"]
    processes = [
        start_celery("-A", "tasks", "worker", "--pool=prefork", "--concurrency=2",
                     env=env, log=tmp_path / "worker.log", cwd=project),
        *(start_celery(*beat, "--schedule", str(tmp_path / f"s{i}"), env=env,
                       log=tmp_path / f"beat{i}.log", cwd=project) for i in range(2)),
    ]  # fmt: skip
    results = redis.Redis.from_url(broker)

    def outcomes() -> list[Any]:
        metas = [json.loads(results.get(k) or "{}") for k in results.keys("celery-task-meta-*")]
        return [m.get("result") for m in metas if m.get("status") == "SUCCESS"]

    try:
        wait_until(
            lambda: (
                sum(isinstance(r, int) for r in outcomes()) >= 2
                and any(skipped(r) for r in outcomes())
            ),
            "the task ran twice, and was skipped while it ran",
            limit=60,
        )
    finally:
        for process in processes:  # cleanly: the beats resign, the worker ends its task
            stop_celery(process, signal.SIGTERM)
    tokens = [r for r in outcomes() if isinstance(r, int)]
    assert len(set(tokens)) == len(tokens)  # a fencing token per execution
    drop_counters(ensemble)
