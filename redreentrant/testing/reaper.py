"""The reaper: a process that kills this process's servers after it dies, however it dies.

Every process started here is stopped by ``stop()``/``close()`` and, failing that, at
interpreter exit (:mod:`redreentrant.testing.cleanup`). A process killed hard (SIGKILL,
or SIGTERM without a handler) runs no exit-time hooks, so a small **reaper** process
covers that case. Started with the first server, one per process, it reads a pipe from
its parent, which tells it each server's pid and each directory to remove. When the pipe
reaches end-of-file (the parent exited, however it did), it kills the servers still
listed (SIGKILL), and on Linux also any server of that binary running in a listed
directory (one spawned just before the parent died, before its pid was sent); then it
kills every process inside each listed network namespace (a
:class:`~redreentrant.testing.NetLab`'s, whose processes are all the lab's) and deletes
the namespace, removes the directories and exits. On Linux a pid is only killed while
it still runs that binary in that server's directory (redis-server rewrites its command
line, but works in its ``--dir``), so a reused pid is never hit. A detached ensemble
(:meth:`redreentrant.testing.LocalEnsemble.detach`, ``redreentrant ensemble up``) is
taken off the list and keeps running. If the reaper itself is killed, the next server
started or stopped starts a new one with the whole list; until then, a parent killed
hard leaves its servers behind. A forked child closes its copy of the pipe and forgets
its parent's servers, so its exit neither stops them nor delays their reaper.

Hand-written (standard library only, run with ``python -I -S -c``, so that it needs
not find this package) because nothing ready-made fits: it must outlive its parent, so
it cannot be a thread, an ``atexit`` hook or a ``multiprocessing`` child (whose resource
tracker knows no processes or directories); ``mirakuru`` reaps at exit only, and finds
its processes by an environment variable that ``redis-server`` overwrites when it sets
its process title; and Linux's ``PR_SET_PDEATHSIG`` (which the CLI's children use) fires
when the *thread* that started a server ends, exists on Linux only, and removes no
directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading

__all__ = [
    "close",
    "forget_dir",
    "forget_netns",
    "forget_pid",
    "pid",
    "watch_dir",
    "watch_netns",
    "watch_pid",
]

log = logging.getLogger("redreentrant")

# The reaper: run as ``python -I -S -c _REAPER``. It reads JSON lines on stdin until
# end-of-file: ["+pid", pid, directory, binary], ["-pid", pid], ["+dir", directory,
# binary], ["-dir", directory], ["+netns", name, ip], ["-netns", name]; then kills the
# listed servers, kills every process inside each listed network namespace (but itself,
# should it run there) and deletes the namespace (``ip`` is iproute2's command), and
# removes the directories.
# On Linux a pid is only killed while it still runs ``binary`` inside ``directory``
# (redis-server changes its command line, but chdirs to its --dir), and a server of a
# listed directory whose pid never came (its parent died right after spawning it) is
# found the same way.
_REAPER = r"""
import json, os, shutil, signal, subprocess, sys, time
for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(s, signal.SIG_IGN)
lists = {"pid": {}, "dir": {}, "netns": {}}
for line in sys.stdin.buffer:
    try:
        message = json.loads(line)
        sign, listed, key = message[0][0], lists[message[0][1:]], message[1]
        if sign == "+":
            listed[key] = message[2:]
        elif sign == "-":
            listed.pop(key, None)
    except (ValueError, LookupError, TypeError):
        continue
pids, nets = lists["pid"], lists["netns"]
dirs = {top: binary for top, (binary,) in lists["dir"].items()}
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
def kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
killed = set()
for attempt in range(2):
    targets = {p for p, (top, binary) in pids.items() if server_in(p, top, binary)}
    targets |= strays()
    for pid in targets - killed:
        kill(pid)
    killed |= targets
    deadline = time.monotonic() + 5
    while any(alive(p) for p in killed) and time.monotonic() < deadline:
        time.sleep(0.02)
    if not dirs:
        break
    time.sleep(0.1)  # a server spawned as the parent died may be exec'ing only now
def ip_netns(ip, *args):
    try:
        return subprocess.run([ip, "netns", *args], capture_output=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return b""
def inside(name, ip):
    return {int(p) for p in ip_netns(ip, "pids", name).split()} - {os.getpid()}
for name, (ip,) in nets.items():
    deadline = time.monotonic() + 5
    while inside(name, ip) and time.monotonic() < deadline:
        for pid in inside(name, ip):
            kill(pid)
        time.sleep(0.02)
    ip_netns(ip, "del", name)
for top in dirs:
    shutil.rmtree(top, ignore_errors=True)
"""


class _Reaper:
    """This process's end of the reaper: what is listed, and the pipe to the reaper
    process, started on first use."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        # What is listed, by kind ("dir", "pid", "netns"): key -> the message's values.
        self._lists: dict[str, dict[object, tuple[object, ...]]] = {
            "dir": {},
            "pid": {},
            "netns": {},
        }
        self._fd: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._warned = False

    def watch(self, kind: str, key: object, *values: object) -> None:
        """List ``key`` (a pid, a directory, a namespace's name) of ``kind``."""
        with self._lock:
            self._lists[kind][key] = values
            self._send([f"+{kind}", key, *values])

    def forget(self, kind: str, key: object) -> None:
        with self._lock:
            if self._lists[kind].pop(key, None) is not None:
                self._send([f"-{kind}", key])

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
        lines = [
            [f"+{kind}", key, *values]
            for kind, listed in self._lists.items()
            for key, values in listed.items()
        ]
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

    def pid(self) -> int | None:
        with self._lock:
            return self._process.pid if self._process is not None else None

    def after_fork_in_child(self) -> None:
        # The parent's pipe and list are the parent's: a child that starts servers gets
        # a reaper of its own, and the parent's reaper is not kept waiting by this copy.
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._reset()


_reaper = _Reaper()
os.register_at_fork(after_in_child=_reaper.after_fork_in_child)


def watch_pid(pid: int, directory: str, binary: str) -> None:
    """Kill ``pid``, the ``binary`` server working in ``directory``, if this process dies."""
    _reaper.watch("pid", pid, directory, binary)


def forget_pid(pid: int) -> None:
    """Take ``pid`` off the list (it was stopped, or detached)."""
    _reaper.forget("pid", pid)


def watch_dir(directory: str, binary: str) -> None:
    """Remove ``directory`` if this process dies, after killing the ``binary`` servers
    working inside it."""
    _reaper.watch("dir", directory, binary)


def forget_dir(directory: str) -> None:
    """Take ``directory`` off the list (it was removed, or detached)."""
    _reaper.forget("dir", directory)


def watch_netns(name: str, ip: str) -> None:
    """Kill every process inside the network namespace ``name`` and delete it (with
    ``ip``, the path of iproute2's command) if this process dies. Call it from a thread
    outside the namespace: a reaper it starts runs where that thread is."""
    _reaper.watch("netns", name, ip)


def forget_netns(name: str) -> None:
    """Take the network namespace ``name`` off the list (it was deleted)."""
    _reaper.forget("netns", name)


def close() -> None:
    """At exit, after the clean-up: the reaper finds nothing left to do, and ends."""
    _reaper.close()


def pid() -> int | None:
    """The pid of this process's reaper, or None while none runs (nothing was listed
    yet, or it could not be started)."""
    return _reaper.pid()
