"""Worker processes for the tests (run as scripts, one lock manager per process).

python workers.py hold URLS NAME LEASE       acquire NAME, print "held", sleep until killed
python workers.py count URLS NAME FILE N     N times: under NAME, read FILE, sleep, write +1
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from redreentrant import LockManager


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


if __name__ == "__main__":
    mode, urls = sys.argv[1], sys.argv[2].split(",")
    if mode == "hold":
        hold(urls, sys.argv[3], float(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else "lock")
    elif mode == "count":
        count(urls, sys.argv[3], Path(sys.argv[4]), int(sys.argv[5]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
