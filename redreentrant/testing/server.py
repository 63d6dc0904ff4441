"""One throw-away ``redis-server`` process on ``127.0.0.1``: :class:`LocalServer`.

Started, waited for, frozen (SIGSTOP), crashed (SIGKILL), restarted on the same port,
stopped; tracked by the exit-time clean-up (:mod:`redreentrant.testing.cleanup`) and
by the reaper (:mod:`redreentrant.testing.reaper`) while it runs.

Not built on ``mirakuru``'s executors, which would replace only the spawn, a readiness
loop and SIGTERM-then-SIGKILL: readiness here is "the server on our port has *our* pid"
(a port squatter accepts connections too), with the log's tail on failure and a move to
a fresh port after a lost port race; servers start and stop together (:func:`start_all`,
:func:`stop_all`), where mirakuru's ``start()`` and ``stop()`` block on one process;
mirakuru has no ``pause``/``resume`` (its ``stop()`` of a paused process waits out its
time-out), its exit-time clean-up finds processes by an environment variable that
``redis-server`` overwrites and covers no SIGKILL'd parent, and mirakuru 3 needs
Python >= 3.11 and ``psutil``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from . import cleanup, reaper
from .binary import find_redis_server
from .loopback import HOST, free_ports, pid_on, remember_from_the_start

__all__ = ["START_TIMEOUT", "STOP_TIMEOUT", "LocalServer", "answering", "start_all", "stop_all"]

START_TIMEOUT = 10.0
"""Seconds for a fresh server to answer PING."""

STOP_TIMEOUT = 5.0
"""Seconds between SIGTERM and SIGKILL."""

_PORT_ATTEMPTS = 5  # starts tried on fresh ports when the first start loses a port race
_POLL_INTERVAL = 0.01
_LOG_TAIL_LINES = 20

_ADDRESS_IN_USE = re.compile(r"address already in use", re.IGNORECASE)


class _PortInUse(Exception):
    """The server exited because its port was taken (and it may move to another)."""


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
    :param host: the loopback address it listens on (and :attr:`url` names); another
        127.x address only inside a network namespace of one's own (see
        :mod:`redreentrant.testing.netlab`).
    :param also_bind: further loopback addresses it listens on too (at most 15).
    :param env: variables added to the server's environment (a preloaded library, see
        :mod:`redreentrant.testing.clocks`).
    :param config_file: a configuration file named first on the command line, before
        the options here (which override it); the server may rewrite it (``CONFIG
        REWRITE``; a Sentinel keeps its state there). Default: none.
    """

    def __init__(
        self,
        *,
        binary: str | None = None,
        directory: str | None = None,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        host: str = HOST,
        also_bind: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        config_file: str | None = None,
    ) -> None:
        self.binary = find_redis_server(binary)
        self.config_file = config_file
        self.host = host
        self.also_bind: tuple[str, ...] = tuple(also_bind)
        self.env: dict[str, str] = dict(env or {})
        self._owns_directory = directory is None
        self.directory = os.path.abspath(
            tempfile.mkdtemp(prefix="redreentrant-redis-") if directory is None else directory
        )
        self._port_fixed = port is not None
        self.port: int = port if port is not None else free_ports(1)[0]
        self.extra_args: tuple[str, ...] = tuple(extra_args)
        self._process: subprocess.Popen[bytes] | None = None
        self._paused = False
        self._started_once = False
        self._closed = False
        if self._owns_directory:
            # Tracked now, not at start(), so an unstarted server's temp dir is removed too.
            cleanup.track(self, self.close)
            reaper.watch_dir(self.directory, self.binary)

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

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the server and wait until it answers ``PING``; no-op if already running.

        Restarts reuse the same port. Only the first start of a server whose port was
        not given moves to a new port if the chosen one was taken.

        :raises RuntimeError: the server exited or did not answer within ``timeout``
            seconds; the message includes the tail of its log.
        """
        if self.running:
            return
        self.spawn()
        self.wait_ready(timeout)

    def spawn(self) -> None:
        """Start the process without waiting for it: the first half of :meth:`start`,
        for starting many servers at once (then :meth:`wait_ready` on each). No-op if
        already running.

        :raises RuntimeError: the server was closed.
        """
        if self._closed:
            raise RuntimeError(f"{self!r} was closed")
        if self.running:
            return
        os.makedirs(self.directory, exist_ok=True)
        cleanup.track(self, self.close)
        if self._process is not None:  # one that exited by itself: its pid is not ours
            reaper.forget_pid(self._process.pid)
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
                env={**os.environ, **self.env} if self.env else None,
            )
        # Right after the spawn: the reaper kills it if this process dies without stop().
        reaper.watch_pid(self._process.pid, self.directory, self.binary)
        self._paused = False

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until the process :meth:`spawn` started answers ``PING``: the second half
        of :meth:`start`. On the first start of a server whose port was not given, a
        port taken meanwhile moves it to a fresh one, started anew.

        :raises RuntimeError: the server was not spawned, exited, or did not answer
            within ``timeout`` seconds; the message includes the tail of its log.
        """
        attempts = _PORT_ATTEMPTS if self._may_change_port() else 1
        for attempt in range(attempts):
            try:
                self._await_answer(timeout)
                return
            except _PortInUse:
                if attempt + 1 == attempts:
                    raise RuntimeError(
                        f"redis-server could not bind {self.host}:{self.port}: address "
                        f"already in use\n{self._log_tail()}"
                    ) from None
            self.port = free_ports(1)[0]
            self.spawn()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the server gracefully: SIGTERM, then SIGKILL after ``timeout`` seconds.

        A paused server is resumed first, since a stopped process does not act on
        SIGTERM. Idempotent; the port and directory are kept for a later :meth:`start`.
        """
        self.terminate()
        self.wait_stopped(timeout)

    def terminate(self) -> None:
        """Send SIGTERM (resuming a paused server first) without waiting: the first
        half of :meth:`stop`, for stopping many servers at once (then
        :meth:`wait_stopped` on each). No-op if not running."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self._paused:
                # SIGTERM stays pending on a stopped process; let it run to act on it.
                process.send_signal(signal.SIGCONT)
                self._paused = False
            process.terminate()

    def wait_stopped(self, timeout: float = STOP_TIMEOUT) -> None:
        """Wait up to ``timeout`` seconds for the process to exit, SIGKILL it then, and
        reap it: the second half of :meth:`stop`. No-op if there is no process."""
        process = self._process
        if process is None:
            return
        try:
            process.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        self._forget_process()

    def kill(self) -> None:
        """SIGKILL the server (simulates a crash) and reap it. Idempotent."""
        self.wait_stopped(0)  # SIGKILL works on a paused process too: it cannot be deferred

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

    def restart(self, timeout: float = START_TIMEOUT) -> None:
        """:meth:`stop` then :meth:`start` on the same port; all data is gone afterwards."""
        self.stop()
        self.start(timeout)

    def close(self) -> None:
        """:meth:`stop`, and remove the directory if this server created it. Idempotent."""
        self.stop()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)
            reaper.forget_dir(self.directory)
        self._closed = True
        cleanup.untrack(self)

    def detach(self) -> dict[str, Any]:
        """Leave the process running after this process exits, and describe it:
        ``{"port": ..., "pid": ..., "dir": ...}`` (JSON-ready).

        The server is taken off the exit-time clean-up and the reaper's list (its
        directory too, if it made its own), and forgotten by this object, which can no
        longer be used. For :meth:`redreentrant.testing.LocalEnsemble.detach`.
        """
        described: dict[str, Any] = {"port": self.port, "pid": self.pid, "dir": self.directory}
        self._forget_process()  # not ours to stop any more
        cleanup.untrack(self)
        if self._owns_directory:
            reaper.forget_dir(self.directory)
        self._closed = True
        return described

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------

    def _may_change_port(self) -> bool:
        return not self._port_fixed and not self._started_once

    def _command(self) -> list[str]:
        return [
            self.binary,
            *([self.config_file] if self.config_file is not None else []),
            "--port", str(self.port),
            "--bind", self.host, *self.also_bind,
            "--protected-mode", "yes",
            "--dir", self.directory,
            "--logfile", self.logfile,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            *self.extra_args,
        ]  # fmt: skip

    def _await_answer(self, timeout: float) -> None:
        """Block until our process answers PING; raise with the log tail otherwise."""
        process = self._process
        if process is None:
            raise RuntimeError(f"cannot wait for {self!r}: not spawned")
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
            # The pid too: if someone else owns the port, a PING alone would be answered
            # by *their* server before ours fails to bind and exits. The probe's short
            # timeout: a port squatter that accepts but never answers must not stall
            # noticing that our process exited; a slow-but-live server is probed again.
            if pid_on(self.port, host=self.host) == process.pid:
                if not self._started_once:
                    self._started_once = True
                    remember_from_the_start(self.port, host=self.host)
                return
            if time.monotonic() >= deadline:
                self.kill()
                raise RuntimeError(
                    f"redis-server on {self.host}:{self.port} did not answer PING within "
                    f"{timeout:g}s\n{self._log_tail()}"
                )
            time.sleep(_POLL_INTERVAL)

    def _forget_process(self) -> None:
        if self._process is not None:
            reaper.forget_pid(self._process.pid)
        self._process = None
        self._paused = False
        if not self._owns_directory:
            # Servers with their own temp dir stay tracked until close() removes it.
            cleanup.untrack(self)

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


def start_all(servers: Sequence[LocalServer], timeout: float = START_TIMEOUT) -> None:
    """Start ``servers`` together: spawn them all, then wait for each, so that it costs
    about one server's start, not one per server."""
    for server in servers:
        server.spawn()
    for server in servers:
        server.wait_ready(timeout)  # a lost port race: that one moves and retries


def stop_all(servers: Sequence[LocalServer], timeout: float = STOP_TIMEOUT) -> None:
    """Stop ``servers`` together: SIGTERM to all, then wait for all (SIGKILL for those
    still up ``timeout`` seconds later), so that shutdowns overlap instead of queueing."""
    for server in servers:
        server.terminate()
    deadline = time.monotonic() + timeout
    for server in servers:
        server.wait_stopped(deadline - time.monotonic())


def answering(servers: Iterable[LocalServer]) -> list[LocalServer]:
    """The servers that run and are not paused (a paused one would hold every command
    until its time-out)."""
    return [server for server in servers if server.running and not server.paused]
