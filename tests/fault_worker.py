"""A client process of the fault suite: takes a lock in a loop (or holds it once) and
records what it saw into a history file (see ``history.py``).

Run as ``python fault_worker.py SPEC_JSON``; the spec's keys are documented in
:class:`Spec`. It prints ``ready`` once its manager is open, ``held TOKEN`` when a
``hold`` worker holds the lock, and ``done`` at the end. A ``hold`` worker waits for
one line on stdin before it writes (with its token) and releases: the test freezes or
kills it in between.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis
from history import Recorder

import redreentrant
import redreentrant.asyncio as aio
from redreentrant import FencedStore, LockError


@dataclass
class Spec:
    #: the masters' URLs and the resource server's URL (not a master)
    urls: list[str]
    resource: str
    #: the lock's name, and kind: "x" lock, "r"/"w" the rw lock's sides, "u" its
    #: upgradeable side (which upgrades to write, see :meth:`Client.upgrade`), "fair",
    #: "sem" a permit of a semaphore of ``permits``
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


MODE_OF_KIND = {"x": "x", "r": "r", "w": "w", "u": "u", "fair": "fair", "sem": "sem"}
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

    def lock(self) -> redreentrant.Lock:
        kind = self.spec.kind
        if kind in ("r", "w", "u"):
            rw = self.mgr.rw_lock(self.spec.lock)
            return {"r": rw.read, "w": rw.write, "u": rw.upgradeable}[kind]
        if kind == "fair":
            return self.mgr.fair_lock(self.spec.lock)
        if kind == "sem":
            return self.mgr.semaphore(self.spec.lock, self.spec.permits)
        return self.mgr.lock(self.spec.lock)

    def lost(self, lock: object) -> None:
        self.rec.ok("lost", self.spec.lock, MODE_OF_KIND[self.spec.kind])

    def acquire(self, rec: Recorder, lock: redreentrant.Lock) -> bool:
        mode = MODE_OF_KIND[self.spec.kind]
        rec.invoke("acquire", self.spec.lock, mode)
        try:
            got = lock.acquire(timeout=self.spec.timeout, lease=self.spec.lease)
        except LockError as error:
            rec.fail("acquire", self.spec.lock, mode)
            rec.ok("error", self.spec.lock, mode, owner=type(error).__name__)
            time.sleep(0.02)
            return False
        if not got:
            rec.fail("acquire", self.spec.lock, mode)
            return False
        token = lock.token if self.spec.fencing and self.spec.kind not in SHARED else None
        valid_until = time.monotonic_ns() + int(lock.remaining() * 1e9)
        owner = self.mgr.owner_id()
        rec.ok("acquire", self.spec.lock, mode, owner=owner, token=token, valid_until=valid_until)
        return True

    def release(self, rec: Recorder, lock: redreentrant.Lock) -> None:
        mode = MODE_OF_KIND[self.spec.kind]
        owner = self.mgr.owner_id()
        rec.invoke("release", self.spec.lock, mode, owner=owner)
        try:
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
        self.increment(rec, lock.token if self.spec.fencing else 0, mode)

    def increment(self, rec: Recorder, token: int, mode: str) -> None:
        value = int(self.resource.get(self.counter) or 0) + 1
        time.sleep(self.spec.work)
        self.resource.set(self.counter, value)
        rec.ok("incr", self.spec.lock, mode, value=value)
        if self.spec.fencing:
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

    def watch_validity(self, rec: Recorder, lock: redreentrant.Lock, stop: threading.Event) -> None:
        """Record each renewal the watchdog made (as a later validity end)."""
        mode = MODE_OF_KIND[self.spec.kind]
        last = 0
        while not stop.wait(0.01):
            remaining = lock.remaining()
            if remaining <= 0:
                continue
            valid_until = time.monotonic_ns() + int(remaining * 1e9)
            if valid_until > last + 20_000_000:
                if last:
                    rec.ok("renew", self.spec.lock, mode, valid_until=valid_until)
                last = valid_until

    def loop(self, rec: Recorder) -> None:
        lock = self.lock()
        end = time.monotonic() + self.spec.duration
        while time.monotonic() < end:
            if not self.acquire(rec, lock):
                continue
            stop = threading.Event()
            watcher = None
            if self.spec.lease is None:
                watcher = threading.Thread(
                    target=self.watch_validity, args=(rec, lock, stop), daemon=True
                )
                watcher.start()
            try:
                self.work(rec, lock)
            finally:
                stop.set()
                if watcher is not None:
                    watcher.join()
                self.release(rec, lock)

    def hold(self) -> None:
        lock = self.lock()
        while not self.acquire(self.rec, lock):
            pass
        stop = threading.Event()
        watcher = threading.Thread(
            target=self.watch_validity, args=(self.rec, lock, stop), daemon=True
        )
        watcher.start()
        token = lock.token if self.spec.fencing and self.spec.kind not in SHARED else 0
        say(f"held {token}")
        sys.stdin.readline()  # frozen or killed here by the test, then told to go on
        if self.spec.fencing and self.spec.kind not in SHARED:
            self.fenced_write(self.rec, token, -1)
        stop.set()
        watcher.join()
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
