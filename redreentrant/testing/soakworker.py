"""One client process of the soak (:mod:`redreentrant.testing.soak`).

Run by the soak inside its network lab, as ``python -m redreentrant.testing.soakworker
SPEC_JSON`` (the keys of :class:`Spec`). It opens a manager on its own client path
(fencing on), prints ``ready``, and contends in a loop until its stdin closes (the
soak's signal to stop, also when the soak dies): each turn it draws a kind of lock
(:data:`KINDS`) and a name, takes it, works under it, holds it a while and releases
it, recording everything with a :class:`~redreentrant.testing.history.Recorder`. Then
it prints ``done`` and exits. Its draws come from its spec's seed.

What it records (see :mod:`redreentrant.testing.history`):

- as client ``<client>/<kind>``, so that the figures can count the holds by kind;
- every hold under an owner of its own (a fresh ``owner=`` object): owner ids are never
  reused, so a loss report matches exactly one hold;
- an acquire's invoke, then its ok (owner, token, ``valid_until``) or its fail (the
  exception's class name in ``error``); a multi-lock as ``x`` holds of each of its
  two names, with each name's token (it excludes the plain lock of each);
- ``renew`` when the validity it sees moves later while it holds (it looks every
  20 ms of its hold);
- the work of an exclusive hold, per name: an ``incr`` of a counter on the resource
  (read, sleep, write: a lost update if two holders overlap), and a ``write`` of the
  value to a :class:`~redreentrant.FencedStore` with its token; a hold that lasted is
  written again at its end, unless it was told lost;
- a release's invoke and ok, or fail with ``error``;
- ``lost`` (owner, token) when ``on_lost`` reports a hold: the manager's listener says
  whose hold it is, just before ``on_lost`` runs in the same thread.
"""

from __future__ import annotations

import faulthandler
import json
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis

from redreentrant import (
    Election,
    FencedStore,
    Lock,
    LockError,
    LockInfo,
    LockListener,
    LockManager,
    MultiLock,
)

from .history import Recorder, family

#: the kinds a worker draws from: the plain lock, the read/write lock's two sides, the
#: fair lock, a permit of a semaphore, a multi-lock of two names, an election's leadership
KINDS = ("x", "r", "w", "fair", "sem", "multi", "lead")
#: the history mode each kind is recorded in
MODE = {kind: "x" if kind == "multi" else kind for kind in KINDS}
#: the names each family contends for; a name is one lock per family, and each family
#: has names of its own so that counters and fenced resources are never shared across
#: families (the plain lock and the multi-lock share theirs: they exclude each other)
NAMES: dict[str, tuple[str, ...]] = {
    "x": ("x0", "x1"),
    "rw": ("rw0", "rw1"),
    "fair": ("fair0", "fair1"),
    "sem": ("sem0",),
    "lead": ("lead0",),
}
#: the family of names each kind takes (its mode's lock family)
FAMILY = {kind: family(mode) for kind, mode in MODE.items()}
#: the semaphore's permits
PERMITS = 2
#: the kinds whose holds work on the resource (exclusive ones: they have a token)
EXCLUSIVE = frozenset({"x", "w", "fair", "multi", "lead"})
#: how often a holder looks at its validity (a renewal to record, or a loss)
LOOK = 0.02


def counter_key(name: str) -> str:
    """The resource's key of the counter of ``name``."""
    return f"{{{name}}}:counter"


def fenced_key(name: str) -> str:
    """The resource's key of the fenced value of ``name``."""
    return f"{{{name}}}:fenced"


@dataclass
class Spec:
    #: the masters' URLs on this worker's path, and the resource's URL (never faulted)
    urls: list[str]
    resource: str
    #: this worker's name (``p<index>``), history file and seed
    client: str
    history: str
    seed: int
    #: the manager's lease, and an acquire's time-out
    lease: float = 1.5
    timeout: float = 1.5


@dataclass
class _Held:
    """What was recorded of one hold: its recorder, owner and parts (name, mode, token)."""

    rec: Recorder
    owner: str
    parts: list[tuple[str, str, int | None]]


class _Owner:
    """The owner of one hold (``owner=``): weakly referable; kept for the worker's life.

    Kept, not dropped after its release: an owner object freed by the cyclic garbage
    collector (a caught exception's traceback keeps the frame that made it in a cycle)
    has its end told from inside the collection, at any allocation of any thread, and
    the manager takes its holds' lock then; inside a section that holds that lock the
    thread deadlocks (seen in this soak: the watchdog's ``Holds.take_dead``)."""


class _Told(LockListener):
    """Learns whose hold an event is about, in the thread the event happens in: the
    owner of the acquire just granted (the acquiring thread), and the owner of the hold
    lost just before ``on_lost`` is called (the report's thread)."""

    def __init__(self) -> None:
        self.local = threading.local()

    def acquired(
        self, lock: LockInfo, wait: float, votes: int, masters: int, token: int | None
    ) -> None:
        self.local.acquired = lock.owner

    def lost(self, lock: LockInfo, reason: str) -> None:
        self.local.lost = lock.owner

    def take(self, what: str) -> str | None:
        """The owner last noted for ``what`` in this thread (then forgotten)."""
        owner: str | None = getattr(self.local, what, None)
        setattr(self.local, what, None)
        return owner


class Worker:
    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.rec = Recorder(spec.history, spec.client)
        self.recs = {kind: self.rec.child(kind) for kind in KINDS}
        self.told = _Told()
        self.guard = threading.Lock()
        #: every hold recorded, by owner id (a loss may be reported after the release)
        self.held: dict[str, _Held] = {}
        self.stop = threading.Event()
        self.mgr = LockManager(
            spec.urls, lease=spec.lease, fencing=True, on_lost=self.on_lost, listener=self.told
        )
        self.resource = redis.Redis.from_url(spec.resource, socket_timeout=10)
        self.stores: dict[str, FencedStore] = {}
        self.owners: list[_Owner] = []
        self.turns = 0

    # -- one turn ------------------------------------------------------------------------

    def make(self, kind: str, holder: object) -> tuple[Lock, list[tuple[str, str]]]:
        """A lock of ``kind`` owned by ``holder``, and its parts (name, mode)."""
        names = NAMES[FAMILY[kind]]
        mode = MODE[kind]
        if kind == "multi":
            return self.mgr.multi_lock(names[:2], owner=holder), [(n, mode) for n in names[:2]]
        name = self.rng.choice(names)
        lock: Lock
        if kind in ("r", "w"):
            rw = self.mgr.rw_lock(name, owner=holder)
            lock = rw.read if kind == "r" else rw.write
        elif kind == "fair":
            lock = self.mgr.fair_lock(name, owner=holder)
        elif kind == "sem":
            lock = self.mgr.semaphore(name, PERMITS, owner=holder)
        elif kind == "lead":
            lock = self.mgr.election(name, owner=holder)
        else:
            lock = self.mgr.lock(name, owner=holder)
        return lock, [(name, mode)]

    def hold_time(self) -> float:
        """Mostly tens of ms, sometimes a few hundred; now and then past a lease (the
        watchdog renews it, or reports it lost)."""
        draw = self.rng.random()
        if draw < 0.80:
            return self.rng.uniform(0.01, 0.08)
        if draw < 0.96:
            return self.rng.uniform(0.1, 0.5)
        return self.rng.uniform(self.spec.lease, 2.5 * self.spec.lease)

    def turn(self) -> None:
        kind = self.rng.choice(KINDS)
        rec = self.recs[kind]
        holder = _Owner()
        self.owners.append(holder)  # never collected: see _Owner
        lock, parts = self.make(kind, holder)
        seconds = self.hold_time()
        work = self.rng.uniform(0.001, 0.005)
        for name, mode in parts:
            rec.invoke("acquire", name, mode)
        self.told.take("acquired")
        try:
            if isinstance(lock, Election):
                lock.campaign(self.spec.client, timeout=self.spec.timeout)
                got = True
            else:
                got = lock.acquire(timeout=self.spec.timeout)
        except LockError as error:
            for name, mode in parts:
                rec.fail("acquire", name, mode, error=type(error).__name__)
            time.sleep(self.rng.uniform(0.01, 0.1))  # masters unreachable: not a busy loop
            return
        if not got:
            for name, mode in parts:
                rec.fail("acquire", name, mode)
            return
        valid_until = int(lock.valid_until * 1e9)
        owner = self.told.take("acquired") or f"{self.spec.client}:unknown:{self.turns}"
        tokens = self.tokens(kind, lock, parts)
        held = _Held(rec, owner, [(n, m, tokens[n]) for n, m in parts])
        with self.guard:
            self.held[owner] = held
        for name, mode in parts:
            rec.ok("acquire", name, mode, owner=owner, token=tokens[name], valid_until=valid_until)
        try:
            lost = lock.lost
            if kind in EXCLUSIVE:
                self.work(held, work)
            end = time.monotonic() + seconds
            while not lost.is_set() and time.monotonic() < end:
                time.sleep(min(LOOK, max(0.0, end - time.monotonic())))
                valid_until = self.note_renewal(held, lock, valid_until)
            if kind in EXCLUSIVE and seconds > LOOK and not lost.is_set():
                self.write(held)  # the hold's last write, under the same token
            valid_until = self.note_renewal(held, lock, valid_until)
        finally:
            self.release(held, lock)

    def tokens(self, kind: str, lock: Lock, parts: list[tuple[str, str]]) -> dict[str, int | None]:
        """Each part's fencing token (None for the shared kinds)."""
        if kind not in EXCLUSIVE:
            return {name: None for name, _ in parts}
        if isinstance(lock, MultiLock):
            tokens = lock.tokens
            return {name: tokens[name] for name, _ in parts}
        return {name: lock.token for name, _ in parts}

    def work(self, held: _Held, pause: float) -> None:
        """A non-atomic increment of each part's counter, then a fenced write of it."""
        for name, mode, _ in held.parts:
            value = int(self.resource.get(counter_key(name)) or 0) + 1
            time.sleep(pause)
            self.resource.set(counter_key(name), value)
            held.rec.ok("incr", name, mode, value=value)
        self.write(held)

    def write(self, held: _Held) -> None:
        for name, mode, token in held.parts:
            assert token is not None
            store = self.stores.get(name)
            if store is None:
                store = self.stores[name] = FencedStore(self.resource, fenced_key(name))
            held.rec.invoke("write", name, mode, token=token)
            accepted = store.write(token, f"{held.owner} {token}")
            held.rec.ok("write", name, mode, token=token, accepted=accepted)

    def note_renewal(self, held: _Held, lock: Lock, known: int) -> int:
        """Record a validity end later than ``known`` (a renewal); the one known now."""
        now_valid = int(lock.valid_until * 1e9)
        if now_valid <= known + 1_000_000:
            return known
        for name, mode, _ in held.parts:
            held.rec.ok("renew", name, mode, owner=held.owner, valid_until=now_valid)
        return now_valid

    def release(self, held: _Held, lock: Lock) -> None:
        rec = held.rec
        for name, mode, _ in held.parts:
            rec.invoke("release", name, mode, owner=held.owner)
        try:
            if isinstance(lock, Election):
                lock.resign()
            else:
                lock.release()
        except LockError as error:
            for name, mode, _ in held.parts:
                rec.fail("release", name, mode, owner=held.owner, error=type(error).__name__)
        else:
            for name, mode, _ in held.parts:
                rec.ok("release", name, mode, owner=held.owner)

    def on_lost(self, lock: Any) -> None:
        """``on_lost``: record the loss of the hold the listener named just before."""
        owner = self.told.take("lost")
        with self.guard:
            held = self.held.get(owner) if owner is not None else None
        if held is None:
            name = str(getattr(lock, "name", "?"))
            print(f"a loss of {name!r} by an unknown owner {owner}", file=sys.stderr, flush=True)
            self.rec.ok("lost", name, owner=owner)
            return
        for name, mode, token in held.parts:
            held.rec.ok("lost", name, mode, owner=held.owner, token=token)

    # -- the process ---------------------------------------------------------------------

    def run(self) -> None:
        # A worker that does not stop is asked for its threads' stacks before it is killed.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        threading.Thread(target=self._watch_stdin, daemon=True).start()
        print("ready", flush=True)
        while not self.stop.is_set():
            self.turns += 1
            self.turn()
        time.sleep(0.5)  # a loss reported by now is recorded before the manager closes
        self.mgr.close()
        self.resource.close()
        self.rec.close()
        print("done", flush=True)

    def _watch_stdin(self) -> None:
        for _ in sys.stdin:
            pass
        self.stop.set()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m redreentrant.testing.soakworker SPEC_JSON", file=sys.stderr)
        return 2
    Worker(Spec(**json.loads(args[0]))).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
