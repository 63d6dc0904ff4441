"""Failover: leader election on 1 and 5 masters, lease 1 s, with the leader, a standby
queued behind it and an observer each in a spawned process of its own: the time from a
leader's end to the next leader's ``campaign()`` returning, in seconds and as a
fraction of the lease, and when the observer's ``observe()`` reported the next leader
(``time.monotonic()``, shared by the processes of the host).

*Killed*: the parent SIGKILLs the leader at a random point of its renewal cycle; the
standby leads once the hold runs out (no message), so 2/3 to 1 lease; *past expiry* is
how long after the hold ran out on a quorum (the masters' PTTLs, read after the kill).
*Resigned*: from the leader's ``resign()`` call: a wake-up and a campaign. Per round
and number of masters, 3 kills and 5 resignations, interleaved (``--quick``: 1 each).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import redis
from benchcommon import RR, Context, Row, ensure_repo_importable, fail_text, log, masters_label

FAILOVER_LEASE_S = 1.0  # the candidates' and the observer's lease
FAILOVER_KILLS = 3  # leaders killed per round and number of masters (--quick: 1)
FAILOVER_RESIGNS = 5  # leaders that resign per round and number of masters (--quick: 1)
FAILOVER_WAIT_S = 15.0  # for a process's answer (the first includes the imports)
KILLED = "killed (SIGKILL)"
RESIGNED = "resigned"


def failover_candidate(urls: list[str], name: str, lease: float, conn: Connection) -> None:
    """A candidate of election ``name``, in a process of its own. Commands from the
    parent: "campaign" (answers "campaigning", then "leading" with the
    ``time.monotonic()`` at which ``campaign()`` returned and the term), "resign"
    (answers "resigned" with the instant ``resign()`` was called), "exit" (resigns if
    it leads, then ends). The parent kills it (SIGKILL) to make a leader die."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us; Ctrl-C is its
    ensure_repo_importable()
    from redreentrant import LockManager

    try:
        with LockManager(urls, lease=lease) as mgr:
            election = mgr.election(name)
            election.leader()  # connections open before anything is timed
            conn.send(("ready",))
            while (command := conn.recv()) != "exit":
                if command == "campaign":
                    conn.send(("campaigning",))
                    election.campaign(value=str(os.getpid()))
                    conn.send(("leading", time.monotonic(), election.term))
                elif command == "resign":
                    t_resign = time.monotonic()
                    election.resign()
                    conn.send(("resigned", t_resign))
            if election.is_owned():
                election.resign()
    except Exception as exc:
        with contextlib.suppress(Exception):
            conn.send(("error", fail_text(exc)))


def failover_observer(urls: list[str], name: str, lease: float, conn: Connection) -> None:
    """An observer of election ``name``, in a process of its own: reports each change
    ``observe()`` yields ("seen", ``time.monotonic()``, the term or None) until the
    parent kills it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ensure_repo_importable()
    from redreentrant import LockManager

    try:
        with LockManager(urls, lease=lease) as mgr:
            changes = mgr.election(name).observe()
            next(changes)
            conn.send(("observing",))
            for view in changes:
                conn.send(("seen", time.monotonic(), None if view is None else view.term))
    except Exception as exc:
        with contextlib.suppress(Exception):
            conn.send(("error", fail_text(exc)))


class Child:
    """A spawned process running ``target(urls, name, lease, conn)``, and its end of
    the pipe."""

    def __init__(
        self, mp: Any, target: Callable[..., None], urls: Sequence[str], name: str, lease: float
    ) -> None:
        self.conn, theirs = mp.Pipe()
        self.process = mp.Process(
            target=target, args=(list(urls), name, lease, theirs), daemon=True, name=target.__name__
        )
        self.process.start()
        theirs.close()

    def send(self, command: str) -> None:
        self.conn.send(command)

    def expect(
        self,
        kind: str,
        match: Callable[[tuple[Any, ...]], bool] = lambda msg: True,
        timeout: float = FAILOVER_WAIT_S,
    ) -> tuple[Any, ...]:
        """The next message of ``kind`` that ``match``es (others are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                if left <= 0 or not self.conn.poll(left):
                    raise RuntimeError(f"{self.process.name}: no {kind!r} within {timeout:g}s")
                msg: tuple[Any, ...] = self.conn.recv()
            except EOFError:
                raise RuntimeError(f"{self.process.name}: ended, expecting {kind!r}") from None
            if msg[0] == "error":
                raise RuntimeError(f"{self.process.name}: {msg[1]}")
            if msg[0] == kind and match(msg):
                return msg

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5.0)
        self.conn.close()


@dataclass
class Failover:
    """One leader's end and the next leader, in ``time.monotonic()`` seconds."""

    ended: float  # the leader killed (the parent, before SIGKILL) or resign() called
    led: float  # the next leader's campaign() returned
    seen: float  # the observer was told of the next leader
    expired: float | None  # killed: its hold ran out on a quorum (from the PTTLs)
    term_grew: bool


class FailoverFleet:
    """On one set of masters: a leader and a standby queued behind it, each a spawned
    process with a manager of its own, and an observer process."""

    def __init__(self, urls: Sequence[str], name: str, lease: float, rng: random.Random) -> None:
        from redreentrant._core import keys

        self._mp = multiprocessing.get_context("spawn")
        self.urls, self.name, self.lease = list(urls), name, lease
        self.children: list[Child] = []
        self.clients = [redis.Redis.from_url(u) for u in urls]
        self.lock_key = keys.aux_key(name, "election")
        self.queue_key = keys.aux_key(name, "election:queue")
        self.term = 0
        self._rng = rng

    def _spawn(self, target: Callable[..., None]) -> Child:
        ensure_repo_importable()  # the children get this process's sys.path
        child = Child(self._mp, target, self.urls, self.name, self.lease)
        self.children.append(child)
        return child

    def start(self) -> None:
        self.observer = self._spawn(failover_observer)
        self.leader = self._spawn(failover_candidate)
        self.standby = self._spawn(failover_candidate)
        self.observer.expect("observing")
        for c in (self.leader, self.standby):
            c.expect("ready")
        self.leader.send("campaign")
        self.term = self.leader.expect("leading")[2]
        self.observer.expect("seen", lambda msg: msg[2] == self.term)
        self._queue(self.standby)

    def _queue(self, child: Child) -> None:
        """``child`` campaigns: back once it is queued behind the leader on every master
        (the queue holds the waiting candidates, the leader no longer)."""
        child.send("campaign")
        child.expect("campaigning")
        deadline = time.monotonic() + FAILOVER_WAIT_S
        while not all(int(c.llen(self.queue_key)) >= 1 for c in self.clients):
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not queue on every master")
            time.sleep(0.005)

    def _next(self, ended: float, expired: float | None) -> Failover:
        led, term = self.standby.expect("leading", timeout=3 * self.lease + FAILOVER_WAIT_S)[1:]
        seen = self.observer.expect("seen", lambda msg: msg[2] == term)[1]
        grew = term > self.term
        self.term = term
        return Failover(ended, led, seen, expired, grew)

    def kill_leader(self) -> Failover:
        """SIGKILL the leader at a random point of its renewal cycle: the standby leads
        once the lease runs out; a new process queues behind it."""
        # The leader began to lead just now (the fleet started, or the last failover):
        # without this wait, every kill would come right after a renewal.
        time.sleep(self._rng.uniform(0.0, self.lease / 3))
        ended = time.monotonic()
        self.leader.process.kill()
        # When the dead leader's hold runs out on a quorum (read after the kill: no
        # renewal can come later): the needed-th earliest end of the masters'.
        ends = sorted(time.monotonic() + int(c.pttl(self.lock_key)) / 1000 for c in self.clients)
        out = self._next(ended, ends[len(ends) // 2])
        dead = self.leader
        dead.stop()
        self.children.remove(dead)
        self.leader = self.standby
        self.standby = self._spawn(failover_candidate)
        self.standby.expect("ready")
        self._queue(self.standby)
        return out

    def resign_leader(self) -> Failover:
        """The leader resigns: the standby is woken and leads; the old leader
        campaigns again, behind it."""
        self.leader.send("resign")
        out = self._next(self.leader.expect("resigned")[1], None)
        self.leader, self.standby = self.standby, self.leader
        self._queue(self.standby)
        return out

    def stop(self) -> None:
        """Candidates resign and end (the standby once it leads); the observer, and
        every process still there after 2 leases, are killed."""
        for c in self.children:
            if c is not self.observer:
                with contextlib.suppress(Exception):
                    c.send("exit")
        deadline = time.monotonic() + 2 * self.lease + 3.0
        for c in self.children:
            if c is not self.observer:
                c.process.join(max(0.0, deadline - time.monotonic()))
        for c in self.children:
            c.stop()
        self.children.clear()
        for client in self.clients:
            client.close()


def record_failover(row: Row, how: str, f: Failover, lease: float) -> None:
    to_next, observer = f.led - f.ended, f.seen - f.ended
    if how == KILLED:
        row.add("next leader s", to_next)
        row.add("observer s", observer)
        if f.expired is not None:
            row.add("past expiry ms", (f.led - f.expired) * 1000)
    else:
        row.add("next leader ms", to_next * 1000)
        row.add("observer ms", observer * 1000)
    row.add("÷ lease", to_next / lease)
    row.add("observer lag ms", (f.seen - f.led) * 1000)
    if not f.term_grew:
        row.flags["term_not_grown"] = row.flags.get("term_not_grown", 0) + 1
        row.note("TERM DID NOT GROW")
    log(
        f"  {row.case:28} next leader after {to_next * 1000:8.2f} ms "
        f"({to_next / lease:.3f} x lease), observer after {observer * 1000:8.2f} ms"
    )


def run(ctx: Context) -> None:
    kills, resigns = (1, 1) if ctx.args.quick else (FAILOVER_KILLS, FAILOVER_RESIGNS)
    lease = FAILOVER_LEASE_S
    ctx.results.facts["failover_lease_s"] = lease
    rng = random.Random(0)  # when in its renewal cycle each leader is killed
    plan = [  # interleaved: killed, resigned, killed, ...
        how
        for i in range(max(kills, resigns))
        for how, count in ((KILLED, kills), (RESIGNED, resigns))
        if i < count
    ]
    for rnd in range(ctx.args.rounds):
        log(f"failover: round {rnd + 1}/{ctx.args.rounds}")
        for n in (1, 5):
            if n > len(ctx.urls):
                continue
            rows = {
                how: ctx.results.row("failover", f"{masters_label(n)}, {how}", RR)
                for how in (KILLED, RESIGNED)
            }
            todo = [how for how in plan if not rows[how].error]
            if not todo:
                continue
            fleet = FailoverFleet(ctx.urls[:n], f"{ctx.run_id}:f{n}:{rnd}", lease, rng)
            doing = list(rows)
            try:
                fleet.start()
                for how in todo:
                    doing = [how]
                    f = fleet.kill_leader() if how == KILLED else fleet.resign_leader()
                    record_failover(rows[how], how, f, lease)
            except Exception as exc:
                for how in doing:
                    rows[how].fail(exc)
            finally:
                fleet.stop()
