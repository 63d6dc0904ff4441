"""Worker processes for the tests (run as scripts, one lock manager per process).

python workers.py hold URLS NAME LEASE       acquire NAME, print "held", sleep until killed
python workers.py count URLS NAME FILE N     N times: under NAME, read FILE, sleep, write +1
python workers.py wait URLS NAME             print the manager id, then wait for NAME (no limit)
python workers.py hand-off URLS NAME LEASE   acquire NAME with a fixed LEASE, hand it off,
                                             print the ticket and exit

``contend`` and ``take`` are run by ``multiprocessing`` (spawn) instead: see
tests/test_handoff.py.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

from redreentrant import LockManager
from redreentrant.asyncio import LockManager as AsyncLockManager


def hold(urls: list[str], name: str, lease: float, kind: str) -> None:
    with LockManager(urls, lease=lease) as mgr:
        locks = {
            "lock": mgr.lock,
            "read": lambda n: mgr.rw_lock(n).read,
            "write": lambda n: mgr.rw_lock(n).write,
            "fair": mgr.fair_lock,
        }
        print("waiting", flush=True)
        locks[kind](name).acquire()
        print("held", flush=True)
        time.sleep(3600)


def count(urls: list[str], name: str, path: Path, times: int) -> None:
    with LockManager(urls, lease=5.0) as mgr:
        lock = mgr.lock(name)
        for _ in range(times):
            with lock:
                value = int(path.read_text() or "0")
                time.sleep(0.002)  # widen the race a broken lock would lose
                path.write_text(str(value + 1))


def wait(urls: list[str], name: str) -> None:
    with LockManager(urls, lease=60.0) as mgr:
        print(mgr.id, flush=True)
        mgr.lock(name).acquire()
        print("held", flush=True)
        time.sleep(3600)


def hand_off(urls: list[str], name: str, lease: float) -> None:
    with LockManager(urls, fencing=True) as mgr:
        lock = mgr.lock(name)
        lock.acquire(lease=lease)
        print(lock.hand_off(), flush=True)


def take(urls: list[str], name: str, flavour: str, held: Any, go: Any) -> None:
    """Acquire ``name``, set ``held``, release it once ``go`` is set, and return at once:
    the process ends as ``multiprocessing`` ends it, the manager never closed."""
    if flavour == "asyncio":
        asyncio.run(_take_async(urls, name, held, go))
        return
    lock = LockManager(urls, lease=60.0).lock(name)
    lock.acquire()
    held.set()
    go.wait()
    lock.release()


async def _take_async(urls: list[str], name: str, held: Any, go: Any) -> None:
    lock = AsyncLockManager(urls, lease=60.0).lock(name)
    await lock.acquire()
    held.set()
    await asyncio.to_thread(go.wait)
    await lock.release()


def contend(urls: list[str], name: str, counter: str, times: int, flavour: str, start: Any) -> None:
    """``times`` increments of a non-atomic counter (GET, sleep, SET) under lock ``name``,
    begun once every contender is ready (``start``: a barrier)."""
    if flavour == "asyncio":
        asyncio.run(_contend_async(urls, name, counter, times, start))
        return
    with LockManager(urls) as mgr, redis.Redis.from_url(urls[0]) as r:
        lock = mgr.lock(name)
        start.wait()
        for _ in range(times):
            with lock:
                value = int(r.get(counter) or 0)
                time.sleep(0.002)  # widen the race a broken lock would lose
                r.set(counter, value + 1)


async def _contend_async(urls: list[str], name: str, counter: str, times: int, start: Any) -> None:
    async with AsyncLockManager(urls) as mgr, redis.asyncio.Redis.from_url(urls[0]) as r:
        lock = mgr.lock(name)
        await asyncio.to_thread(start.wait)
        for _ in range(times):
            async with lock:
                value = int(await r.get(counter) or 0)
                await asyncio.sleep(0.002)
                await r.set(counter, value + 1)


if __name__ == "__main__":
    mode, urls = sys.argv[1], sys.argv[2].split(",")
    if mode == "hold":
        hold(urls, sys.argv[3], float(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else "lock")
    elif mode == "wait":
        wait(urls, sys.argv[3])
    elif mode == "hand-off":
        hand_off(urls, sys.argv[3], float(sys.argv[4]))
    elif mode == "count":
        count(urls, sys.argv[3], Path(sys.argv[4]), int(sys.argv[5]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
