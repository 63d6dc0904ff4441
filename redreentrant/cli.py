"""The ``redreentrant`` command line (also ``python -m redreentrant``).

Commands::

    redreentrant demo [--quick]                       a guided tour on local masters
    redreentrant run NAME [options] -- CMD ARGS...    a distributed flock(1)
    redreentrant inspect NAME [--json]                what every master holds for NAME
    redreentrant unlock --force NAME                  delete NAME's lock, whoever holds it
    redreentrant ensemble up|down|status              local masters for development

Masters come from ``--masters URL,URL,...`` (accepted before or after the command) or
the ``REDREENTRANT_MASTERS`` environment variable, parsed by
:func:`redreentrant.managerbase.master_urls`: a bare ``host:port`` means
``redis://host:port/0``, and a malformed entry is a usage error.

Exit status: 0 on success; 1 when a lock is not obtained, the masters are unavailable,
or a demo check failed (``run --conflict-exit-code N`` makes the first two N); 2 for
usage errors (bad arguments, no masters, a malformed master, an empty name); ``run``
passes its command's status through. Errors are one line on stderr, starting with
``redreentrant:``.

``run``'s command, and the processes ``demo`` starts, die with ``redreentrant`` even when
it is killed with SIGKILL (Linux: ``PR_SET_PDEATHSIG``; local masters: the reaper of
:mod:`redreentrant.ensemble`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any, NoReturn, Protocol

from . import __version__
from ._core.keys import validate_name
from ._core.owner import OwnerInfo, parse_owner
from ._core.settings import master_urls
from ._sync.manager import LockManager
from .demo import Demo, Out, first_line
from .ensemble import (
    LocalEnsemble,
    detached_servers,
    detached_status,
    die_with_parent,
    stop_detached,
)
from .errors import LockError, LockLostError, QuorumUnavailableError, RedisServerNotFound

__all__ = ["main"]

PROG = "redreentrant"
MASTERS_ENV = "REDREENTRANT_MASTERS"
STATE_ENV = "REDREENTRANT_ENSEMBLE_STATE"
STATE_FILE = "redreentrant-ensemble.json"
HOST = "127.0.0.1"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 127  # as sh(1) and env(1): the command could not be found
EXIT_NOT_RUNNABLE = 126  # ... found but could not be executed

RUN_LEASE = 30.0
"""Lease of ``run``'s watchdog-renewed locks (renewed every ``RUN_LEASE / 3``): how long
a lock outlives a ``run`` killed with SIGKILL."""

RUN_POLL = 0.1  # seconds between checks for a lost lease while CMD runs
RUN_KILL_GRACE = 10.0  # seconds a CMD stopped for a lost lock gets before SIGKILL
RUN_MASTERS_RETRY = (0.1, 1.0)  # --wait-masters: first and longest pause between tries


_STOP_TIMEOUT = 5.0  # seconds between SIGTERM and SIGKILL for ``ensemble down``


# -- errors and argument parsing ------------------------------------------------------


class CliError(Exception):
    """A user-facing failure: printed as one ``redreentrant: ...`` line, exit ``code``."""

    code = EXIT_FAILED

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class UsageError(CliError):
    """Bad arguments or missing configuration: exit 2."""

    code = EXIT_USAGE


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage dump) and exit 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _seconds(minimum_exclusive: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if not math.isfinite(value) or value < 0 or (minimum_exclusive and value == 0):
            bound = "> 0" if minimum_exclusive else ">= 0"
            raise argparse.ArgumentTypeError(f"must be a finite number of seconds {bound}")
        return value

    return parse


def _exit_code(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= value <= 255:
        raise argparse.ArgumentTypeError("must be an exit status from 0 to 255")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


_RUN_HELP = f"""\
Acquire the lock NAME, run CMD while holding it, release it when CMD ends, and exit
with CMD's exit status (128+N if CMD was killed by signal N; 127 if CMD was not found,
126 if it could not be executed). A distributed flock(1).

The lock is watchdog-renewed for as long as CMD runs (lease {RUN_LEASE:g} s, renewed every
{RUN_LEASE / 3:g} s: a run killed with SIGKILL leaves the lock held for at most {RUN_LEASE:g} s).
With --lease S it has a fixed lease of S seconds instead, never renewed, and S is then
also a time limit for CMD (see below).

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

_ENSEMBLE_HELP = """\
Local redis-server masters for development, bound to 127.0.0.1 only, without
persistence. 'up' starts them detached (they keep running after the command exits) and
prints the REDREENTRANT_MASTERS=... line to use (the only line on stdout, so
'export "$(redreentrant ensemble up)"' works); 'status' shows each one; 'down' stops
them and removes their directory and the state file.

The state file (pids, ports, directory) is --state FILE, else $REDREENTRANT_ENSEMBLE_STATE,
else $XDG_RUNTIME_DIR/redreentrant-ensemble.json, else redreentrant-ensemble.json in the
temp directory.
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``redreentrant`` command."""
    common = _Parser(add_help=False)
    # SUPPRESS: a subcommand's --masters must not overwrite one given before the
    # subcommand with its default (argparse copies every sub-namespace attribute).
    common.add_argument(
        "--masters",
        metavar="URL,...",
        default=argparse.SUPPRESS,
        help=f"comma-separated redis URLs of the masters (default: ${MASTERS_ENV}); "
        "a bare host:port means redis://host:port/0",
    )
    parser = _Parser(
        prog=PROG,
        parents=[common],
        description="Reentrant distributed locks on a Redlock quorum of Redis masters.",
        epilog="Exit status: 0 ok; 1 lock not obtained, masters unavailable (N with "
        "'run -E N'), or a check failed; 2 usage error. 'run' passes its command's "
        "status through.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        parents=[common],
        help="a guided, live tour of the lock kinds and of failures",
        description="Show, live, workers contending for a reentrant lock, a read/write "
        "lock, a fair lock, two masters crashing mid-run, and a holder killed with "
        "SIGKILL whose lock frees itself after its lease. Without masters (--masters or "
        f"${MASTERS_ENV}) it starts 5 local redis-servers and stops them at the end; "
        "with masters it skips the stage that kills masters. Exit 1 if a check failed.",
    )
    demo.add_argument("--quick", action="store_true", help="keep every stage short")
    demo.set_defaults(func=cmd_demo)

    run = commands.add_parser(
        "run",
        parents=[common],
        usage=f"{PROG} run [-h] [--masters URL,...] [--timeout S] [--shared | --write | --fair] "
        "[--lease S] [-E N] [--wait-masters] NAME -- CMD [ARGS...]",
        help="run a command while holding a lock (a distributed flock)",
        description=_RUN_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("name", metavar="NAME", help="the lock's name")
    run.add_argument(
        "--timeout",
        type=_seconds(minimum_exclusive=False),
        metavar="S",
        help="give up if the lock is not obtained within S seconds (0: one try; "
        "default: wait as long as it takes)",
    )
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
    run.add_argument(
        "--lease",
        type=_seconds(minimum_exclusive=True),
        metavar="S",
        help="a fixed lease of S seconds, never renewed (CMD is stopped if it outlives it)",
    )
    run.add_argument(
        "-E",
        "--conflict-exit-code",
        type=_exit_code,
        default=EXIT_FAILED,
        metavar="N",
        help="exit with N (0-255) when the lock is not obtained (held elsewhere until "
        "--timeout, or refused with --timeout 0) or the masters are unavailable (default 1)",
    )
    run.add_argument(
        "--wait-masters",
        action="store_true",
        help="when too few masters answer for a quorum, keep trying (until --timeout if "
        "given) instead of giving up at once",
    )
    # Only to say precisely what is wrong when the command is not after '--'.
    run.add_argument("stray", nargs="*", help=argparse.SUPPRESS)
    run.set_defaults(func=cmd_run)

    inspect = commands.add_parser(
        "inspect",
        parents=[common],
        help="show what every master holds for a lock name",
        description="Ask every master what it holds under NAME, of every lock kind: "
        "the kind, the mode (read/write locks), the holders with their hold counts, "
        "the TTL, and the queue (fair locks); then, for every holder and waiter, its "
        "host, pid and thread or task. A read-only look; exit 1 if fewer than a "
        "quorum of masters answered.",
    )
    inspect.add_argument("name", metavar="NAME", help="the lock's name")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    inspect.set_defaults(func=cmd_inspect)

    unlock = commands.add_parser(
        "unlock",
        parents=[common],
        help="delete a lock whoever holds it (needs --force)",
        description="Delete every kind of lock named NAME on every master, whoever holds "
        "it, and wake its waiters. For recovering from a stuck holder: the holder is not "
        "told until its next renewal, re-entry or release fails, so it may still be "
        "working as if it held the lock. Refused (exit 2) without --force.",
    )
    unlock.add_argument("name", metavar="NAME", help="the lock's name")
    unlock.add_argument("--force", action="store_true", help="really delete the lock")
    unlock.set_defaults(func=cmd_unlock)

    ensemble = commands.add_parser(
        "ensemble",
        parents=[common],
        help="start/stop local redis-server masters for development",
        description=_ENSEMBLE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    state = _Parser(add_help=False)
    state.add_argument("--state", metavar="FILE", help="the state file (see above)")
    actions = ensemble.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser(
        "up",
        parents=[common, state],
        help="start N local masters, detached",
        description="Start N redis-server masters on 127.0.0.1, detached, and print the "
        "REDREENTRANT_MASTERS=... line (stdout). Refused if the state file names "
        "servers that are still up.",
    )
    up.add_argument("--size", type=_positive_int, default=5, metavar="N", help="default 5")
    up.add_argument("--port-file", metavar="F", help="also write the ports to F, one a line")
    up.set_defaults(func=cmd_ensemble_up)
    down = actions.add_parser(
        "down",
        parents=[common, state],
        help="stop them and remove their files",
        description="Stop the servers of the state file (SIGTERM, then SIGKILL after "
        f"{_STOP_TIMEOUT:g} s), remove their directory and the state file. A pid is only "
        "signalled if it is still that redis-server. Exit 0 also when none is up.",
    )
    down.set_defaults(func=cmd_ensemble_down)
    status = actions.add_parser(
        "status",
        parents=[common, state],
        help="show whether each one is up",
        description="Show each server of the state file as up, down or not answering. "
        "Exit 0 if all are up, 1 otherwise (also when there is no state file).",
    )
    status.set_defaults(func=cmd_ensemble_status)
    return parser


def _split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """Split ``run ... -- CMD ARGS`` into the arguments to parse and CMD ARGS.

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
    if i < len(argv) and argv[i] == "run" and "--" in argv[i + 1 :]:
        cut = argv.index("--", i + 1)
        return argv[:cut], argv[cut + 1 :]
    return argv, None


# -- masters and managers ----------------------------------------------------------------


def _master_urls(args: argparse.Namespace) -> list[str] | None:
    """The masters given by --masters or $REDREENTRANT_MASTERS, or None if neither.

    Parsed by the library's own parser: a malformed entry is a usage error here, not a
    failure to resolve a host name later."""
    raw: str | None = getattr(args, "masters", None)
    source = "--masters"
    if raw is None:
        raw = os.environ.get(MASTERS_ENV)
        source = f"${MASTERS_ENV}"
    if raw is None or not raw.strip():
        return None
    try:
        return master_urls(raw)
    except ValueError as error:
        raise UsageError(f"bad masters in {source}: {error}") from None


def _require_masters(args: argparse.Namespace) -> list[str]:
    urls = _master_urls(args)
    if urls is None:
        raise UsageError(
            f"no masters: give --masters URL,URL,... or set {MASTERS_ENV} "
            f"('{PROG} ensemble up' starts local masters and prints that line)"
        )
    return urls


def _open_manager(urls: Sequence[str], **options: Any) -> LockManager:
    try:
        return LockManager(list(urls), **options)
    except (ValueError, TypeError) as error:
        raise UsageError(f"bad masters ({', '.join(urls)}): {error}") from None


def _name(text: str) -> str:
    try:
        return validate_name(text)
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from None


def _quorum_message(error: QuorumUnavailableError) -> str:
    first = next(iter(error.errors.items()), None)
    detail = ""
    if first is not None:
        master, cause = first
        more = len(error.errors) - 1
        detail = f" ({master}: {first_line(str(cause) or type(cause).__name__)}"
        detail += f"; and {more} more)" if more else ")"
    return (
        f"masters unavailable: {len(error.errors)} failed to answer, a quorum of "
        f"{error.needed} is out of reach{detail}"
    )


# -- signals --------------------------------------------------------------------------


class _Interrupted(BaseException):
    """A terminating signal arrived (raised from its handler, in the main thread)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_Handler = Callable[[int, FrameType | None], Any]


@contextlib.contextmanager
def _signals(handler: _Handler, *signums: int) -> Iterator[None]:
    """Install ``handler`` for ``signums`` for the duration of the block.

    A signal ignored on entry stays ignored: under ``nohup`` a hang-up must neither
    stop us nor be forwarded, and CMD then inherits the ignored disposition too."""
    previous: dict[int, Any] = {}
    try:
        for signum in signums:
            if signal.getsignal(signum) == signal.SIG_IGN:
                continue
            previous[signum] = signal.signal(signum, handler)
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise _Interrupted(signum)


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


def _exit_status(returncode: int) -> int:
    """A child's status the way a shell reports it: 128+N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


# -- run --------------------------------------------------------------------------------


class _Lockish(Protocol):
    """What ``run`` needs of any lock kind (plain, read side, fair)."""

    def acquire(
        self, blocking: bool = ..., timeout: float = ..., lease: float | None = ...
    ) -> bool: ...

    def release(self) -> None: ...

    def remaining(self) -> float: ...

    @property
    def hold_count(self) -> int: ...


class _Child:
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
            raise _Interrupted(signum)
        if process.returncode is not None:
            return  # CMD is done; the lock is being released and we exit right after
        if signum == signal.SIGINT and _terminal_delivers_to_us():
            return  # the terminal sent Ctrl-C to CMD as well
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)

    def on_lost(self, lock: object) -> None:
        self.lost.set()


def cmd_run(args: argparse.Namespace) -> int:
    """``run``: hold a lock while a command runs, pass its exit status through."""
    command: list[str] | None = args.command_argv
    if args.stray or command is None:
        raise UsageError(f"put the command after '--': {PROG} run NAME -- CMD [ARGS...]")
    if not command:
        raise UsageError("no command after '--'")
    name = _name(args.name)
    child = _Child()
    with _open_manager(_require_masters(args), lease=RUN_LEASE, on_lost=child.on_lost) as mgr:
        lock: _Lockish
        if args.shared:
            lock = mgr.rw_lock(name).read
        elif args.write:
            lock = mgr.rw_lock(name).write
        elif args.fair:
            lock = mgr.fair_lock(name)
        else:
            lock = mgr.lock(name)
        with _signals(child.on_signal, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                try:
                    got = _acquire(lock, name, args.timeout, args.lease, args.wait_masters)
                except QuorumUnavailableError as error:
                    within = "" if args.timeout is None else f" within {args.timeout:g} s"
                    print(
                        f"{PROG}: lock {name!r} not obtained{within}: {_quorum_message(error)}",
                        file=sys.stderr,
                    )
                    return int(args.conflict_exit_code)
                if not got:
                    print(
                        f"{PROG}: lock {name!r} is held elsewhere: not obtained within "
                        f"{args.timeout:g} s",
                        file=sys.stderr,
                    )
                    return int(args.conflict_exit_code)
                return _run_holding(lock, name, command, child, fixed=args.lease is not None)
            except _Interrupted as interrupted:
                # The signal may have come after a grant but before acquire() returned.
                with contextlib.suppress(Exception):
                    while lock.hold_count:
                        lock.release()
                print(
                    f"{PROG}: interrupted ({signal.Signals(interrupted.signum).name}) before "
                    f"the command started; lock {name!r} not held",
                    file=sys.stderr,
                )
                return 128 + interrupted.signum


def _acquire(
    lock: _Lockish, name: str, timeout: float | None, lease: float | None, wait_masters: bool
) -> bool:
    """Acquire within ``timeout`` (None: no limit; 0: one try). QuorumUnavailableError
    if the masters are unavailable, unless ``wait_masters``: then the acquire is tried
    again (said once on stderr) until they answer or the timeout is spent."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause, longest = RUN_MASTERS_RETRY
    told = False
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return _acquire_once(lock, left, lease)
        except QuorumUnavailableError as error:
            if not wait_masters or (deadline is not None and time.monotonic() >= deadline):
                raise
            if not told:
                told = True
                print(
                    f"{PROG}: {_quorum_message(error)}: waiting for the masters to "
                    f"get lock {name!r} (--wait-masters)",
                    file=sys.stderr,
                )
        rest = None if deadline is None else deadline - time.monotonic()
        time.sleep(max(0.0, pause if rest is None else min(pause, rest)))
        pause = min(2 * pause, longest)


def _acquire_once(lock: _Lockish, timeout: float | None, lease: float | None) -> bool:
    try:
        if timeout is None:
            return lock.acquire(lease=lease)
        if timeout == 0:
            return lock.acquire(blocking=False, lease=lease)
        return lock.acquire(timeout=timeout, lease=lease)
    except ValueError as error:  # a lease too short for the drift and master timeout
        raise UsageError(str(error)) from None


def _run_holding(
    lock: _Lockish, name: str, command: list[str], child: _Child, *, fixed: bool
) -> int:
    """Run CMD under the held lock; release it however CMD ends; return the status."""
    status, lost = EXIT_FAILED, False
    try:
        status, lost = _run_child(lock, name, command, child, fixed=fixed)
    finally:
        status = _release(lock, name, status, lost)
    return status


def _run_child(
    lock: _Lockish, name: str, command: list[str], child: _Child, *, fixed: bool
) -> tuple[int, bool]:
    """Start CMD and wait for it: (exit status, whether it was stopped for a lost lock)."""
    child.spawning = True
    try:
        # CMD dies with us (Linux): a run killed with SIGKILL never leaves CMD running
        # without the lock while another run gets it.
        child.process = subprocess.Popen(command, preexec_fn=die_with_parent())
    except FileNotFoundError:
        print(f"{PROG}: {command[0]}: command not found", file=sys.stderr)
        return EXIT_NOT_FOUND, False
    except OSError as error:
        print(f"{PROG}: cannot run {command[0]}: {error.strerror}", file=sys.stderr)
        return EXIT_NOT_RUNNABLE, False
    finally:
        child.spawning = False
    for signum in child.pending:
        child.on_signal(signum, None)
    if _wait_for(child.process, lock, name, child, fixed=fixed):
        return EXIT_FAILED, True
    return _exit_status(child.process.returncode), False


def _wait_for(
    process: subprocess.Popen[bytes], lock: _Lockish, name: str, child: _Child, *, fixed: bool
) -> bool:
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
            expired = fixed and lock.remaining() <= 0
            if child.lost.is_set() or expired:
                why = "its fixed lease ran out" if expired else "its lease was lost"
                print(
                    f"{PROG}: lock {name!r} lost while the command ran ({why}): stopping "
                    f"it (pid {process.pid}) with SIGTERM; exit status will be 1",
                    file=sys.stderr,
                )
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()
                stopped_at = time.monotonic()
        elif time.monotonic() - stopped_at > RUN_KILL_GRACE:
            with contextlib.suppress(ProcessLookupError):
                process.kill()


def _release(lock: _Lockish, name: str, status: int, lost: bool) -> int:
    """Release the lock; return the exit status to use (1 if it turned out lost)."""
    try:
        lock.release()
    except LockLostError as error:
        if not lost:  # lost after the last check: CMD's end ran unprotected
            print(
                f"{PROG}: lock {name!r} was lost before the command ended: {error}",
                file=sys.stderr,
            )
        return EXIT_FAILED
    except QuorumUnavailableError as error:
        # CMD ran under the lock; only the clean-up failed, and the lease ends it.
        print(
            f"{PROG}: could not release lock {name!r} ({_quorum_message(error)}); it frees "
            "itself when its lease runs out",
            file=sys.stderr,
        )
    return status


# -- inspect ------------------------------------------------------------------------


class _LockView(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def mode(self) -> str | None: ...
    @property
    def ttl(self) -> float | None: ...
    @property
    def holders(self) -> dict[str, int]: ...
    @property
    def queue(self) -> list[str]: ...


class _MasterView(Protocol):
    @property
    def master(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def locks(self) -> Sequence[_LockView]: ...


def _summary(views: Sequence[_MasterView], quorum: int) -> tuple[str, str]:
    """(state, sentence): what a quorum of masters agrees on for the name."""
    answered = [v for v in views if v.error is None]
    if len(answered) < quorum:
        failed = next((v for v in views if v.error is not None), None)
        first = f" ({failed.master}: {first_line(failed.error or '')})" if failed else ""
        return "unknown", (
            f"masters unavailable: only {len(answered)} of {len(views)} answered, a "
            f"quorum of {quorum} is out of reach{first}"
        )
    seen: dict[tuple[str, str | None, str], list[int]] = {}
    for view in answered:
        for lv in view.locks:
            for owner, count in lv.holders.items():
                seen.setdefault((lv.kind, lv.mode, owner), []).append(count)
    held = [(key, counts) for key, counts in seen.items() if len(counts) >= quorum]
    if held:
        parts = [
            f"{kind}{'/' + mode if mode else ''} by {_who(owner)} (hold count {max(counts)}, "
            f"on {len(counts)} of {len(views)} masters)"
            for (kind, mode, owner), counts in held
        ]
        return "held", "held: " + "; ".join(parts)
    partial = sum(1 for v in answered if v.locks)
    if partial:
        return "partial", (
            f"not held on a quorum of {quorum}: leftovers on {partial} master(s) "
            "(an acquire under way, or keys that expire with their TTL)"
        )
    return "free", "free"


# A read/write lock's view names each holder once per side: "<owner id> (read)".
_SIDE = re.compile(r" \((?:read|write)\)$")


def _parse(holder: str) -> OwnerInfo | None:
    """What a holder or waiter entry of a view says about its owner."""
    return parse_owner(_SIDE.sub("", holder))


def _who(owner: str) -> str:
    """``host H pid P thread T`` for an owner id, or the id itself if it says nothing."""
    info = _parse(owner)
    return owner if info is None else info.describe()


def _owner_json(info: OwnerInfo | None) -> dict[str, object] | None:
    if info is None:
        return None
    return {
        "host": info.host,
        "pid": info.pid,
        "kind": info.kind,
        "token": info.token,
        "name": info.name,
    }


def _owners(views: Sequence[_MasterView]) -> dict[str, tuple[int, int]]:
    """Every owner seen (first seen first): on how many masters it holds, and on how
    many it waits in a queue."""
    seen: dict[str, tuple[set[int], set[int]]] = {}
    for index, view in enumerate(views):
        for lv in [] if view.error is not None else view.locks:
            for owner in lv.holders:
                seen.setdefault(_SIDE.sub("", owner), (set(), set()))[0].add(index)
            for owner in lv.queue:
                seen.setdefault(_SIDE.sub("", owner), (set(), set()))[1].add(index)
    return {owner: (len(holds), len(waits)) for owner, (holds, waits) in seen.items()}


def _owner_rows(views: Sequence[_MasterView]) -> list[list[str]]:
    """The owners table: host, pid and thread or task of every holder and waiter, each
    in a column of its own (never cut: the pid is what an operator acts on)."""
    rows = [["OWNER", "HOST", "PID", "THREAD/TASK", "HOLDS ON", "QUEUED ON"]]
    total = len(views)
    for owner, (holds, waits) in _owners(views).items():
        info = _parse(owner)
        if info is None:
            host = pid = who = "?"
        else:
            host, pid = info.host, str(info.pid)
            who = f"{info.kind} {info.name if info.name is not None else info.token}"
        rows.append(
            [
                owner,
                host,
                pid,
                who,
                f"{holds} of {total}" if holds else "-",
                f"{waits} of {total}" if waits else "-",
            ]
        )
    return rows


def _ttl(ttl: float | None) -> str:
    return "-" if ttl is None else f"{ttl:.1f}s"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def cmd_inspect(args: argparse.Namespace) -> int:
    """``inspect``: each master's view of a name (table or JSON)."""
    name = _name(args.name)
    with _open_manager(_require_masters(args)) as mgr:
        views: Sequence[_MasterView] = mgr.inspect(name)
        quorum = mgr.quorum
    state, sentence = _summary(views, quorum)
    if args.json:
        document = {
            "name": name,
            "quorum": quorum,
            "state": state,
            "summary": sentence,
            "masters": [
                {
                    "master": v.master,
                    "error": v.error,
                    "locks": [
                        {
                            "kind": lv.kind,
                            "mode": lv.mode,
                            "ttl": lv.ttl,
                            "holders": dict(lv.holders),
                            "queue": list(lv.queue),
                            # Who each holder and waiter is (null: an id that says not).
                            "owners": {
                                owner: _owner_json(_parse(owner))
                                for owner in [*lv.holders, *lv.queue]
                            },
                        }
                        for lv in v.locks
                    ],
                }
                for v in views
            ],
        }
        print(json.dumps(document, indent=2))
    else:
        print(f"lock {name!r} on {len(views)} masters, quorum {quorum}: {sentence}")
        rows = [["MASTER", "KIND", "MODE", "TTL", "HOLDERS (hold count)", "QUEUE"]]
        for v in views:
            if v.error is not None:
                rows.append([v.master, "error", "", "", first_line(v.error), ""])
            elif not v.locks:
                rows.append([v.master, "-", "-", "-", "(free)", "-"])
            for lv in [] if v.error is not None else v.locks:
                holders = ", ".join(f"{o} x{c}" for o, c in lv.holders.items()) or "(none)"
                rows.append(
                    [
                        v.master,
                        lv.kind,
                        lv.mode or "-",
                        _ttl(lv.ttl),
                        holders,
                        ", ".join(lv.queue) or "-",
                    ]
                )
        print(_table(rows))
        owners = _owner_rows(views)
        if len(owners) > 1:
            print()
            print(_table(owners))
    if state == "unknown":
        print(f"{PROG}: {sentence}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


# -- unlock ---------------------------------------------------------------------------


def cmd_unlock(args: argparse.Namespace) -> int:
    """``unlock --force``: delete every kind of lock under a name."""
    name = _name(args.name)
    if not args.force:
        raise UsageError(
            f"refusing to unlock {name!r} without --force: it deletes the lock whoever "
            f"holds it (see '{PROG} inspect {name}' first)"
        )
    with _open_manager(_require_masters(args)) as mgr:
        deleted = mgr.force_unlock(name)
    if deleted:
        print(f"unlocked {name!r}: its keys were deleted and its waiters woken")
    else:
        print(f"{name!r} was not locked: nothing was deleted")
    return EXIT_OK


# -- ensemble -------------------------------------------------------------------------


def _state_path(args: argparse.Namespace) -> str:
    if args.state:
        return os.path.abspath(str(args.state))
    from_env = os.environ.get(STATE_ENV)
    if from_env:
        return os.path.abspath(from_env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = runtime if runtime and os.path.isdir(runtime) else tempfile.gettempdir()
    return os.path.join(base, STATE_FILE)


def _load_state(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise CliError(f"cannot read the state file {path}: {error}") from None
    if not isinstance(state, dict) or not isinstance(state.get("servers"), list):
        raise CliError(f"{path} is not a redreentrant ensemble state file")
    return state


def _write_state(path: str, state: dict[str, Any]) -> None:
    # Written aside and renamed: a reader never sees half a file.
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=2)
        f.write("\n")
    os.replace(partial, path)


def _servers(state: dict[str, Any]) -> list[tuple[int, int]]:
    """(port, pid) of every server in a state file."""
    try:
        return detached_servers(state)
    except ValueError:
        raise CliError("the state file is corrupt: remove it and stop servers by hand") from None


def _masters_line(ports: Sequence[int]) -> str:
    return f"{MASTERS_ENV}=" + ",".join(f"redis://{HOST}:{port}/0" for port in ports)


def cmd_ensemble_up(args: argparse.Namespace) -> int:
    """``ensemble up``: start detached local masters and record them in a state file."""
    path = _state_path(args)
    old = _load_state(path)
    if old is not None:
        if any(word != "down" for _, _, word in _status(old)):
            raise CliError(
                f"an ensemble is already up (state file {path}): see "
                f"'{PROG} ensemble status', stop it with '{PROG} ensemble down'"
            )
        stop_detached(old)  # nothing is up: this only removes its directory
        os.unlink(path)
        print(f"{PROG}: removed the stale state file {path} (no server was up)", file=sys.stderr)
    ensemble = LocalEnsemble(args.size)
    try:
        ensemble.start()
    except RuntimeError as error:  # a server did not come up; says why
        ensemble.stop()
        raise CliError(f"cannot start the local masters: {first_line(str(error))}") from None
    try:
        _write_state(path, ensemble.detach())
    except BaseException:
        stop_detached(_load_state(path) or {"servers": []})
        raise
    ports = [server.port for server in ensemble.servers]
    if args.port_file:
        with open(args.port_file, "w", encoding="utf-8") as f:
            f.writelines(f"{port}\n" for port in ports)
    print(
        f"{PROG}: started {len(ports)} redis-server masters on {HOST} (state file "
        f"{path}); stop them with '{PROG} ensemble down'",
        file=sys.stderr,
    )
    print(_masters_line(ports))
    return EXIT_OK


def _status(state: dict[str, Any]) -> list[tuple[int, int, str]]:
    _servers(state)  # a corrupt file is a clear error, not a traceback
    return detached_status(state)


def cmd_ensemble_status(args: argparse.Namespace) -> int:
    """``ensemble status``: each recorded server up, down or not answering."""
    path = _state_path(args)
    state = _load_state(path)
    if state is None:
        print(f"no ensemble: no state file {path}")
        return EXIT_FAILED
    rows = _status(state)
    print(f"ensemble of {len(rows)} (state file {path}, directory {state.get('dir')})")
    for port, pid, word in rows:
        print(f"  {HOST}:{port}  pid {pid:<8} {word}")
    print(_masters_line([port for port, _, _ in rows]))
    return EXIT_OK if all(word == "up" for _, _, word in rows) else EXIT_FAILED


def cmd_ensemble_down(args: argparse.Namespace) -> int:
    """``ensemble down``: stop the recorded servers, remove their files."""
    path = _state_path(args)
    state = _load_state(path)
    if state is None:
        print(f"no ensemble to stop: no state file {path}")
        return EXIT_OK
    _servers(state)
    stopped = stop_detached(state)
    os.unlink(path)
    print(f"stopped {stopped} redis-server(s); removed {state.get('dir')} and {path}")
    return EXIT_OK


# -- demo -----------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    """``demo``: the guided tour."""
    colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    out = Out(colour)
    urls = _master_urls(args)
    ensemble: LocalEnsemble | None = None
    demo: Demo | None = None
    # SIGTERM unwinds like Ctrl-C, so the servers are stopped in every case.
    with _signals(_raise_interrupted, signal.SIGTERM, signal.SIGHUP):
        try:
            if urls is None:
                ensemble = LocalEnsemble(5)
                try:
                    ensemble.start()
                except RuntimeError as error:  # a server did not come up; says why
                    raise CliError(f"cannot start the local masters: {error}") from None
                urls = ensemble.urls
                out.say("demo", f"started 5 local redis-server masters: {', '.join(urls)}")
            else:
                out.say("demo", f"using your {len(urls)} masters: {', '.join(urls)}")
            demo = Demo(out, urls, ensemble, args.quick)
            demo.run()
        except (KeyboardInterrupt, _Interrupted) as interrupted:
            signum = getattr(interrupted, "signum", signal.SIGINT)
            out.muted = True
            print(f"{PROG}: demo interrupted; cleaning up", file=sys.stderr)
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
    total = demo.passed + demo.failed
    if demo.failed:
        out.say("demo", f"{demo.failed} of {total} checks FAILED")
        return EXIT_FAILED
    out.say("demo", f"all {total} checks passed")
    return EXIT_OK


# -- entry point --------------------------------------------------------------------


class _OneLineFormatter(logging.Formatter):
    """The library's warnings as single lines: a CLI prints no tracebacks."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            text += f": {type(error).__name__}: {first_line(str(error))}"
        return first_line(text)


def _setup_logging() -> None:
    logger = logging.getLogger("redreentrant")
    if not any(isinstance(h.formatter, _OneLineFormatter) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_OneLineFormatter())
        logger.addHandler(handler)
        logger.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``redreentrant`` command; return its exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        arguments, command = _split_command(arguments)
        args = build_parser().parse_args(arguments)
        args.command_argv = command
        _setup_logging()
        status: int = args.func(args)
        return status
    except SystemExit as exit_:  # --help and --version
        return exit_.code if isinstance(exit_.code, int) else EXIT_OK
    except CliError as error:
        _complain(str(error))
        return error.code
    except QuorumUnavailableError as error:
        _complain(_quorum_message(error))
        return EXIT_FAILED
    except (LockError, RedisServerNotFound) as error:
        _complain(str(error))
        return EXIT_FAILED
    except KeyboardInterrupt:
        _complain("interrupted")
        return 128 + signal.SIGINT
    except _Interrupted as interrupted:
        _complain(f"interrupted ({interrupted})")
        return 128 + interrupted.signum
    except BrokenPipeError:
        # The reader went away (e.g. '| head'): nothing more to say, and nowhere to.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - stops the flush at exit
        return EXIT_FAILED
    except OSError as error:  # e.g. a state file or directory we may not write
        _complain(str(error))
        return EXIT_FAILED


def _complain(message: str) -> None:
    print(f"{PROG}: {first_line(message)}", file=sys.stderr)
