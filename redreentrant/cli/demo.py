"""``redreentrant demo [--quick]``: a guided tour of the lock kinds on live masters.

The stages (workers contending for a reentrant lock, a read/write lock and a fair lock;
two masters killed mid-run; a holder killed and its lock freed after its lease) print
timestamped lines per worker and check what they show. Without masters, the command
starts five local ones (:class:`redreentrant.testing.LocalEnsemble`) and stops them at
the end. Nothing the demo starts outlives it, even when it is killed with SIGKILL: the
local masters have the reaper of :mod:`redreentrant.testing`, and the holder process of
stage 5 dies with the demo on Linux (``PR_SET_PDEATHSIG``, from the main thread that
starts it).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence

import redis

from redreentrant import LockError, LockLostError, LockManager
from redreentrant.testing import LocalEnsemble, redis_server_version

from ._process import die_with_parent
from .common import (
    EXIT_FAILED,
    EXIT_OK,
    MASTERS_ENV,
    Add,
    CliError,
    Interrupted,
    first_line,
    masters,
    raise_interrupted,
    signals,
    warn,
)

__all__ = ["Demo", "Out", "cmd_demo", "register"]

DEMO_LEASE = 5.0
DEMO_HOLDER_LEASE = 2.0  # the fixed lease of the holder killed in stage 5


_COLOURS = ["36", "33", "35", "34", "96", "93", "95", "94"]


class Out:
    """Timestamped, per-worker lines on stdout; colour only on a terminal."""

    def __init__(self, colour: bool) -> None:
        self.colour = colour
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._palette: dict[str, str] = {}
        # Set on interruption: worker threads still unwinding must not print past it.
        self.muted = False

    def _paint(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.colour else text

    def _print(self, who: str | None, text: str) -> None:
        """``text``, after the time and ``who`` (a column of its own) unless None."""
        with self._lock:
            if self.muted:
                return
            if who is not None:
                stamp = f"+{time.monotonic() - self.started:6.2f}s"
                text = f"{stamp}  {who}  {text}"
            print(text, flush=True)

    def say(self, who: str, text: str) -> None:
        with self._lock:
            code = self._palette.setdefault(who, _COLOURS[len(self._palette) % len(_COLOURS)])
        self._print(self._paint(f"{who:<10}", code), text)

    def heading(self, text: str) -> None:
        self._print(None, "\n" + self._paint(f"== {text} ==", "1"))

    def result(self, ok: bool, text: str) -> None:
        word = self._paint("PASS", "32") if ok else self._paint("FAIL", "1;31")
        self._print(f"{'check':<10}", f"{word} {text}")


class _Worker:
    """One demo worker: a thread with its own LockManager."""

    def __init__(self, demo: Demo, who: str, mgr: LockManager) -> None:
        self.demo = demo
        self.who = who
        self.mgr = mgr

    def say(self, text: str) -> None:
        self.demo.out.say(self.who, text)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds * self.demo.pace)


class Demo:
    """The stages of ``redreentrant demo``."""

    def __init__(
        self, out: Out, urls: list[str], ensemble: LocalEnsemble | None, quick: bool
    ) -> None:
        self.out = out
        self.urls = urls
        self.ensemble = ensemble
        # Every pause is scaled by pace: 1.0 is slow enough to follow live (about 20 s
        # in all), --quick is for tests and impatience (about 7 s).
        self.pace = 0.25 if quick else 1.0
        self.rounds = 3 if quick else 4
        # A fresh prefix: on masters the user gave us, never touch a real lock.
        self.prefix = f"redreentrant-demo:{uuid.uuid4().hex[:8]}:"
        self.checks: list[bool] = []  # each check's outcome
        self.holder: subprocess.Popen[bytes] | None = None

    def check(self, ok: bool, text: str) -> None:
        self.out.result(ok, text)
        self.checks.append(ok)

    def manager(self) -> LockManager:
        return LockManager(self.urls, lease=DEMO_LEASE)

    def start(self, who: str, body: Callable[[_Worker], None]) -> threading.Thread:
        """Start ``body`` in a daemon thread with its own manager (errors are checks)."""

        def target() -> None:
            try:
                with self.manager() as mgr:
                    body(_Worker(self, who, mgr))
            except Exception as error:
                self.check(False, f"{who} raised {type(error).__name__}: {first_line(str(error))}")

        thread = threading.Thread(target=target, name=f"demo-{who}", daemon=True)
        thread.start()
        return thread

    def join(self, threads: Sequence[threading.Thread], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            self.check(False, f"workers still running after {timeout:g} s: {', '.join(stuck)}")

    # -- the stages -----------------------------------------------------------------

    def stage_reentrant(self) -> None:
        name = self.prefix + "counter"
        workers = 4
        self.out.say(
            "demo",
            f"{workers} workers (threads, each with its own LockManager) add 1 to a shared "
            f"counter {self.rounds} times each, by read, pause, write: a race without the "
            "lock. Each holds the lock twice, with nested 'with' blocks.",
        )
        shared = {"counter": 0, "inside": 0, "most_inside": 0}
        guard = threading.Lock()  # only for the demo's own bookkeeping of "inside"

        def body(w: _Worker) -> None:
            lock = w.mgr.lock(name)
            for _ in range(self.rounds):
                with lock:
                    with guard:
                        shared["inside"] += 1
                        shared["most_inside"] = max(shared["most_inside"], shared["inside"])
                    w.say(f"acquired   (hold count {lock.hold_count})")
                    with lock:  # re-entry by the same thread: a deeper hold, no wait
                        value = shared["counter"]  # a read-modify-write, on purpose
                        w.sleep(0.2)
                        shared["counter"] = value + 1
                        w.say(
                            f"re-entered (hold count {lock.hold_count}): counter "
                            f"{value} -> {value + 1}"
                        )
                    with guard:
                        shared["inside"] -= 1
                w.say("released")

        self.join([self.start(f"worker-{i}", body) for i in range(1, workers + 1)])
        expected = workers * self.rounds
        self.check(
            shared["counter"] == expected,
            f"non-atomic counter is {shared['counter']}, expected {expected}",
        )
        self.check(
            shared["most_inside"] == 1,
            f"at most one worker inside at a time (seen {shared['most_inside']})",
        )

    def stage_rw(self) -> None:
        name = self.prefix + "rw"
        guard = threading.Lock()
        state = {"readers": 0, "most_readers": 0, "writers": 0, "overlaps": 0}
        self.out.say(
            "demo",
            "readers share the lock; a writer waits for them to leave, and readers that "
            "come while a writer waits queue behind it (no writer starvation).",
        )

        # Events, not only delays, order the story, so it holds on a slow machine too:
        # the writer comes once two readers are in, the late reader once it waits.
        two_reading = threading.Event()
        writer_waiting = threading.Event()

        def reader(after: threading.Event | None, delay: float) -> Callable[[_Worker], None]:
            def body(w: _Worker) -> None:
                if after is not None:
                    after.wait(10)
                w.sleep(delay)
                w.say("wants to read")
                with w.mgr.rw_lock(name).read:
                    with guard:
                        state["readers"] += 1
                        state["most_readers"] = max(state["most_readers"], state["readers"])
                        state["overlaps"] += state["writers"]
                        now = state["readers"]
                    if now >= 2:
                        two_reading.set()
                    w.say(f"reading   (readers now {now})")
                    two_reading.wait(5)  # stay until another reader is in, to show overlap
                    w.sleep(1.2)
                    with guard:
                        state["readers"] -= 1
                w.say("done reading")

            return body

        def writer(w: _Worker) -> None:
            two_reading.wait(10)
            w.sleep(0.3)
            w.say("wants to write: waits for the readers to leave")
            writer_waiting.set()
            with w.mgr.rw_lock(name).write:
                with guard:
                    state["writers"] += 1
                    state["overlaps"] += state["readers"]
                    now = state["readers"]
                w.say(f"writing   (readers now {now})")
                w.sleep(1.0)
                with guard:
                    state["writers"] -= 1
            w.say("done writing")

        threads = [self.start(f"reader-{i}", reader(None, 0.2 * (i - 1))) for i in range(1, 4)]
        threads.append(self.start("writer", writer))
        # A late reader: it comes while the writer waits, and must wait behind it.
        threads.append(self.start("reader-4", reader(writer_waiting, 0.3)))
        self.join(threads)
        self.check(state["most_readers"] >= 2, f"{state['most_readers']} readers overlapped")
        self.check(state["overlaps"] == 0, "the writer never overlapped a reader")

    def stage_fair(self) -> None:
        name = self.prefix + "fair"
        order: list[int] = []
        owner_ids: dict[int, str] = {}
        ready = threading.Event()
        workers = 4
        self.out.say(
            "demo",
            f"a holder keeps the fair lock while {workers} workers queue up one after "
            "the other; they must get it in the order they came.",
        )

        def waiter(i: int) -> Callable[[_Worker], None]:
            def body(w: _Worker) -> None:
                lock = w.mgr.fair_lock(name)
                owner_ids[i] = w.mgr.owner_id()
                ready.set()
                w.say("queues up")
                with lock:
                    order.append(i)
                    w.say(f"got the fair lock ({len(order)} of {workers})")
                    w.sleep(0.4)

            return body

        with self.manager() as mgr:
            fair = mgr.fair_lock(name)
            fair.acquire()
            self.out.say("holder", "holds the fair lock while the others queue up")
            threads = []
            for i in range(1, workers + 1):
                ready.clear()
                threads.append(self.start(f"fair-{i}", waiter(i)))
                ready.wait(5)
                self._wait_queued(mgr, name, owner_ids.get(i))
            time.sleep(0.5 * self.pace)
            self.out.say("holder", "releases: the queue is served first come, first served")
            fair.release()
        self.join(threads)
        self.check(order == list(range(1, workers + 1)), f"granted in arrival order {order}")

    def _wait_queued(self, mgr: LockManager, name: str, owner: str | None) -> None:
        """Wait until ``owner`` shows in the fair lock's queue on a quorum of masters,
        so the next waiter surely arrives after it."""
        deadline = time.monotonic() + 3.0
        while owner is not None and time.monotonic() < deadline:
            views = mgr.inspect(name)
            queued = sum(
                1 for v in views if v.error is None and any(owner in lv.queue for lv in v.locks)
            )
            if queued >= mgr.quorum:
                return
            time.sleep(0.02)
        time.sleep(0.2 * self.pace)  # could not see it: give it time instead

    def stage_crash(self, ensemble: LocalEnsemble) -> None:
        name = self.prefix + "crash"
        stop = threading.Event()
        guard = threading.Lock()
        tally = {"counter": 0, "grants": 0, "after_kill": 0, "lost": 0}
        killed = threading.Event()
        self.out.say(
            "demo",
            "3 workers take turns on a lock; then masters 4 and 5 die. A quorum is 3 "
            "of 5, so the lock keeps working. A hold that relied on the dead masters "
            "(granted by, say, masters 1, 2, 4 and 5) is no longer on a quorum: its owner "
            "is told (LockLostError), never left believing it holds the lock.",
        )

        def body(w: _Worker) -> None:
            lock = w.mgr.lock(name)
            while not stop.is_set():
                try:
                    with lock:
                        value = tally["counter"]
                        w.sleep(0.1)
                        tally["counter"] = value + 1
                        with guard:
                            tally["grants"] += 1
                            tally["after_kill"] += killed.is_set()
                        up = sum(s.running for s in ensemble.servers)
                        w.say(f"acquired: counter {value} -> {value + 1} ({up} of 5 masters up)")
                except LockLostError:
                    # Its grants were on the masters that died: expected, and reported.
                    with guard:
                        tally["lost"] += 1
                    w.say("its hold was lost with the dead masters: told by LockLostError")
                w.sleep(0.1)

        threads = [self.start(f"worker-{i}", body) for i in range(1, 4)]
        time.sleep(1.5 * self.pace)
        for index in (3, 4):
            ensemble[index].kill()
            self.out.say("chaos", f"SIGKILLed master {index + 1} ({ensemble[index].url})")
            killed.set()
        time.sleep(2.0 * self.pace)
        with self.manager() as mgr:
            lock = mgr.lock(name)
            with lock:
                views = mgr.inspect(name)
                granted = sum(1 for v in views if v.error is None and v.locks)
                self.out.say(
                    "observer",
                    f"holds the lock: granted by {granted} of {len(views)} masters "
                    f"(quorum {mgr.quorum})",
                )
        stop.set()
        self.join(threads)
        self.check(
            tally["counter"] == tally["grants"],
            f"counter {tally['counter']} matches {tally['grants']} grants",
        )
        self.check(
            tally["after_kill"] > 0 and granted >= 3,
            f"{tally['after_kill']} grants after two masters died (quorum 3 of 5 held)",
        )
        if tally["lost"]:
            self.out.say("demo", f"{tally['lost']} hold(s) lost with the dead masters, and said so")
        self.out.say(
            "demo",
            "masters 4 and 5 stay down: restarted, empty, they would not vote for a lease"
            " (a master that forgot is quarantined; see docs/safety.md)",
        )

    def stage_sigkill(self) -> None:
        name = self.prefix + "orphan"
        lease = DEMO_HOLDER_LEASE
        self.out.say(
            "demo",
            f"another process takes a lock with a {lease:g} s lease and is killed with "
            "SIGKILL: it never releases, and the lock must free itself when the lease ends.",
        )
        script = (
            "import sys, time\n"
            "from redreentrant import LockManager\n"
            "mgr = LockManager(sys.argv[1].split(','))\n"
            "mgr.lock(sys.argv[2]).acquire(lease=float(sys.argv[3]))\n"
            "print('held', flush=True)\n"
            "time.sleep(60)\n"
        )
        self.holder = subprocess.Popen(
            [sys.executable, "-c", script, ",".join(self.urls), name, str(lease)],
            stdout=subprocess.PIPE,
            start_new_session=True,  # the terminal's Ctrl-C is ours to handle
            preexec_fn=die_with_parent(),  # and it dies with the demo, SIGKILL included
        )
        assert self.holder.stdout is not None
        readable, _, _ = select.select([self.holder.stdout], [], [], 15.0)
        line = self.holder.stdout.readline() if readable else b""
        if line.strip() != b"held":
            self.check(False, "the holder process took the lock")
            return
        pid = self.holder.pid
        self.out.say("holder", f"process {pid} holds {name!r} with a fixed {lease:g} s lease")
        with self.manager() as mgr:
            lock = mgr.lock(name)
            refused = not lock.acquire(blocking=False)
            self.out.say("observer", "try-acquire refused: it is held" if refused else "got it?!")
            self.holder.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            self.holder.wait()
            self.out.say("chaos", f"SIGKILLed process {pid}: it will never release")
            self.out.say("observer", "waits for the lock (woken when the lease runs out)")
            got = lock.acquire(timeout=lease + 5)
            waited = time.monotonic() - killed_at
            if got:
                self.out.say("observer", f"got it {waited:.2f} s after the kill")
                lock.release()
        self.check(refused, "the lock was held while its holder lived")
        self.check(
            got and waited <= lease + 1.0,
            f"freed by its lease {waited:.2f} s after the holder was killed (lease {lease:g} s)",
        )

    def run(self) -> None:
        # The crash stage kills masters: only those the demo started.
        crash = (
            None if self.ensemble is None else functools.partial(self.stage_crash, self.ensemble)
        )
        stages = [
            ("reentrant lock: workers, nested 'with', a shared counter", self.stage_reentrant),
            ("read/write lock: readers overlap, a writer excludes them", self.stage_rw),
            ("fair lock: first come, first served", self.stage_fair),
            ("two of five masters crash while locking goes on", crash),
            ("a holder killed with SIGKILL: its lease frees the lock", self.stage_sigkill),
        ]
        for number, (title, stage) in enumerate(stages, 1):
            self.out.heading(f"Stage {number}/{len(stages)}: {title}")
            if stage is None:
                self.out.say("demo", "skipped: it kills masters, and these masters are yours")
                continue
            try:
                stage()
            except (LockError, OSError, redis.RedisError) as error:
                self.check(False, f"stage {number} raised {type(error).__name__}: {error}")


def register(add: Add) -> None:
    """Add the ``demo`` command with ``add`` (a subparsers action's ``add_parser``)."""
    demo = add(
        "demo",
        help="a guided, live tour of the lock kinds and of failures",
        description="Show, live, workers contending for a reentrant lock, a read/write "
        "lock, a fair lock, two masters crashing mid-run, and a holder killed with "
        "SIGKILL whose lock frees itself after its lease. Without masters (--masters or "
        f"${MASTERS_ENV}) it starts 5 local servers (redis-server, or valkey-server) and "
        "stops them at the end; "
        "with masters it skips the stage that kills masters. Exit 1 if a check failed.",
    )
    demo.add_argument("--quick", action="store_true", help="keep every stage short")
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """``demo``: the guided tour."""
    colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    out = Out(colour)
    urls = masters(args)
    ensemble: LocalEnsemble | None = None
    demo: Demo | None = None
    # SIGTERM unwinds like Ctrl-C, so the servers are stopped in every case.
    with signals(raise_interrupted, signal.SIGTERM, signal.SIGHUP):
        try:
            if urls is None:
                ensemble = LocalEnsemble(5)
                try:
                    ensemble.start()
                except RuntimeError as error:  # a server did not come up; says why
                    raise CliError(f"cannot start the local masters: {error}") from None
                urls = ensemble.urls
                binary = ensemble.servers[0].binary
                server = f"{os.path.basename(binary)} masters"
                with contextlib.suppress(RuntimeError):  # it runs, but says no version
                    server += " (v" + ".".join(map(str, redis_server_version(binary))) + ")"
                out.say("demo", f"started 5 local {server}: {', '.join(urls)}")
            else:
                out.say("demo", f"using your {len(urls)} masters: {', '.join(urls)}")
            demo = Demo(out, urls, ensemble, args.quick)
            demo.run()
        except (KeyboardInterrupt, Interrupted) as interrupted:
            signum = getattr(interrupted, "signum", signal.SIGINT)
            out.muted = True
            warn("demo interrupted; cleaning up")
            return 128 + int(signum)
        finally:
            holder = demo.holder if demo is not None else None
            if holder is not None:
                if holder.poll() is None:
                    holder.kill()
                    holder.wait()
                if holder.stdout is not None:
                    holder.stdout.close()
            if ensemble is not None:
                ensemble.stop()
                out.say("demo", "stopped the local masters")
    assert demo is not None
    out.heading("Result")
    total, failed = len(demo.checks), demo.checks.count(False)
    if failed:
        out.say("demo", f"{failed} of {total} checks FAILED")
        return EXIT_FAILED
    out.say("demo", f"all {total} checks passed")
    return EXIT_OK
