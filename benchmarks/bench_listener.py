"""What a listener costs on the hot path, measured without any server: the core's
acquire and release steps, driven by the real sync driver over an in-memory transport
that grants everything (``redreentrant._core.mock.MockTransport``), so that only the
library's own Python is timed.

    python benchmarks/bench_listener.py [--rounds 7] [--cycles 20000]

Three variants, interleaved round after round: no listener, a ``LockListener`` whose
methods are all no-ops, and (for scale) the same with fencing on. Prints the median
microseconds per acquire+release cycle (with the spread) and the ratio to "no
listener". A figure, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from collections.abc import Callable

from redreentrant import LockListener
from redreentrant._core.effects import Call, Reply
from redreentrant._core.engine import Engine
from redreentrant._core.mock import MockTransport
from redreentrant._core.seams import Hub
from redreentrant._core.settings import Settings
from redreentrant._sync.driver import SyncDriver

MASTERS = 5


def answer(master: int, call: Call) -> Reply:
    """Every master grants, releases, and steps a counter that was kept."""
    name = call.script.name
    if name == "acquire":
        return [1, 1]
    if name == "fence":
        return [1, 7, 0] if call.args[0] == "next" else 7
    return [0, b""]


class NoHub:
    """The driver's hub: a release notifies it (local waiters: none here); nothing
    else is used by an uncontended cycle."""

    def notify(self, notice: object) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., object]:
        raise AssertionError(f"an uncontended cycle used the hub ({name})")


def engine(listener: LockListener | None) -> tuple[Engine, SyncDriver]:
    settings = Settings.check(30.0, 0.01, 0.2, 0.05, None, False, None, listener)
    eng = Engine(
        settings,
        [f"m{i}" for i in range(MASTERS)],
        lambda: "t1",
        threading.Lock,
        time.monotonic,
        random.uniform,
    )
    hub: Hub = NoHub()  # type: ignore[assignment]
    return eng, SyncDriver(MockTransport(answer), hub, eng.check_open)


def cycles(listener: LockListener | None, fencing: bool, count: int) -> float:
    """Microseconds per acquire+release cycle."""
    from redreentrant._core.kinds import EXCLUSIVE

    eng, driver = engine(listener)
    owner = eng.owner_id()
    started = time.perf_counter()
    for _ in range(count):
        driver.run(eng.acquire(EXCLUSIVE, "x", owner, True, -1, 10.0, fencing))
        driver.run(eng.release(EXCLUSIVE, "x", owner, False))
    return (time.perf_counter() - started) / count * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cycles", type=int, default=20000)
    args = parser.parse_args()
    variants: dict[str, tuple[LockListener | None, bool]] = {
        "no listener": (None, False),
        "no-op listener": (LockListener(), False),
        "no listener, fencing=True": (None, True),
    }
    results: dict[str, list[float]] = {label: [] for label in variants}
    for _ in range(args.rounds):
        for label, (listener, fencing) in variants.items():
            results[label].append(cycles(listener, fencing, args.cycles))
    base = statistics.median(results["no listener"])
    print(f"core steps over an in-memory transport, {MASTERS} masters, {args.rounds} rounds")
    print(f"{'variant':28} {'us/cycle':>10} {'spread':>18} {'/ none':>8}")
    for label, values in results.items():
        med = statistics.median(values)
        spread = f"[{min(values):.1f}-{max(values):.1f}]"
        print(f"{label:28} {med:10.1f} {spread:>18} {med / base:7.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
