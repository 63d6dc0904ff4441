"""The Celery app of tests/test_celery.py, imported by its worker processes (``celery -A
celery_app worker``) and by the tests, which send its tasks.

Configured from the environment: ``CELERY_TEST_BROKER`` (a Redis URL: the broker, and
the result backend on its database 1), ``CELERY_TEST_MASTERS`` (the lock masters,
comma-separated), ``CELERY_TEST_LEASE`` (the managers' lease, seconds) and
``CELERY_TEST_HISTORY`` (a directory: each process records its executions there, one
file per process, for the history checker).

Every task here runs the same body (:func:`body`) under a singleton key ``key``: it
records the hold (an acquire's ``ok`` on entry, a release's ``invoke`` on exit), does a
non-atomic increment of the counter ``counter:<key>`` on the broker's Redis (read,
sleep, write), sleeps ``seconds`` and returns its process id.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from redreentrant.celery import Singleton
from redreentrant.testing.history import Recorder

BROKER = os.environ.get("CELERY_TEST_BROKER", "memory://")
app = Celery("celery_app", broker=BROKER)
app.conf.update(
    result_backend=BROKER.replace("/0", "/1") if BROKER.startswith("redis") else None,
    redreentrant_masters=[u for u in os.environ.get("CELERY_TEST_MASTERS", "").split(",") if u],
    redreentrant_options={"lease": float(os.environ.get("CELERY_TEST_LEASE", "2"))},
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    task_acks_late=True,
    task_reject_on_worker_lost=False,
)

_recorders: dict[int, Recorder] = {}


def recorder() -> Recorder:
    """This process's recorder."""
    pid = os.getpid()
    rec = _recorders.get(pid)
    if rec is None:
        directory = Path(os.environ["CELERY_TEST_HISTORY"])
        rec = _recorders[pid] = Recorder(
            directory / f"{pid}.jsonl", f"{socket.gethostname()}:{pid}"
        )
    return rec


def body(task: Any, key: str, seconds: float) -> int:
    lock = task.singleton
    rec = recorder()
    owner = f"{os.getpid()}:{task.request.id}"
    valid = time.monotonic_ns() + int(lock.remaining() * 1e9)
    token = lock.token if lock.fencing else None
    rec.ok("acquire", key, owner=owner, token=token, valid_until=valid)
    r = redis.Redis.from_url(BROKER)
    value = int(r.get(f"counter:{key}") or 0)
    time.sleep(0.05)  # widen the race a broken lock would lose
    r.set(f"counter:{key}", value + 1)
    rec.ok("incr", key, owner=owner, value=value + 1)
    time.sleep(seconds)
    rec.invoke("release", key, owner=owner)
    return os.getpid()


@app.task(base=Singleton, bind=True, singleton_key=("key",))
def skip(self: Any, key: str, seconds: float) -> int:
    """A duplicate is skipped (the default)."""
    return body(self, key, seconds)


@app.task(base=Singleton, bind=True, singleton_key=("key",), singleton_duplicate="wait")
def wait(self: Any, key: str, seconds: float) -> int:
    """A duplicate waits for the running one."""
    return body(self, key, seconds)


@app.task(base=Singleton, bind=True, singleton_key=("key",), singleton_duplicate="raise")
def refuse(self: Any, key: str, seconds: float) -> int:
    """A duplicate raises DuplicateTaskError."""
    return body(self, key, seconds)


@app.task(base=Singleton, bind=True, singleton_key=("key",), singleton_at_send=True)
def at_send(self: Any, key: str, seconds: float) -> int:
    """The key is taken when the task is sent; a duplicate is skipped then."""
    return body(self, key, seconds)


@app.task(base=Singleton, bind=True, singleton_key=("key",), time_limit=1.0)
def limited(self: Any, key: str, seconds: float) -> int:
    """Killed by its hard time limit after a second."""
    return body(self, key, seconds)


@app.task(base=Singleton, bind=True, singleton_key=("key",), singleton_fencing=True)
def fenced(self: Any, key: str, seconds: float) -> int:
    """Its hold has a fencing token; returns it."""
    body(self, key, seconds)
    token: int = self.singleton.token
    return token


@app.task(base=Singleton, bind=True, singleton_key=("key",))
def watch(self: Any, key: str, seconds: float) -> bool:
    """Runs until its hold is lost (at most ``seconds``); returns whether it was."""
    body(self, key, 0)
    lost: bool = self.singleton.lost.wait(seconds)
    return lost


@app.task(base=Singleton, bind=True, singleton_key=("key",))
def failing(self: Any, key: str, seconds: float) -> int:
    """Raises ValueError after its body."""
    body(self, key, seconds)
    raise ValueError(key)
