"""A Celery app for the beat tests' processes (tests/test_celery_beat.py), configured from
the environment:

- ``BEAT_BROKER``: the broker's URL (a Redis of the test's own);
- ``BEAT_MASTERS``: the lock masters' URLs, comma-separated;
- ``BEAT_LEASE``: the managers' lease in seconds;
- ``BEAT_NAME``: the election's name.

Its schedule sends ``celery_beat_app.noop`` every half second (entry ``half``) and
every second (entry ``one``). No worker runs: the tests read the messages beat put on
the broker's ``celery`` list. Each message carries the sending process's pid and the
time of the send (``time.time()``) and the entry's name in the headers ``beat_pid``,
``beat_sent_at`` and ``beat_entry``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery
from celery.signals import before_task_publish

#: each entry of the schedule: its interval in seconds
INTERVALS = {"half": 0.5, "one": 1.0}

app = Celery("celery_beat_app", broker=os.environ.get("BEAT_BROKER", "memory://"))
app.conf.update(
    redreentrant_masters=[u for u in os.environ.get("BEAT_MASTERS", "").split(",") if u],
    redreentrant_options={"lease": float(os.environ.get("BEAT_LEASE", "2.0"))},
    redreentrant_beat_name=os.environ.get("BEAT_NAME", "celery-beat"),
    beat_schedule={
        name: {"task": "celery_beat_app.noop", "schedule": every, "args": (name,)}
        for name, every in INTERVALS.items()
    },
    broker_connection_retry_on_startup=True,
)


@app.task(name="celery_beat_app.noop")
def noop(entry: str) -> str:
    """Never run in the tests (no worker): what beat sends."""
    return entry


@before_task_publish.connect
def stamp(body: Any = None, headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Tell in each message who sent it, when, and for which entry (its only argument)."""
    if headers is not None and headers.get("task") == noop.name:
        headers["beat_pid"] = os.getpid()
        headers["beat_sent_at"] = time.time()
        headers["beat_entry"] = body[0][0]
