"""A client process of the fault suite: takes a lock in a loop (or holds it once) and
records what it saw into a history file (see ``history.py``).

Run as ``python fault_worker.py SPEC_JSON``; the spec's keys are documented in
:class:`Spec`. It prints ``ready`` once its manager is open, ``held TOKEN`` when a
``hold`` worker holds the lock, and ``done`` at the end. A ``hold`` worker waits for
one line on stdin before it writes (with its token) and releases: the test freezes or
kills it in between. A ``gate`` worker prints ``gated`` once its manager is made, and
waits for one line on stdin before it runs a round: the test starts it with the
others, and lets it begin when it should (e.g. a client that never saw the masters
before a fault).

Run as ``python fault_worker.py --fork-server FD``, it is a fork server: loaded once,
it forks a worker for each request on the Unix socket ``FD`` (see :func:`fork_server`
and ``faultkit.ForkServer``).

Kind ``multi`` is a multi-lock (``mgr.multi_lock``) of the names ``LOCK`` and
``LOCK:2``, recorded as mode ``x`` of ``LOCK`` with the token of ``LOCK``: a multi-lock
excludes the plain lock of each of its names, so the checker judges workers of kinds
``x`` and ``multi`` of one name together.

Kind ``lead`` is a candidate of an election (``mgr.election``): it campaigns (with its
client name as the value), records the grant with the term as its token, writes under
the term, and resigns; as a ``hold`` worker it leads until told to go on (or killed),
and prints ``held TERM`` once it leads.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import redis

import redreentrant
from redreentrant import (
    Election,
    FencedStore,
    LockError,
    LockListener,
    LockTimeoutError,
    MultiLock,
)
from redreentrant.cli._process import die_with_parent
from redreentrant.testing.history import Recorder


@dataclass
class Spec:
    #: the masters' URLs and the resource server's URL (not a master)
    urls: list[str]
    resource: str
    #: the lock's name, and kind: "x" lock, "r"/"w" the rw lock's sides, "u" its
    #: upgradeable side (which upgrades to write, see :meth:`Client.upgrade`), "fair",
    #: "sem" a permit of a semaphore of ``permits``, "lead" the leadership of an
    #: election, "multi" a multi-lock of ``lock`` and ``lock + ":2"`` (module docstring)
    lock: str
    kind: str = "x"
    permits: int = 2
    #: "loop" (acquire, work, release, until ``duration`` passed), "hold" (once, see
    #: the module docstring), "thread-dies" / "task-dies" (an owner that ends holding)
    mode: str = "loop"
    client: str = "p"
    history: str = ""
    duration: float = 2.0
    threads: int = 1
    fencing: bool = True
    #: None: the watchdog-managed lease; else a fixed lease per acquire
    lease: float | None = None
    manager_lease: float = 3.0
    #: the manager's quarantine (None: its default, the longest lease it hands out)
    quarantine: float | None = None
    #: the manager's durability (see ``LockManager``)
    durability: str | None = None
    master_timeout: float | None = None
    timeout: float = 1.0
    #: seconds between the counter's read and its write (a non-atomic increment)
    work: float = 0.002
    #: wait for a line on stdin before the first round (see the module docstring)
    gate: bool = False
    #: record each master whose clock the manager saw step (``LockListener``'s
    #: ``clock_stepped``) as a ``clock-step`` event: ``owner`` the master, ``value``
    #: the step in ms (the checker ignores them)
    clock_steps: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


MODE_OF_KIND = {
    "x": "x",
    "r": "r",
    "w": "w",
    "u": "u",
    "fair": "fair",
    "sem": "sem",
    "lead": "lead",
    "multi": "x",
}
#: kinds whose holds have no fencing token (the upgradeable side: its upgrades have)
SHARED = ("r", "u", "sem")


def say(line: str) -> None:
    print(line, flush=True)


class ClockSteps(LockListener):
    """Records the clock steps a manager saw (``Spec.clock_steps``)."""

    def __init__(self, rec: Recorder, lock: str, mode: str) -> None:
        self.rec, self.lock, self.mode = rec, lock, mode

    def clock_stepped(self, master: str, seconds: float, counted_out: float) -> None:
        self.rec.ok("clock-step", self.lock, self.mode, owner=master, value=round(seconds * 1000))


class Client:
    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.rec = Recorder(spec.history, spec.client)
        options: dict[str, Any] = {"lease": spec.manager_lease, "fencing": spec.fencing}
        if spec.master_timeout is not None:
            options["master_timeout"] = spec.master_timeout
        if spec.quarantine is not None:
            options["quarantine"] = spec.quarantine
        if spec.durability is not None:
            options["durability"] = spec.durability
        if spec.clock_steps:
            options["listener"] = ClockSteps(self.rec, spec.lock, MODE_OF_KIND[spec.kind])
        self.mgr = redreentrant.LockManager(spec.urls, on_lost=self.lost, **options)
        self.resource = redis.Redis.from_url(spec.resource)
        self.store = FencedStore(self.resource, f"{{{spec.lock}}}:fenced")
        self.counter = f"{{{spec.lock}}}:counter"
        #: the owner and term of this process's leadership, for a loss report (the
        #: ``on_lost`` hook is not told the owner): an election's hold worker leads once
        self.leading: tuple[str, int] | None = None

    def lock(self) -> redreentrant.Lock:
        kind = self.spec.kind
        if kind in ("r", "w", "u"):
            rw = self.mgr.rw_lock(self.spec.lock)
            return {"r": rw.read, "w": rw.write, "u": rw.upgradeable}[kind]
        if kind == "fair":
            return self.mgr.fair_lock(self.spec.lock)
        if kind == "sem":
            return self.mgr.semaphore(self.spec.lock, self.spec.permits)
        if kind == "lead":
            return self.mgr.election(self.spec.lock)
        if kind == "multi":
            return self.mgr.multi_lock([self.spec.lock, f"{self.spec.lock}:2"])
        return self.mgr.lock(self.spec.lock)

    def token_of(self, lock: redreentrant.Lock) -> int | None:
        """The calling owner's fencing token (an election's term), or None without one
        (fencing off, or a kind whose holders share the lock)."""
        if isinstance(lock, Election):
            return lock.term  # always fenced: the term
        if not self.spec.fencing or self.spec.kind in SHARED:
            return None
        if isinstance(lock, MultiLock):
            return lock.tokens[self.spec.lock]
        return lock.token

    def lost(self, lock: object) -> None:
        mode = MODE_OF_KIND[self.spec.kind]
        leading = self.leading
        if leading is None:
            self.rec.ok("lost", self.spec.lock, mode)
        else:  # the leader told its leadership is lost: it leads no more (history.py)
            self.rec.ok("lost", self.spec.lock, mode, owner=leading[0], token=leading[1])

    def grant(self, lock: redreentrant.Lock) -> bool:
        """Acquire, or campaign (an election, with the client's name as the value):
        False when the time-out passed first."""
        if isinstance(lock, Election):
            try:
                lock.campaign(self.spec.client, timeout=self.spec.timeout)
            except LockTimeoutError:
                return False
            return True
        return lock.acquire(timeout=self.spec.timeout, lease=self.spec.lease)

    def acquire(self, rec: Recorder, lock: redreentrant.Lock) -> int | None:
        """Acquire (recorded); the validity end it reported (monotonic ns), or None."""
        mode = MODE_OF_KIND[self.spec.kind]
        rec.invoke("acquire", self.spec.lock, mode)
        try:
            got = self.grant(lock)
        except LockError as error:
            rec.fail("acquire", self.spec.lock, mode)
            rec.ok("error", self.spec.lock, mode, owner=type(error).__name__)
            time.sleep(0.02)
            return None
        if not got:
            rec.fail("acquire", self.spec.lock, mode)
            return None
        token = self.token_of(lock)
        valid_until = time.monotonic_ns() + int(lock.remaining() * 1e9)
        owner = self.mgr.owner_id()
        if isinstance(lock, Election):
            assert token is not None
            self.leading = (owner, token)
        rec.ok("acquire", self.spec.lock, mode, owner=owner, token=token, valid_until=valid_until)
        return valid_until

    def release(self, rec: Recorder, lock: redreentrant.Lock) -> None:
        mode = MODE_OF_KIND[self.spec.kind]
        owner = self.mgr.owner_id()
        rec.invoke("release", self.spec.lock, mode, owner=owner)
        try:
            if isinstance(lock, Election):
                lock.resign()
            else:
                lock.release()
        except LockError:
            rec.fail("release", self.spec.lock, mode, owner=owner)
        else:
            rec.ok("release", self.spec.lock, mode, owner=owner)

    def work(self, rec: Recorder, lock: redreentrant.Lock) -> None:
        """The critical section: a non-atomic increment, then a fenced write."""
        mode = MODE_OF_KIND[self.spec.kind]
        if self.spec.kind == "sem":
            time.sleep(self.spec.work)  # the holds themselves are what the checker counts
            return
        if self.spec.kind in ("r", "u"):
            before = int(self.resource.get(self.counter) or 0)
            time.sleep(self.spec.work)
            after = int(self.resource.get(self.counter) or 0)
            rec.ok("read", self.spec.lock, mode, value=after - before)
            if self.spec.kind == "u":
                self.upgrade(rec, lock)
            return
        if isinstance(lock, Election):  # the leader's work, fenced by its term
            self.increment(rec, lock.term, mode, fenced=True)
            return
        self.increment(rec, self.token_of(lock) or 0, mode)

    def increment(self, rec: Recorder, token: int, mode: str, fenced: bool = False) -> None:
        value = int(self.resource.get(self.counter) or 0) + 1
        time.sleep(self.spec.work)
        self.resource.set(self.counter, value)
        rec.ok("incr", self.spec.lock, mode, value=value)
        if self.spec.fencing or fenced:
            self.fenced_write(rec, token, value)

    def upgrade(self, rec: Recorder, lock: Any) -> None:
        """The upgradeable holder becomes the writer (recorded as an acquire of "w"),
        increments, and goes back (a release of "w")."""
        owner = self.mgr.owner_id()
        write = self.mgr.rw_lock(self.spec.lock).write
        rec.invoke("acquire", self.spec.lock, "w", owner=owner)
        try:
            upgraded = lock.upgrade(timeout=self.spec.timeout)
        except LockError:
            upgraded = False
        if not upgraded:
            rec.fail("acquire", self.spec.lock, "w", owner=owner)
            return
        token = write.token if self.spec.fencing else None
        valid_until = time.monotonic_ns() + int(write.remaining() * 1e9)
        rec.ok("acquire", self.spec.lock, "w", owner=owner, token=token, valid_until=valid_until)
        self.increment(rec, write.token if self.spec.fencing else 0, "w")
        rec.invoke("release", self.spec.lock, "w", owner=owner)
        try:
            lock.downgrade()
        except LockError:
            rec.fail("release", self.spec.lock, "w", owner=owner)
        else:
            rec.ok("release", self.spec.lock, "w", owner=owner)

    def fenced_write(self, rec: Recorder, token: int, value: int) -> None:
        mode = MODE_OF_KIND[self.spec.kind]
        rec.invoke("write", self.spec.lock, mode, token=token)
        accepted = self.store.write(token, value)
        rec.ok("write", self.spec.lock, mode, token=token, accepted=accepted)

    def note_validity(self, rec: Recorder, lock: redreentrant.Lock, last: int) -> int:
        """Record a renewal the watchdog made (a validity end later than ``last``, the
        one known); returns the validity end known now. Called by the owner's own
        thread: ``remaining()`` is the calling owner's (another thread sees 0)."""
        remaining = lock.remaining()
        if remaining <= 0:
            return last
        valid_until = time.monotonic_ns() + int(remaining * 1e9)
        if valid_until <= last + 20_000_000:
            return last
        # Under the owner the acquire was recorded with: the checker extends that hold.
        owner = self.mgr.owner_id()
        mode = MODE_OF_KIND[self.spec.kind]
        rec.ok("renew", self.spec.lock, mode, owner=owner, valid_until=valid_until)
        return valid_until

    def loop(self, rec: Recorder) -> None:
        lock = self.lock()
        end = time.monotonic() + self.spec.duration
        while time.monotonic() < end:
            valid_until = self.acquire(rec, lock)
            if valid_until is None:
                continue
            try:
                self.work(rec, lock)
                if self.spec.lease is None:
                    self.note_validity(rec, lock, valid_until)
            finally:
                self.release(rec, lock)
                self.leading = None

    def hold(self) -> None:
        lock = self.lock()
        valid_until = None
        while valid_until is None:
            valid_until = self.acquire(self.rec, lock)
        token = self.token_of(lock) or 0
        say(f"held {token}")
        # Frozen or killed here by the test, then told to go on; meanwhile the renewals
        # are recorded, from this thread (the owner's).
        while not select.select([sys.stdin], [], [], 0.01)[0]:
            valid_until = self.note_validity(self.rec, lock, valid_until)
        sys.stdin.readline()
        if isinstance(lock, Election) or (self.spec.fencing and self.spec.kind not in SHARED):
            self.fenced_write(self.rec, token, -1)
        self.release(self.rec, lock)

    def thread_dies(self) -> None:
        """A thread takes the lock and ends without releasing it."""

        def body() -> None:
            if self.acquire(self.rec, self.lock()):
                say("held")

        t = threading.Thread(target=body)
        t.start()
        t.join()
        sys.stdin.readline()

    def task_dies(self) -> None:
        """An asyncio task takes the lock and ends without releasing it."""
        import redreentrant.asyncio as aio  # only here: the other workers start faster

        async def main() -> None:
            async with aio.LockManager(
                self.spec.urls, lease=self.spec.manager_lease, on_lost=self.lost
            ) as mgr:
                lock = mgr.lock(self.spec.lock)

                async def body() -> None:
                    self.rec.invoke("acquire", self.spec.lock)
                    await lock.acquire()
                    valid_until = time.monotonic_ns() + int(lock.remaining() * 1e9)
                    owner = mgr.owner_id()
                    self.rec.ok("acquire", self.spec.lock, owner=owner, valid_until=valid_until)

                await asyncio.create_task(body())
                say("held")
                await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

        asyncio.run(main())

    def run(self) -> None:
        if self.spec.gate:  # its manager made, and no round run yet
            say("gated")
            sys.stdin.readline()
        say("ready")
        mode = self.spec.mode
        if mode == "hold":
            self.hold()
        elif mode == "thread-dies":
            self.thread_dies()
        elif mode == "task-dies":
            self.task_dies()
        else:
            threads = [
                threading.Thread(target=self.loop, args=(self.rec.child(f"t{i}"),))
                for i in range(self.spec.threads)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        self.mgr.close()
        self.resource.close()
        self.rec.close()
        say("done")


def main(spec: Spec) -> None:
    Client(spec).run()


# -- the fork server ----------------------------------------------------------------------

_CLONE_NEWNET = 0x40000000  # <sched.h>


def enter_netns(name: str) -> None:
    """Move this (single-threaded) process into the network namespace ``name``."""
    setns = ctypes.CDLL(None, use_errno=True).setns
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if setns(fd, _CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns: {os.strerror(error)}")
    finally:
        os.close(fd)


def fork_server(fd: int) -> None:
    """Serve requests for workers on the Unix socket ``fd`` (``SOCK_SEQPACKET``): each
    is a JSON message ``{"spec": SPEC_JSON, "netns": NAME or null}`` with two file
    descriptors, the worker's stdin and stdout. This process forks a worker for it (in
    that network namespace, when named) and answers its pid. A fork costs a few ms,
    where a new interpreter costs most of a second of CPU (the imports). The server
    never starts a thread, so forking it is safe; it ends when the socket closes, and
    its workers die with it (they die with the test otherwise, as it does)."""
    server = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped as they end
    with_parent = die_with_parent()
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(server, 1 << 16, 2)
        except OSError:
            return
        if not message:
            return
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                server.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                if with_parent is not None:
                    with_parent()
                if request["netns"]:
                    enter_netns(request["netns"])
                os.dup2(fds[0], 0)
                os.dup2(fds[1], 1)
                for f in fds:
                    os.close(f)
                sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
                sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
                main(Spec(**json.loads(request["spec"])))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        for f in fds:
            os.close(f)
        server.send(str(pid).encode())


if __name__ == "__main__":
    if sys.argv[1] == "--fork-server":
        fork_server(int(sys.argv[2]))
    else:
        main(Spec(**json.loads(sys.argv[1])))
