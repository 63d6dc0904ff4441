"""A client process of the fault suite: takes a lock in a loop (or holds it once) and
records what it saw into a history file (see ``history.py``).

Run as ``python fault_worker.py SPEC_JSON``; the spec's keys are documented in
:class:`Spec`. It prints ``ready`` once its manager is open, ``held TOKEN`` when a
``hold`` worker holds the lock, and ``done`` at the end. A ``hold`` worker waits for
one line on stdin before it writes (with its token) and releases: the test freezes or
kills it in between.

Kind ``lead`` is a candidate of an election (``mgr.election``): it campaigns (with its
client name as the value), records the grant with the term as its token, writes under
the term, and resigns; as a ``hold`` worker it leads until told to go on (or killed),
and prints ``held TERM`` once it leads.
"""

from __future__ import annotations

import asyncio
import json
import select
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

import redreentrant
import redreentrant.asyncio as aio
from redreentrant import Election, FencedStore, LockError, LockTimeoutError
from redreentrant.testing.history import Recorder


@dataclass
class Spec:
    #: the masters' URLs and the resource server's URL (not a master)
    urls: list[str]
    resource: str
    #: the lock's name, and kind: "x" lock, "r"/"w" the rw lock's sides, "u" its
    #: upgradeable side (which upgrades to write, see :meth:`Client.upgrade`), "fair",
    #: "sem" a permit of a semaphore of ``permits``, "lead" the leadership of an election
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
    master_timeout: float | None = None
    timeout: float = 1.0
    #: seconds between the counter's read and its write (a non-atomic increment)
    work: float = 0.002
    extra: dict[str, Any] = field(default_factory=dict)


MODE_OF_KIND = {
    "x": "x",
    "r": "r",
    "w": "w",
    "u": "u",
    "fair": "fair",
    "sem": "sem",
    "lead": "lead",
}
#: kinds whose holds have no fencing token (the upgradeable side: its upgrades have)
SHARED = ("r", "u", "sem")


def say(line: str) -> None:
    print(line, flush=True)


class Client:
    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.rec = Recorder(spec.history, spec.client)
        options: dict[str, Any] = {"lease": spec.manager_lease, "fencing": spec.fencing}
        if spec.master_timeout is not None:
            options["master_timeout"] = spec.master_timeout
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
        return self.mgr.lock(self.spec.lock)

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
        if isinstance(lock, Election):
            token: int | None = lock.term  # always fenced: the term
        else:
            token = lock.token if self.spec.fencing and self.spec.kind not in SHARED else None
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
        self.increment(rec, lock.token if self.spec.fencing else 0, mode)

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
        rec.ok("renew", self.spec.lock, MODE_OF_KIND[self.spec.kind], valid_until=valid_until)
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
        if isinstance(lock, Election):
            token = lock.term
        else:
            token = lock.token if self.spec.fencing and self.spec.kind not in SHARED else 0
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


if __name__ == "__main__":
    Client(Spec(**json.loads(sys.argv[1]))).run()
