"""A seeded soak: processes contend for every kind of lock on real masters while real
faults come and go, and the whole history is checked afterwards.

Run it (Linux, root: it makes a network namespace and firewall rules; a C compiler for
the clock shim; a ``redis-server``)::

    python -m redreentrant.testing.soak                      # 75 s, a fresh seed
    python -m redreentrant.testing.soak --seconds 3600 --seed 42 --json soak.json
    python -m redreentrant.testing.soak --seed 42 --plan-only   # the faults only

It prints ``seed N`` first (pass it back with ``--seed`` to replay the same fault
schedule and the same draws of the workers; timing on a busy machine differs), then
its figures: holds by kind, failed acquires and releases by error, losses reported,
faults by kind, violations by kind, and the time. Exit status: 0 no violation, 1
violations (the first few are printed, with the faults around the first one) or a
worker that failed, 2 it cannot run here (the reason is printed).

**What runs.** A :class:`~redreentrant.testing.NetLab` of ``--masters`` masters, each
with a :class:`~redreentrant.testing.clocks.ServerClock`, and ``--processes`` workers
(:mod:`redreentrant.testing.soakworker`), each on its own client path, fencing on, the
manager's lease ``--lease``. Each takes, in a loop, a plain lock, a read or write lock,
a fair lock, a permit of a semaphore (2 permits), a multi-lock of two names or an
election's leadership, of two names or so per kind; works under it (a read-sleep-write
counter and a fenced write on a resource server inside the lab that no fault touches),
holds it tens of ms (sometimes hundreds, now and then past a lease) and releases it.

**The faults** (:func:`plan`, all drawn from the seed): one every 0.5-2 s, each undone
after 0.3-3 s: a master killed (restarted, empty, more than a lease later), frozen,
cut (both ways, or only its requests or its replies), losing 30 % of its packets,
delayed 70 ± 50 ms per packet, or its clock run 1.1x or 10x fast (then reset); or
one client's path cut from a majority of masters, or losing 30 %, or delayed. The
model's assumptions are kept: at most a minority of masters is faulted at a time,
counted until ``0.6 * lease`` after the fault is undone (the watchdog takes its holds
again there within a renewal interval); a client's path has one fault at a time, and
at most two clients have one.

**The checks** (:func:`redreentrant.testing.history.check`): ``overlap`` and
``reader-writer`` (exclusion), ``over-capacity`` (more permit holders than permits),
``lost-update`` (a counter value written twice, or a final value short of the
increments), ``stale-write`` (a fenced write accepted with a token smaller than one
accepted before it), ``term-order`` and ``token-order`` (a later hold's token or term
not larger than an earlier one's), ``late-loss`` (a loss reported more than 50 ms
after the validity its hold last knew) and ``gone-while-valid`` (a release that found
the hold gone before its validity ended, with no loss reported; one while a master's
clock ran fast is counted apart, as documented: see :func:`by_a_clock`). The fair lock's
arrival order is not judged (faults reorder arrivals: not a promise), nor writes made
after a hold ended while no newer holder had written yet (the fenced store compares
only the tokens it is sent).

Why so: the unit tests and the fault suite prove one fault at a time; a soak finds
what only their mixture, and time, bring out. A seed makes a finding replayable, the
history makes it explainable, and the model's limits make every violation a bug.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

import redis

from . import clocks as clocks_module
from . import netlab as netlab_module
from . import reaper
from .binary import RedisServerNotFound, find_redis_server
from .clocks import ServerClock
from .history import Event, Report, Violation, check, load
from .netlab import NetLab
from .server import LocalServer
from .soakworker import EXCLUSIVE, FAMILY, NAMES, PERMITS, Spec, counter_key

__all__ = ["Fault", "main", "plan"]

#: the faults that hit one master (on every path), and one client's path
MASTER_FAULTS = (
    "kill",
    "freeze",
    "cut",
    "cut-requests",
    "cut-replies",
    "loss",
    "jitter",
    "clock-1.1x",
    "clock-10x",
)
CLIENT_FAULTS = ("client-cut", "client-loss", "client-jitter")
LOSS_PERCENT = 30.0
DELAY_MS, JITTER_MS = 70.0, 50.0  # 20-120 ms per packet
RATES = {"clock-1.1x": 1.1, "clock-10x": 10.0}
#: the master faults done to its process (the others, to its packets)
_ON_PROCESS = ("kill", "freeze", *RATES)
#: a master counts as faulted until this many leases after its fault is undone
SETTLE = 0.6
#: how many clients' paths may have a fault at one time
CLIENTS_AT_ONCE = 2
#: no fault in the first second (the workers' first holds) nor in the last half second
WARM_UP, COOL_DOWN = 1.0, 0.5
#: the resource: a server inside the lab on an address no fault matches
RESOURCE_HOST, RESOURCE_PORT = "127.3.0.1", 6390
#: the fair lock's arrival order is not judged: a slack longer than any run
NO_FIFO = 1 << 62


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule: injected ``at`` seconds after the start, undone at
    ``until``; on ``master`` (a master's fault) or on ``client``'s path to ``masters``."""

    at: float
    until: float
    kind: str
    master: int | None = None
    client: int | None = None
    masters: tuple[int, ...] = ()

    def describe(self) -> str:
        where = (
            f"master {self.master}"
            if self.master is not None
            else f"client p{self.client} to masters {','.join(map(str, self.masters))}"
        )
        return f"{self.at:7.2f}-{self.until:7.2f}s {self.kind} on {where}"


def plan(seed: int, seconds: float, masters: int, processes: int, lease: float) -> list[Fault]:
    """The fault schedule of a run: the same for the same arguments."""
    rng = random.Random(seed)
    minority = (masters - 1) // 2
    busy_master = [0.0] * masters  # until when each master counts as faulted
    busy_client = [0.0] * processes
    faults: list[Fault] = []
    t = WARM_UP
    while True:
        t += rng.uniform(0.5, 2.0)
        if t >= seconds - COOL_DOWN:
            return faults
        kind = rng.choice(MASTER_FAULTS + CLIENT_FAULTS)
        duration = rng.uniform(0.3, 3.0)
        pick = rng.random()  # drawn every time: the draws do not depend on what fits
        chosen = rng.sample(range(masters), masters // 2 + 1)
        if kind == "kill":
            duration = lease + 0.2 + duration / 2  # restarted only after a lease
        if kind in MASTER_FAULTS:
            free = [m for m in range(masters) if busy_master[m] <= t]
            if masters - len(free) >= minority or not free:
                continue
            master = free[int(pick * len(free))]
            busy_master[master] = t + duration + SETTLE * lease
            faults.append(Fault(t, t + duration, kind, master=master))
        else:
            free = [c for c in range(processes) if busy_client[c] <= t]
            if processes - len(free) >= CLIENTS_AT_ONCE or not free:
                continue
            client = free[int(pick * len(free))]
            busy_client[client] = t + duration
            targets = sorted(chosen) if kind == "client-cut" else list(range(masters))
            faults.append(Fault(t, t + duration, kind, client=client, masters=tuple(targets)))


# -- carrying the faults out --------------------------------------------------------------


class Injector:
    """Injects and undoes the faults of a schedule in a lab; counts and logs them."""

    def __init__(self, lab: NetLab, clocks: list[ServerClock], lease: float) -> None:
        self.lab = lab
        self.clocks = clocks
        self.lease = lease
        self.active: list[Fault] = []
        self.killed_at: dict[int, float] = {}
        self.counts: Counter[str] = Counter()
        #: (monotonic ns, "+" injected or "-" undone, the fault)
        self.log: list[tuple[int, str, Fault]] = []

    def inject(self, fault: Fault) -> None:
        master = fault.master
        if master is None or fault.kind not in _ON_PROCESS:
            self._apply(fault)
        elif fault.kind == "kill":
            self.lab.kill(master)
            self.killed_at[master] = time.monotonic()
        elif fault.kind == "freeze":
            self.lab.freeze(master)
        else:
            self.clocks[master].rate(RATES[fault.kind])
        self.active.append(fault)
        self.counts[fault.kind] += 1
        self.log.append((time.monotonic_ns(), "+", fault))

    def undo(self, fault: Fault) -> None:
        self.active.remove(fault)
        master = fault.master
        if master is None or fault.kind not in _ON_PROCESS:
            for m in _packets_of(fault):
                self.lab.heal(m, fault.client)
            # A heal undoes every fault on those packets: put back the others' there.
            for other in self.active:
                if other.kind not in _ON_PROCESS:
                    self._apply(other)
        elif fault.kind == "kill":
            # Masters persist nothing: one restarted within a lease could forget holds
            # that are still valid (outside the model).
            time.sleep(max(0.0, self.killed_at.pop(master) + self.lease + 0.1 - time.monotonic()))
            self.lab.start(master)
        elif fault.kind == "freeze":
            self.lab.thaw(master)
        else:
            self.clocks[master].reset()
        self.log.append((time.monotonic_ns(), "-", fault))

    def undo_all(self) -> None:
        for fault in sorted(self.active, key=lambda f: f.kind == "kill"):  # kills wait
            self.undo(fault)
        self.lab.heal()

    def _apply(self, fault: Fault) -> None:
        """Put a packet fault in place: a master's on every path, or one client's."""
        lab, kind, client = self.lab, fault.kind.removeprefix("client-"), fault.client
        for m in _packets_of(fault):
            if kind == "cut":
                lab.cut(m, client)
            elif kind in ("cut-requests", "cut-replies"):
                lab.cut(m, client, way="requests" if kind == "cut-requests" else "replies")
            elif kind == "loss":
                lab.loss(m, LOSS_PERCENT, client)
            elif kind == "jitter":
                lab.delay(m, DELAY_MS, JITTER_MS, client)


def _packets_of(fault: Fault) -> tuple[int, ...]:
    """The masters whose packets a packet fault hits (on ``fault.client``'s path only,
    when it names a client)."""
    return fault.masters if fault.master is None else (fault.master,)


def carry_out(faults: list[Fault], injector: Injector, seconds: float) -> None:
    """Inject and undo ``faults`` in order for ``seconds``, then undo what is still on.

    A step that ends late (a master's restart, a busy machine) delays every later step
    as much: the time between two steps is never shorter than planned, so the
    schedule's limits (a settle after an undo, a restart after a lease) hold."""
    start = time.monotonic()
    steps = sorted(
        [(f.at, 1, i, f) for i, f in enumerate(faults)]
        + [(f.until, 0, i, f) for i, f in enumerate(faults)],
        key=lambda step: step[:3],
    )
    late = 0.0
    for at, inject, _, fault in steps:
        if at + late >= seconds:
            break
        time.sleep(max(0.0, start + at + late - time.monotonic()))
        if inject:
            injector.inject(fault)
        else:
            injector.undo(fault)
        late = max(late, time.monotonic() - start - at)
    time.sleep(max(0.0, start + seconds - time.monotonic()))
    injector.undo_all()


# -- the workers ----------------------------------------------------------------------------


def _await_lines(processes: Sequence[subprocess.Popen[bytes]], word: bytes, limit: float) -> None:
    """Wait for each process to print a line ``word``; RuntimeError if one ended first
    or did not say it within ``limit`` seconds."""
    deadline = time.monotonic() + limit
    for index, process in enumerate(processes):
        assert process.stdout is not None
        fd = process.stdout.fileno()
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise RuntimeError(f"worker p{index} did not say {word.decode()!r}")
            chunk = os.read(fd, 1)
            if not chunk:
                raise RuntimeError(f"worker p{index} ended before it said {word.decode()!r}")
            line += chunk
        if line.strip() != word:
            raise RuntimeError(f"worker p{index} said {line!r}, not {word.decode()!r}")


def _stop(processes: Sequence[subprocess.Popen[bytes]], limit: float) -> None:
    """Close the workers' stdin (they stop), wait for them, kill the ones still on."""
    for process in processes:
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
    deadline = time.monotonic() + limit
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGUSR1)  # its stacks, into its stderr
            time.sleep(1.0)
            process.kill()
            process.wait()


# -- a run ----------------------------------------------------------------------------------


@dataclass
class Config:
    seconds: float = 75.0
    seed: int = 0
    masters: int = 5
    processes: int = 6
    lease: float = 1.5
    #: a directory to copy the histories and the workers' stderr into (None: none)
    keep: str | None = None


def why_not() -> str | None:
    """None when a soak can run here, else why not."""
    for reason in (netlab_module.available(), clocks_module.available()):
        if reason is not None:
            return reason
    try:
        find_redis_server()
    except RedisServerNotFound as error:
        return str(error)
    return None


def run(config: Config, out: IO[str]) -> dict[str, Any]:
    """Run a soak; returns its figures (and prints its progress to ``out``)."""
    faults = plan(config.seed, config.seconds, config.masters, config.processes, config.lease)
    began = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="redreentrant-soak-"))
    reaper.watch_dir(str(tmp), "")  # removed after a hard kill too
    clocks: list[ServerClock] = []
    lab: NetLab | None = None
    resource: LocalServer | None = None
    workers: list[subprocess.Popen[bytes]] = []
    try:
        clocks += [ServerClock() for _ in range(config.masters)]
        lab = NetLab(config.masters, config.processes, server_env=lambda i: clocks[i].env)
        resource = LocalServer(host=RESOURCE_HOST, port=RESOURCE_PORT)
        lab.start()
        with lab.entered():
            resource.start()
        for index in range(config.processes):
            spec = Spec(
                urls=lab.urls(client=index),
                resource=resource.url,
                client=f"p{index}",
                history=str(tmp / f"p{index}.jsonl"),
                seed=config.seed + 1 + index,
                lease=config.lease,
            )
            with open(tmp / f"p{index}.err", "wb") as err:
                workers.append(
                    lab.popen(
                        [sys.executable, "-m", "redreentrant.testing.soakworker",
                         json.dumps(asdict(spec))],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=err,
                        start_new_session=True,  # a terminal's Ctrl-C is for the soak
                    )
                )  # fmt: skip
        _await_lines(workers, b"ready", 60.0)
        print(f"running {config.seconds:g}s: {len(faults)} faults planned", file=out, flush=True)
        injector = Injector(lab, clocks, config.lease)
        try:
            carry_out(faults, injector, config.seconds)
        finally:
            with open(tmp / "faults.jsonl", "w", encoding="utf-8") as log:
                for t, sign, fault in injector.log:
                    log.write(json.dumps({"t": t, "sign": sign, **asdict(fault)}) + "\n")
        _stop(workers, 30.0)
        failed = {
            f"p{i}": (w.returncode, _tail(tmp / f"p{i}.err"))
            for i, w in enumerate(workers)
            if w.returncode != 0
        }
        with lab.entered():
            counters = _counters(resource.url)
        events = load(sorted(tmp.glob("p*.jsonl")))
        report = check(
            events,
            final_counter=counters,
            permits={name: PERMITS for name in NAMES["sem"]},
            late_writes=False,
            fifo_slack_ns=NO_FIFO,
            token_order=True,
            late_losses=True,
        )
        return figures(config, events, report, injector, failed, time.monotonic() - began)
    finally:
        for process in workers:
            if process.poll() is None:
                process.kill()
                process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
        if resource is not None:
            resource.close()
        if lab is not None:
            lab.close()
        for clock in clocks:
            clock.close()
        if config.keep is not None:
            shutil.copytree(tmp, config.keep, dirs_exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        reaper.forget_dir(str(tmp))


def _counters(url: str) -> dict[str, int]:
    """The final value of every counter the exclusive kinds increment."""
    names = {name for kind in EXCLUSIVE for name in NAMES[FAMILY[kind]]}
    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        return {name: int(client.get(counter_key(name)) or 0) for name in sorted(names)}
    finally:
        client.close()


def _tail(path: Path, lines: int = 80) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# -- figures ----------------------------------------------------------------------------------


def by_a_clock(v: Violation, log: list[tuple[int, str, Fault]]) -> bool:
    """Whether ``v`` is a release that found its hold gone before its validity ended
    while a master's clock ran fast (a clock fault began before the release and ended
    after the hold began). Documented, not a violation: a hold on exactly a quorum
    (the other masters refused, or were out of reach) ends early when one of its masters
    expires it early, until the watchdog takes it on more masters, and its holder learns
    it at its next renewal or release (docs/safety.md, "A hold on exactly a quorum").
    Rivals that saw the master before count it out: ``overlap`` still judges them."""
    if v.kind != "gone-while-valid" or v.since is None:
        return False
    began: dict[int, int] = {}
    for t, sign, fault in log:
        if fault.kind not in RATES:
            continue
        if sign == "+":
            began[id(fault)] = t
        elif began.pop(id(fault), t) <= v.t and t >= v.since:
            return True
    return any(t <= v.t for t in began.values())  # still running at the end


def figures(
    config: Config,
    events: list[Event],
    report: Report,
    injector: Injector,
    failed: dict[str, tuple[int, str]],
    elapsed: float,
) -> dict[str, Any]:
    """What a run found, as JSON types. A release that found its hold gone while a
    master's clock ran fast is documented, not a violation (see :func:`by_a_clock`)."""

    def kind_of(e: Event) -> str:
        return e.client.rpartition("/")[2]

    def by_error(op: str) -> Counter[str]:
        out: Counter[str] = Counter()
        for e in events:
            if e.op == op and e.phase == "fail":
                if kind_of(e) == "multi" and e.lock != NAMES["x"][0]:
                    continue
                out[e.error or "timed out"] += 1
        return out

    # Every hold has an owner of its own; a multi-lock's events come in twos (a name each).
    holds = Counter(
        kind_of(e)
        for e in {
            (e.client, e.owner): e for e in events if e.op == "acquire" and e.phase == "ok"
        }.values()
    )
    lost = {e.owner for e in events if e.op == "lost" and e.phase == "ok"}
    # The validity each reported hold had left when its loss was reported (each hold has
    # an owner of its own).
    validity = {(h.lock, h.mode, h.owner): h.valid_until for h in report.holds}
    margins = [
        (until - e.t) / 1e6
        for e in events
        if e.op == "lost" and e.phase == "ok" and e.owner is not None
        for until in [validity.get((e.lock, e.mode, e.owner))]
        if until is not None
    ]
    documented = [v for v in report.violations if by_a_clock(v, injector.log)]
    found = [v for v in report.violations if v not in documented]
    violations = Counter(v.kind for v in found)
    first = found[0] if found else None
    around = [
        f"+{(t - report.origin) / 1e6:.3f}ms {'injected' if sign == '+' else 'undone'} "
        f"{fault.kind} on {_where(fault)}"
        for t, sign, fault in injector.log
        if first is not None and abs(t - first.t) < 5_000_000_000
    ]
    return {
        "seed": config.seed,
        "seconds": config.seconds,
        "masters": config.masters,
        "processes": config.processes,
        "lease": config.lease,
        "holds": dict(sorted(holds.items())),
        "holds_total": sum(holds.values()),
        "acquires_failed": dict(sorted(by_error("acquire").items())),
        "releases_failed": dict(sorted(by_error("release").items())),
        "losses_reported": len(lost),
        "loss_margin_ms_min": round(min(margins), 1) if margins else None,
        "faults": dict(sorted(injector.counts.items())),
        "faults_total": sum(injector.counts.values()),
        "violations": dict(sorted(violations.items())),
        "violations_total": len(found),
        "first_violations": [f"{v.kind} on {v.lock!r}: {v.detail}" for v in found[:5]],
        "gone_by_a_clock": len(documented),
        "faults_around_first_violation": around,
        "workers_failed": {k: {"exit": code, "stderr": tail} for k, (code, tail) in failed.items()},
        "events": report.events,
        "elapsed": round(elapsed, 1),
    }


def _where(fault: Fault) -> str:
    if fault.master is not None:
        return f"master {fault.master}"
    return f"client p{fault.client} (masters {','.join(map(str, fault.masters))})"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def print_figures(result: dict[str, Any], out: IO[str]) -> None:
    print(f"holds: {result['holds_total']} ({_counts(result['holds'])})", file=out)
    print(f"acquires failed: {_counts(result['acquires_failed'])}", file=out)
    print(f"releases failed: {_counts(result['releases_failed'])}", file=out)
    margin = result["loss_margin_ms_min"]
    left = "" if margin is None else f" (validity left at the report: at least {margin}ms)"
    print(f"losses reported: {result['losses_reported']}{left}", file=out)
    print(f"faults: {result['faults_total']} ({_counts(result['faults'])})", file=out)
    print(
        f"violations: {result['violations_total']} ({_counts(result['violations'])})",
        file=out,
    )
    for line in result["first_violations"]:
        print(f"  {line}", file=out)
    print(
        f"releases that found the hold gone while a master's clock ran fast: "
        f"{result['gone_by_a_clock']} (documented: a hold on exactly a quorum)",
        file=out,
    )
    if result["faults_around_first_violation"]:
        print("faults within 5 s of the first violation:", file=out)
        for line in result["faults_around_first_violation"]:
            print(f"  {line}", file=out)
    for name, failure in result["workers_failed"].items():
        print(f"worker {name} exited with {failure['exit']}:\n{failure['stderr']}", file=out)
    print(f"time: {result['elapsed']}s ({result['events']} events)", file=out, flush=True)


# -- the command line -------------------------------------------------------------------------


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the clean-up


def main(argv: list[str] | None = None, out: IO[str] | None = None) -> int:
    stream = sys.stdout if out is None else out
    parser = argparse.ArgumentParser(
        prog="python -m redreentrant.testing.soak",
        description="A seeded soak: processes contend for locks under random real faults; "
        "the whole history is checked.",
    )
    parser.add_argument("--seconds", type=float, default=75.0, help="how long (default 75)")
    parser.add_argument("--seed", type=int, help="the seed (default: a fresh one, printed)")
    parser.add_argument("--masters", type=int, default=5, help="masters (default 5)")
    parser.add_argument("--processes", type=int, default=6, help="workers, 1-15 (default 6)")
    parser.add_argument("--lease", type=float, default=1.5, help="lease, seconds (default 1.5)")
    parser.add_argument("--json", metavar="PATH", help="write the figures there as JSON")
    parser.add_argument(
        "--keep", metavar="DIR", help="copy the histories and the workers' stderr there"
    )
    parser.add_argument(
        "--plan-only", action="store_true", help="print the fault schedule and exit"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.processes <= 15 or args.masters < 1 or args.seconds <= 0 or args.lease <= 0:
        parser.error("need 1-15 processes, at least 1 master, and positive seconds and lease")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    print(f"seed {seed}", file=stream, flush=True)
    config = Config(args.seconds, seed, args.masters, args.processes, args.lease, args.keep)
    if args.plan_only:
        for fault in plan(seed, config.seconds, config.masters, config.processes, config.lease):
            print(fault.describe(), file=stream)
        return 0
    reason = why_not()
    if reason is not None:
        print(f"cannot run here: {reason}", file=stream, flush=True)
        return 2
    print(
        f"soak: {config.masters} masters, {config.processes} processes, lease "
        f"{config.lease:g}s, fencing on",
        file=stream,
        flush=True,
    )
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        result = run(config, stream)
    except KeyboardInterrupt:
        print("interrupted: everything it made is removed", file=stream, flush=True)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print_figures(result, stream)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 1 if result["violations_total"] or result["workers_failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
