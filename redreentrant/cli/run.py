"""``redreentrant run NAME -- CMD ARGS...``: a distributed flock(1).

Acquire a lock, run a command while holding it (watchdog-renewed, or on a fixed lease),
forward terminating signals to it, stop it if the lock is lost, release the lock once it
has exited, and pass its exit status through. The command dies with ``redreentrant``
even when that is killed with SIGKILL (Linux: ``PR_SET_PDEATHSIG``, through
:mod:`._process`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from redreentrant import Lock, LockLostError, QuorumUnavailableError
from redreentrant.checks import MAX_PERMITS, check_permits

from ._process import die_with_parent
from .common import (
    EXIT_FAILED,
    PROG,
    Add,
    Interrupted,
    UsageError,
    lock_name,
    number,
    open_manager,
    quorum_message,
    require_masters,
    signals,
    warn,
)

__all__ = [
    "COMMANDS_WITH_CMD",
    "FENCE_ENV",
    "RUN_LEASE",
    "Child",
    "Holding",
    "add_waiting_options",
    "cmd_run",
    "command_of",
    "register",
    "run_under",
    "seconds",
    "split_command",
]

EXIT_NOT_FOUND = 127  # as sh(1) and env(1): the command could not be found
EXIT_NOT_RUNNABLE = 126  # ... found but could not be executed

RUN_LEASE = 30.0
"""Lease of ``run``'s watchdog-renewed locks (renewed every ``RUN_LEASE / 3``): how long
a lock outlives a ``run`` killed with SIGKILL."""

RUN_POLL = 0.1  # seconds between checks for a lost lease while CMD runs
RUN_KILL_GRACE = 10.0  # seconds a CMD stopped for a lost lock gets before SIGKILL
RUN_MASTERS_RETRY = (0.1, 1.0)  # --wait-masters: first and longest pause between tries

FENCE_ENV = "REDREENTRANT_FENCE"
"""The variable that hands the hold's fencing token (``run --fencing``) or the term
(``elect``) to CMD, as a decimal integer."""

#: the commands that run a CMD given after ``--`` (see :func:`split_command`)
COMMANDS_WITH_CMD = ("run", "elect")


def seconds(minimum_exclusive: bool) -> Callable[[str], float]:
    """An argument type: a finite number of seconds, >= 0 (> 0 if ``minimum_exclusive``)."""
    return number(
        float,
        "a number of seconds",
        lambda value: math.isfinite(value) and (value > 0 if minimum_exclusive else value >= 0),
        f"must be a finite number of seconds {'> 0' if minimum_exclusive else '>= 0'}",
    )


def _permits(text: str) -> int:
    try:
        return check_permits(int(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"not a number of permits from 1 to {MAX_PERMITS}: {text!r}"
        ) from error


_RUN_HELP = f"""\
Acquire the lock NAME, run CMD while holding it, release it when CMD ends, and exit
with CMD's exit status (128+N if CMD was killed by signal N; 127 if CMD was not found,
126 if it could not be executed). A distributed flock(1).

The lock is watchdog-renewed for as long as CMD runs (lease {RUN_LEASE:g} s, renewed every
{RUN_LEASE / 3:g} s: a run killed with SIGKILL leaves the lock held for at most {RUN_LEASE:g} s).
With --lease S it has a fixed lease of S seconds instead, never renewed, and S is then
also a time limit for CMD (see below).

With --fencing the lock is taken with a fencing token, larger than every earlier
grant's, and CMD finds it in ${FENCE_ENV} (a decimal integer), to hand to the resource
it writes to, which refuses a smaller token than it has seen. Not with --shared or
--permits: their holds share the lock and have no token.

SIGINT, SIGTERM and SIGHUP are forwarded to CMD; the lock is released once CMD has
exited. A SIGINT is not forwarded when redreentrant is in the foreground of a terminal:
Ctrl-C already reached CMD (same process group), and a second one could cut short its
clean-up. CMD never outlives redreentrant: on Linux, if redreentrant dies (even by
SIGKILL), CMD gets SIGKILL at once (PR_SET_PDEATHSIG; CMD's own children are not
covered). Other platforms have no such signal: there CMD keeps running unprotected.

If the lock is lost while CMD runs (renewal failed on a quorum, someone ran
'unlock --force', or the fixed lease ran out), CMD no longer runs under mutual
exclusion: redreentrant says so on stderr, stops CMD with SIGTERM (SIGKILL after
{RUN_KILL_GRACE:g} s) and exits 1, whatever CMD's own status.

If the lock is not obtained within --timeout, or the masters are unavailable (too few
answer for a quorum), nothing is run: one line on stderr, exit 1, or N with
--conflict-exit-code N (pick an N that CMD never exits with, e.g. 75). With
--wait-masters, an outage of the masters is waited out instead (retrying, until
--timeout if given).
"""


def register(add: Add) -> None:
    """Add the ``run`` command with ``add`` (a subparsers action's ``add_parser``)."""
    run = add(
        "run",
        usage=f"{PROG} run [-h] [--masters URL,...] [--timeout S] "
        "[--shared | --write | --fair | --permits P] [--fencing] [--lease S] [-E N] "
        "[--wait-masters] NAME -- CMD [ARGS...]",
        help="run a command while holding a lock (a distributed flock)",
        description=_RUN_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("name", metavar="NAME", help="the lock's name")
    kind = run.add_mutually_exclusive_group()
    kind.add_argument(
        "--shared",
        action="store_true",
        help="take the read side of the read/write lock NAME: shared with other "
        "--shared runs, excluded by --write runs (and by rw_lock(NAME).write holders)",
    )
    kind.add_argument(
        "--write",
        action="store_true",
        help="take the write side of the read/write lock NAME: excludes --shared and "
        "other --write runs (a plain run takes lock(NAME), a separate lock)",
    )
    kind.add_argument(
        "--fair", action="store_true", help="take the fair lock NAME: granted in FIFO order"
    )
    kind.add_argument(
        "--permits",
        type=_permits,
        metavar="P",
        help="take a permit of the semaphore NAME of P permits: at most P runs of NAME at "
        f"once, across hosts (P from 1 to {MAX_PERMITS})",
    )
    run.add_argument(
        "--fencing",
        action="store_true",
        help=f"take the lock with a fencing token and pass it to CMD in ${FENCE_ENV} "
        "(not with --shared or --permits)",
    )
    run.add_argument(
        "--lease",
        type=seconds(minimum_exclusive=True),
        metavar="S",
        help="a fixed lease of S seconds, never renewed (CMD is stopped if it outlives it)",
    )
    add_waiting_options(run, "the lock")
    run.set_defaults(func=cmd_run)


def add_waiting_options(parser: argparse.ArgumentParser, what: str) -> None:
    """The options of waiting for ``what`` (``the lock``, ``leadership``) that ``run``
    and ``elect`` share: --timeout, -E, --wait-masters and --quarantine."""
    parser.add_argument(
        "--quarantine",
        type=seconds(minimum_exclusive=False),
        metavar="S",
        help="a master whose memory began lately (restarted empty, flushed, failed over)"
        " does not vote for S seconds (default: the longest lease in use here; 0: never;"
        " give every client the longest lease of any)",
    )
    parser.add_argument(
        "--timeout",
        type=seconds(minimum_exclusive=False),
        metavar="S",
        help=f"give up if {what} is not obtained within S seconds (0: one try; "
        "default: wait as long as it takes)",
    )
    parser.add_argument(
        "-E",
        "--conflict-exit-code",
        type=number(
            int, "an integer", lambda v: 0 <= v <= 255, "must be an exit status from 0 to 255"
        ),
        default=EXIT_FAILED,
        metavar="N",
        help=f"exit with N (0-255) when {what} is not obtained (held elsewhere until "
        "--timeout, or refused with --timeout 0) or the masters are unavailable (default 1)",
    )
    parser.add_argument(
        "--wait-masters",
        action="store_true",
        help="when too few masters answer for a quorum, keep trying (until --timeout if "
        "given) instead of giving up at once",
    )
    # Only to say precisely what is wrong when the command is not after '--'.
    parser.add_argument("stray", nargs="*", help=argparse.SUPPRESS)


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """Split ``run ... -- CMD ARGS`` (or ``elect ...``) into the arguments to parse and
    CMD ARGS.

    Done before argparse, which would otherwise read CMD's own options as ours."""
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--masters":
            i += 2
        elif token.startswith("-"):
            i += 1
        else:
            break
    if i < len(argv) and argv[i] in COMMANDS_WITH_CMD and "--" in argv[i + 1 :]:
        cut = argv.index("--", i + 1)
        return argv[:cut], argv[cut + 1 :]
    return argv, None


def command_of(args: argparse.Namespace, usage: str) -> list[str]:
    """The CMD ARGS given after ``--``; a usage error (naming ``usage``, e.g. ``run
    NAME``) if there is none, or if words came before ``--`` that are not ours."""
    command: list[str] | None = args.command_argv
    if args.stray or command is None:
        raise UsageError(f"put the command after '--': {PROG} {usage} -- CMD [ARGS...]")
    if not command:
        raise UsageError("no command after '--'")
    return command


def _terminal_delivers_to_us() -> bool:
    """Whether our process group is the foreground one of our controlling terminal,
    i.e. a Ctrl-C there reaches every process of the group, a child included."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False  # no controlling terminal
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Holding:
    """What CMD runs under (see :func:`run_under`): the lock, and how to take it."""

    lock: Lock
    """Any lock kind, or an election (each is a :class:`~redreentrant.Lock`)."""
    what: str
    """How messages name it: ``lock 'x'``, ``leadership of 'x'``."""
    take: Callable[[float | None], bool]
    """One acquire within a timeout (None: no limit; 0: one try): whether it was
    obtained. Raises QuorumUnavailableError when the masters are unavailable."""
    fixed: bool = False
    """Held on a fixed lease, never renewed: its running out is the loss."""
    fenced: bool = False
    """Hand the hold's fencing token to CMD in ``$REDREENTRANT_FENCE``."""


class Child:
    """The running CMD, and what happens to it from signal handlers and the watchdog."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.spawning = False
        self.pending: list[int] = []  # signals that came while CMD was being started
        self.lost = threading.Event()  # set from the watchdog thread by on_lost

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        process = self.process
        if process is None:
            if self.spawning:
                self.pending.append(signum)
                return
            raise Interrupted(signum)
        if process.returncode is not None:
            return  # CMD is done; the lock is being released and we exit right after
        if signum == signal.SIGINT and _terminal_delivers_to_us():
            return  # the terminal sent Ctrl-C to CMD as well
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)

    def on_lost(self, lock: object) -> None:
        """The manager's ``on_lost``: the lock (or leadership) CMD runs under is gone."""
        self.lost.set()


def cmd_run(args: argparse.Namespace) -> int:
    """``run``: hold a lock while a command runs, pass its exit status through."""
    command = command_of(args, "run NAME")
    if args.fencing and (args.shared or args.permits is not None):
        flag = "--shared" if args.shared else "--permits"
        raise UsageError(
            f"--fencing does not go with {flag}: its holds share the lock and have no "
            "fencing token (use --fencing alone, or with --write or --fair)"
        )
    name = lock_name(args.name)
    child = Child()
    with open_manager(
        require_masters(args), lease=RUN_LEASE, on_lost=child.on_lost, quarantine=args.quarantine
    ) as mgr:
        fencing = True if args.fencing else None
        lock: Lock
        if args.shared:
            lock = mgr.rw_lock(name).read
        elif args.write:
            lock = mgr.rw_lock(name, fencing=fencing).write
        elif args.fair:
            lock = mgr.fair_lock(name, fencing=fencing)
        elif args.permits is not None:
            lock = mgr.semaphore(name, args.permits)
        else:
            lock = mgr.lock(name, fencing=fencing)
        take = functools.partial(_acquire_once, lock, lease=args.lease)
        holding = Holding(
            lock, f"lock {name!r}", take, fixed=args.lease is not None, fenced=args.fencing
        )
        return run_under(holding, command, child, args)


def run_under(holding: Holding, command: list[str], child: Child, args: argparse.Namespace) -> int:
    """Acquire ``holding`` (waiting as ``args`` say: --timeout, --wait-masters, -E), run
    ``command`` under it with ``child`` (``on_lost`` of the manager goes to
    ``child.on_lost``), release it, and return the exit status ``run`` exits with."""
    what = holding.what
    with signals(child.on_signal, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            try:
                got = _acquire(holding, args.timeout, args.wait_masters)
            except QuorumUnavailableError as error:
                within = "" if args.timeout is None else f" within {args.timeout:g} s"
                warn(f"{what} not obtained{within}: {quorum_message(error)}")
                return int(args.conflict_exit_code)
            if not got:
                warn(f"{what} is held elsewhere: not obtained within {args.timeout:g} s")
                return int(args.conflict_exit_code)
            # Run CMD under the held lock; release it however CMD ends.
            status, lost = EXIT_FAILED, False
            try:
                status, lost = _run_child(holding, command, child)
            finally:
                status = _release(holding, status, lost)
            return status
        except Interrupted as interrupted:
            # The signal may have come after a grant but before acquire() returned.
            lock = holding.lock
            with contextlib.suppress(Exception):
                while lock.hold_count:
                    lock.release()
            warn(
                f"interrupted ({signal.Signals(interrupted.signum).name}) before the "
                f"command started; {what} not held"
            )
            return 128 + interrupted.signum


def _acquire(holding: Holding, timeout: float | None, wait_masters: bool) -> bool:
    """Acquire within ``timeout`` (None: no limit; 0: one try). QuorumUnavailableError
    if the masters are unavailable, unless ``wait_masters``: then the acquire is tried
    again (said once on stderr) until they answer or the timeout is spent."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause, longest = RUN_MASTERS_RETRY
    told = False
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return holding.take(left)
        except QuorumUnavailableError as error:
            if not wait_masters or (deadline is not None and time.monotonic() >= deadline):
                raise
            if not told:
                told = True
                warn(
                    f"{quorum_message(error)}: waiting for the masters to get {holding.what} "
                    "(--wait-masters)"
                )
        rest = None if deadline is None else deadline - time.monotonic()
        time.sleep(max(0.0, pause if rest is None else min(pause, rest)))
        pause = min(2 * pause, longest)


def _acquire_once(lock: Lock, timeout: float | None, lease: float | None) -> bool:
    try:
        # None: no limit (-1); 0: one try (blocking=False)
        return lock.acquire(blocking=timeout != 0, timeout=timeout or -1, lease=lease)
    except ValueError as error:  # a lease too short for the drift and master timeout
        raise UsageError(str(error)) from None


def _run_child(holding: Holding, command: list[str], child: Child) -> tuple[int, bool]:
    """Start CMD and wait for it: (exit status, whether it was stopped for a lost lock)."""
    env = None
    if holding.fenced:
        env = {**os.environ, FENCE_ENV: str(holding.lock.token)}
    child.spawning = True
    try:
        # CMD dies with us (Linux): a run killed with SIGKILL never leaves CMD running
        # without the lock while another run gets it.
        child.process = subprocess.Popen(command, env=env, preexec_fn=die_with_parent())
    except FileNotFoundError:
        warn(f"{command[0]}: command not found")
        return EXIT_NOT_FOUND, False
    except OSError as error:
        warn(f"cannot run {command[0]}: {error.strerror}")
        return EXIT_NOT_RUNNABLE, False
    finally:
        child.spawning = False
    for signum in child.pending:
        child.on_signal(signum, None)
    if _wait_for(child.process, holding, child):
        return EXIT_FAILED, True
    code = child.process.returncode
    return (128 - code if code < 0 else code), False  # as a shell says: 128+N for signal N


def _wait_for(process: subprocess.Popen[bytes], holding: Holding, child: Child) -> bool:
    """Wait for CMD to exit; return whether it was stopped because the lock was lost."""
    stopped_at: float | None = None
    while True:
        try:
            process.wait(timeout=RUN_POLL)
            return stopped_at is not None
        except subprocess.TimeoutExpired:
            pass
        if stopped_at is None:
            # A fixed lease is never renewed, so no watchdog reports it: its validity
            # running out is the loss.
            expired = holding.fixed and holding.lock.remaining() <= 0
            if child.lost.is_set() or expired:
                why = "its fixed lease ran out" if expired else "its lease was lost"
                warn(
                    f"{holding.what} lost while the command ran ({why}): stopping it (pid "
                    f"{process.pid}) with SIGTERM; exit status will be 1"
                )
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()
                stopped_at = time.monotonic()
        elif time.monotonic() - stopped_at > RUN_KILL_GRACE:
            with contextlib.suppress(ProcessLookupError):
                process.kill()


def _release(holding: Holding, status: int, lost: bool) -> int:
    """Release the lock; return the exit status to use (1 if it turned out lost)."""
    try:
        holding.lock.release()
    except LockLostError as error:
        if not lost:  # lost after the last check: CMD's end ran unprotected
            warn(f"{holding.what} was lost before the command ended: {error}")
        return EXIT_FAILED
    except QuorumUnavailableError as error:
        # CMD ran under the lock; only the clean-up failed, and the lease ends it.
        warn(
            f"could not release {holding.what} ({quorum_message(error)}); it frees itself "
            "when its lease runs out"
        )
    return status
