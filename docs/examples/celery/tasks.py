"""An example Celery project on redreentrant: a singleton task, sent by beat every few
seconds, and as many beat processes as you like, one of them sending.

Against local masters, each command in a shell of its own, in this directory:

    export "$(redreentrant ensemble up)"    # local masters: REDREENTRANT_MASTERS=...
    celery -A tasks worker --loglevel=INFO
    celery -A tasks beat -S redreentrant.celery.LeaderScheduler --loglevel=INFO
    celery -A tasks beat -S redreentrant.celery.LeaderScheduler --loglevel=INFO

The masters come from $REDREENTRANT_MASTERS (comma-separated URLs); the broker from
$CELERY_BROKER_URL (default: database 1 of the first master, fine for a demo only).
Kill the beat that sends (Ctrl-C, or kill -9): the other one takes over within a
lease. Kill the worker mid-task with kill -9: the task's key is free within a lease.
"""

from __future__ import annotations

import os
import time

from celery import Celery

from redreentrant.celery import Singleton

MASTERS = os.environ["REDREENTRANT_MASTERS"].split(",")
BROKER = os.environ.get("CELERY_BROKER_URL", MASTERS[0].rsplit("/", 1)[0] + "/1")
EVERY = float(os.environ.get("REFRESH_EVERY", "5"))

app = Celery("tasks", broker=BROKER, backend=BROKER)
app.conf.redreentrant_masters = MASTERS
app.conf.redreentrant_options = {"lease": 10}  # a dead worker's keys are free within 10 s
app.conf.beat_schedule = {
    "refresh-prices": {"task": "tasks.refresh_prices", "schedule": EVERY, "args": ("eu",)},
}


@app.task(base=Singleton, bind=True, singleton_fencing=True)
def refresh_prices(self: Singleton, region: str) -> int:
    """One refresh per region at a time, however many workers and beats run: a call
    while one runs is skipped. Returns the fencing token it held."""
    token: int = self.singleton.token  # give it to the price store with each write
    time.sleep(EVERY * 1.5)  # longer than the schedule: the next one is skipped
    self.singleton.ensure_held()  # LockLostError if the hold was lost meanwhile
    return token
