"""The fault suites' shared harness (no tests here): worker processes, a scenario's run,
the checker's verdict, and the outcome table.

Two modules use it: ``test_fault_suite.py`` (process faults, and network faults through
a loopback proxy) and ``test_real_faults.py`` (real packet faults in a network
namespace, and real clock faults on the masters). Kept out of ``helpers.py``, which
every test module imports: this is a few hundred lines that only the fault suites need
(worker processes, histories, the table's rows), and ``conftest.py`` reads
:data:`OUTCOMES` at the end of the session.

Each scenario appends an :class:`Outcome` to :data:`OUTCOMES` (:func:`record`); with
``$REDREENTRANT_FAULT_REPORT`` set to a path, ``conftest.py`` writes every row of the
session there once, as JSON, when the session ends (:func:`write_report`), and
``tests/fault_table.py`` turns them into the table of docs/safety.md::

    REDREENTRANT_FAULT_REPORT=faults.json python -m pytest -m faults \\
        tests/test_fault_suite.py tests/test_real_faults.py
    python tests/fault_table.py faults.json --update docs/safety.md

Run both modules in one session, in one process (not with ``-n``), for the whole
table: each session writes the file anew.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import pytest
import redis
from helpers import gone, wait_until

from redreentrant.cli._process import die_with_parent
from redreentrant.testing.history import Event, Report, check, load

WORKER = Path(__file__).with_name("fault_worker.py")
REPORT_ENV = "REDREENTRANT_FAULT_REPORT"
#: the manager lease of the workers: short, so that expiry happens within a scenario
LEASE = 1.5
MS = 1_000_000  # ns
#: the semaphore's permits in the scenarios
PERMITS = 2

#: the groups of rows (one table each in docs/safety.md), by the module that made them
PROCESS_AND_PROXY = "process and proxy faults"
REAL = "real network and clock faults"


class Process(Protocol):
    """What :class:`Worker` uses of its process: a ``subprocess.Popen``, or a
    :class:`Forked` worker."""

    pid: int
    stdin: IO[str] | None
    stdout: IO[str] | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, signum: int) -> None: ...
    def kill(self) -> None: ...


#: starts a worker's process: ``subprocess.Popen``, a network lab's ``popen``, or a
#: :class:`ForkServer`'s ``spawn()``
Spawn = Callable[..., Process]


# -- the outcome table ------------------------------------------------------------------


@dataclass
class Outcome:
    """One row of the outcome table in docs/safety.md."""

    scenario: str
    fault: str
    expected: str
    observed: str = ""
    violations: dict[str, int] = field(default_factory=dict)
    #: from the fault to the holder's loss report, in ms (None: no loss to detect)
    detect_ms: float | None = None
    #: the holder's validity left when the loss was reported, in ms
    margin_ms: float | None = None
    grants: int = 0
    seconds: float = 0.0
    #: the table the row goes in (:data:`PROCESS_AND_PROXY`, :data:`REAL`)
    group: str = PROCESS_AND_PROXY


OUTCOMES: list[Outcome] = []


def write_report(path: str | os.PathLike[str]) -> None:
    """Write every row of the session to ``path`` as JSON (``conftest.py`` calls it
    once, at the session's end)."""
    rows = [asdict(o) for o in OUTCOMES]
    Path(path).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


# -- processes ----------------------------------------------------------------------------


class Worker:
    """A client process (``fault_worker.py``): its stdout lines arrive on a queue.

    ``spawn`` starts it: ``subprocess.Popen`` by default, or a network lab's ``popen``
    (which starts it inside the lab's namespace)."""

    def __init__(self, spec: dict[str, Any], spawn: Spawn = subprocess.Popen) -> None:
        self.spec = spec
        self.process: Process = spawn(
            [sys.executable, str(WORKER), json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent(),  # it dies with the test, SIGKILL included
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def client(self) -> str:
        return str(self.spec["client"])

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())
        self.lines.put("<eof>")

    def expect(self, prefix: str, timeout: float = 15.0) -> str:
        """The next line starting with ``prefix`` (failing after ``timeout``)."""
        end = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"worker {self.client} did not say {prefix!r}")
            if line.startswith(prefix):
                return line
            if line == "<eof>":
                pytest.fail(f"worker {self.client} ended before saying {prefix!r}")

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def open(self) -> None:
        """Let a gated worker (``gate=True``) start its rounds."""
        self.expect("gated")
        self.send("open")

    def go(self) -> None:
        """Tell a ``hold`` worker to go on (write, release), and wait for its end."""
        self.send("go")
        self.finish()

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def finish(self, timeout: float = 20.0) -> None:
        self.expect("done", timeout)
        self.process.wait(timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait()


class Forked:
    """A worker forked by a :class:`ForkServer`: what :class:`Worker` uses of a
    ``subprocess.Popen`` (it is not this process's child: the server reaps it)."""

    def __init__(self, pid: int, stdin: int, stdout: int) -> None:
        self.pid = pid
        self.stdin: IO[str] | None = open(stdin, "w", encoding="utf-8")  # noqa: SIM115
        self.stdout: IO[str] | None = open(stdout, encoding="utf-8")  # noqa: SIM115
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and gone(self.pid):
            self.returncode = 0  # not known: the server reaped it
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """Starts workers by forking a loaded one (``fault_worker.py --fork-server``): a
    fork costs a few ms, a new interpreter most of a second of CPU (its imports), which
    on a small machine delays a scenario's start by seconds and competes with its
    clients. The server runs from :meth:`start` to :meth:`close`; it dies with this
    process, and its workers with it. Thread-safe."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()

    def start(self) -> ForkServer:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, str(WORKER), "--fork-server", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                preexec_fn=die_with_parent(),
            )
        self._socket = ours
        return self

    def spawn(self, netns: str | None = None) -> Spawn:
        """What :class:`Worker` takes as ``spawn``: a worker forked in the network
        namespace ``netns`` (a lab's name), or in this process's."""

        def fork(args: list[str], **_: Any) -> Forked:
            return self.fork(args[-1], netns)

        return fork

    def fork(self, spec: str, netns: str | None = None) -> Forked:
        """A worker of ``spec`` (its JSON)."""
        if self._socket is None:
            raise RuntimeError("the fork server is not running")
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            request = json.dumps({"spec": spec, "netns": netns}).encode()
            with self._lock:
                socket.send_fds(self._socket, [request], [stdin_r, stdout_w])
                self._socket.settimeout(10)
                answer = self._socket.recv(64)
        except BaseException:
            for f in (stdin_w, stdout_r):
                os.close(f)
            raise
        finally:
            os.close(stdin_r)  # the worker's ends: the server passed them on
            os.close(stdout_w)
        if not answer:
            raise RuntimeError("the fork server ended")
        return Forked(int(answer), stdin_w, stdout_r)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()  # the server ends
            self._socket = None
        if self.process is not None:
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Run:
    """One scenario's workers, history files, and the times of its faults.

    ``spawn`` starts the workers' processes (see :class:`Worker`); ``inside`` is the
    context in which this process reaches the resource (a lab's ``entered``)."""

    def __init__(
        self,
        tmp: Path,
        urls: list[str],
        resource: str,
        lock: str,
        *,
        spawn: Spawn = subprocess.Popen,
        inside: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext,
        group: str = PROCESS_AND_PROXY,
    ) -> None:
        self.tmp = tmp
        self.urls = urls
        self.resource = resource
        self.lock = lock
        self.spawn = spawn
        self.inside = inside
        self.group = group
        self.workers: list[Worker] = []
        self.faults: dict[str, int] = {}
        self.started = time.monotonic()

    def worker(self, client: str, **spec: Any) -> Worker:
        full = {
            "urls": self.urls,
            "resource": self.resource,
            "lock": self.lock,
            "client": client,
            "history": str(self.tmp / f"{client}.jsonl"),
            "manager_lease": LEASE,
            **spec,
        }
        w = Worker(full, self.spawn)
        self.workers.append(w)
        return w

    def holder(self, **spec: Any) -> Worker:
        """A ``hold`` worker that took the lock (and waits to be told to go on)."""
        w = self.worker("holder", mode="hold", **spec)
        w.expect("ready")
        w.expect("held")
        return w

    def rival(self, **spec: Any) -> None:
        """A ``loop`` worker run to its end."""
        w = self.worker("rival", **spec)
        w.expect("ready")
        w.finish()

    def mark(self, fault: str) -> None:
        """Note when a fault was injected (monotonic ns, the histories' clock)."""
        self.faults[fault] = time.monotonic_ns()

    def events(self) -> list[Event]:
        return load(sorted(self.tmp.glob("*.jsonl")))

    def wait_lost(self, client: str, limit: float = 10.0) -> None:
        """Return once ``client`` recorded a loss report (``on_lost``). A holder resumed
        after a pause is told by its watchdog at once, from a thread of its own: told to
        go on before that, it could release and end before the report is recorded."""
        wait_until(
            lambda: any(e.op == "lost" and e.client == client for e in self.events()),
            f"{client}'s loss reported",
            limit,
        )

    def close(self) -> None:
        for w in self.workers:
            w.close()


def counter_of(run: Run) -> int:
    with run.inside():
        client = redis.Redis.from_url(run.resource)
        try:
            return int(client.get(f"{{{run.lock}}}:counter") or 0)
        finally:
            client.close()


def judge(run: Run, *, late_writes: bool = False, **options: Any) -> Report:
    """The checker's report on the run's history. Fencing tokens never go backwards,
    in any scenario (also where exclusion is expected to break): asserted here."""
    events = run.events()
    regressions = token_regressions(events)
    assert not regressions, f"fencing tokens did not grow: {regressions[:3]}"
    return check(
        events,
        final_counter={run.lock: counter_of(run)},
        late_writes=late_writes,
        **options,
    )


def record(
    run: Run,
    fault: str,
    expected: str,
    report: Report,
    observed: str,
    detect: tuple[str, str] | None = None,
) -> Outcome:
    """Add a row to the outcome table."""
    events = run.events()
    kinds: dict[str, int] = {}
    for v in report.violations:
        kinds[v.kind] = kinds.get(v.kind, 0) + 1
    outcome = Outcome(
        scenario=run.lock,
        fault=fault,
        expected=expected,
        observed=observed,
        violations=kinds,
        grants=sum(1 for e in events if e.op == "acquire" and e.phase == "ok"),
        seconds=round(time.monotonic() - run.started, 1),
        group=run.group,
    )
    if detect is not None:
        fault_name, client = detect
        lost = [e for e in events if e.op == "lost" and e.client.startswith(client)]
        if lost and fault_name in run.faults:
            outcome.detect_ms = round((lost[0].t - run.faults[fault_name]) / MS, 1)
            validity = holder_validity(events, client, lost[0].t)
            if validity is not None:
                outcome.margin_ms = round((validity - lost[0].t) / MS, 1)
    OUTCOMES.append(outcome)
    return outcome


def holder_validity(events: list[Event], client: str, at: int) -> int | None:
    """The validity end ``client`` last knew before ``at`` (its acquire or renewal)."""
    known = [
        e.valid_until
        for e in events
        if e.client.startswith(client)
        and e.op in ("acquire", "renew")
        and e.phase == "ok"
        and e.valid_until is not None
        and e.t <= at
    ]
    return known[-1] if known else None


def tokens_increase(events: list[Event]) -> bool:
    """Tokens of the grants, in the order the holds began, strictly increase."""
    return not token_regressions(events)


def token_regressions(events: list[Event]) -> list[tuple[Event, Event]]:
    """Pairs of consecutive grants (in the order the holds began) whose tokens did not
    grow."""
    grants = [e for e in events if e.op == "acquire" and e.phase == "ok" and e.token]
    return [(a, b) for a, b in itertools.pairwise(grants) if a.token >= b.token]  # type: ignore[operator]


def errors_of(events: list[Event]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in events:
        if e.op == "error" and e.owner:
            out[e.owner] = out.get(e.owner, 0) + 1
    return out


def contend(run: Run, clients: int = 4, duration: float = 2.5, **spec: Any) -> list[Worker]:
    workers = [run.worker(f"p{i}", duration=duration, **spec) for i in range(clients)]
    for w in workers:
        w.expect("ready")
    return workers


def during(seconds: float, at: Callable[[], None], then: Callable[[], None], hold: float) -> None:
    time.sleep(seconds)
    at()
    time.sleep(hold)
    then()


# -- the semaphore: at most P holders ---------------------------------------------------


def judge_permits(run: Run) -> Report:
    """The checker's report, with at most :data:`PERMITS` holders of the run's name."""
    return check(run.events(), permits={run.lock: PERMITS}, late_writes=False)


def most_at_once(report: Report) -> int:
    """The most permit holders at one instant."""
    points = sorted(
        [(h.start, 1) for h in report.holds if h.mode == "sem"]
        + [(h.end, -1) for h in report.holds if h.mode == "sem"]
    )
    inside = most = 0
    for _, step in points:
        inside += step
        most = max(most, inside)
    return most


# -- leader election ----------------------------------------------------------------------


def terms_of(events: list[Event]) -> list[int]:
    """The terms of the grants, in the order they were recorded."""
    return [
        e.token
        for e in events
        if e.op == "acquire" and e.phase == "ok" and e.mode == "lead" and e.token is not None
    ]


def leaders_of(events: list[Event]) -> set[str]:
    """The clients that led at least once."""
    return {e.client.split("/")[0] for e in events if e.op == "acquire" and e.phase == "ok"}
