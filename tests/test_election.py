"""Leader election against real masters: one leader at a time, candidates served in
arrival order, terms that only grow, the leader record (value, term, owner) as a
quorum sees it, proclaim and resign, loss reported like a lock's, and observers woken
by every change; sync and asyncio, on one and on five masters."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
from helpers import PY, delete_everywhere, drop_counters, heal, many_managers, run, wait_until

import redreentrant.asyncio as ra
from redreentrant import (
    Election,
    LeaderView,
    LockInfo,
    LockListener,
    LockLostError,
    LockManager,
    LockNotOwnedError,
    LockTimeoutError,
    ManagerClosedError,
    QuorumUnavailableError,
)
from redreentrant._core.kinds import ELECTION
from redreentrant.testing import LocalEnsemble


@pytest.fixture(params=[1, 5], ids=["one-master", "five-masters"])
def masters(request: pytest.FixtureRequest, ensemble: LocalEnsemble) -> Iterator[list[str]]:
    """The masters; afterwards only the terms' counters may be left (they outlive
    leaderships on purpose, so that terms keep growing), and they are removed."""
    yield ensemble.urls[: request.param]
    drop_counters(ensemble)


def lead_in_thread(
    mgr: LockManager, name: str, value: bytes, leave: threading.Event, log: list[int]
) -> threading.Thread:
    """A thread that campaigns, appends its term to ``log`` once it leads, and resigns
    when ``leave`` is set."""

    def lead() -> None:
        with mgr.election(name).campaign(value=value) as e:
            log.append(e.term)
            leave.wait(30)

    t = threading.Thread(target=lead)
    t.start()
    return t


def test_one_leader_and_what_everyone_sees_of_it(masters: list[str]) -> None:
    with LockManager(masters, lease=5.0) as a, LockManager(masters, lease=5.0) as b:
        mine, theirs = a.election("scheduler"), b.election("scheduler")
        assert theirs.leader() is None
        with mine.campaign(value=b"host-a") as leading:
            assert leading is mine and mine.is_owned()
            seen = theirs.leader()
            assert isinstance(seen, LeaderView)
            assert seen.owner == a.owner_id() and seen.value == b"host-a"
            assert seen.term == mine.term and 0 < seen.validity <= 5.0
            assert seen.info is not None and seen.info.name == threading.current_thread().name
            assert seen.info.pid > 0 and seen.info.host
            # Another candidate waits, and gives up when its time passes: nothing held.
            with pytest.raises(LockTimeoutError):
                theirs.campaign(value=b"host-b", timeout=0.3)
            assert not theirs.acquire(blocking=False)
            mine.proclaim("host-a, again")  # a str is its UTF-8 bytes
            now = theirs.leader()
            assert now is not None and (now.owner, now.info, now.term) == (
                seen.owner,
                seen.info,
                seen.term,
            )
            assert now.value == b"host-a, again" and not now.same(seen)
            with pytest.raises(LockNotOwnedError):
                theirs.proclaim(b"not mine")
        assert theirs.leader() is None
        with pytest.raises(LockNotOwnedError):
            mine.resign()


def test_terms_grow_with_every_leader_across_clients(masters: list[str]) -> None:
    terms: list[int] = []
    with many_managers(3, masters, lease=5.0) as managers:
        for _ in range(3):
            for m in managers:
                e = m.election("terms")
                e.campaign(value=m.id)
                terms.append(e.term)
                assert m.election("terms").leader().term == e.term  # type: ignore[union-attr]
                e.resign()
    assert terms == sorted(set(terms)) and len(terms) == 9


def test_candidates_lead_in_order_of_arrival(masters: list[str]) -> None:
    with many_managers(4, masters, lease=5.0) as managers:
        first = managers[0].election("line")
        first.campaign(value=b"0")
        order: list[int] = []
        threads = []
        for i, m in enumerate(managers[1:], start=1):

            def stand(m: LockManager = m, i: int = i) -> None:
                with m.election("line").campaign(value=str(i)):
                    order.append(i)

            t = threading.Thread(target=stand)
            t.start()
            threads.append(t)
            queued = len(threads)

            def lined_up(queued: int = queued) -> bool:
                return all(len(v.locks[0].queue) == queued for v in first_views(managers[0]))

            wait_until(lined_up, f"{queued} candidate(s) queued")
        first.resign()
        for t in threads:
            t.join(20)
        assert order == [1, 2, 3]


def first_views(mgr: LockManager) -> list:  # type: ignore[type-arg]
    return [v for v in mgr.inspect("line") if v.locks]


def test_resigning_hands_over_and_the_leader_already_proclaims(masters: list[str]) -> None:
    with LockManager(masters, lease=5.0) as a, LockManager(masters, lease=5.0) as b:
        leave = threading.Event()
        terms: list[int] = []
        t = lead_in_thread(b, "hand", b"b", leave, terms)
        wait_until(lambda: terms, "b leads")
        mine = a.election("hand")
        got: list[int] = []

        def wait_for_it() -> None:
            mine.campaign(value=b"a")
            got.append(mine.term)
            # Campaigning again while leading only proclaims the new value.
            assert mine.campaign(value=b"a2") is mine
            assert mine.leader().value == b"a2"  # type: ignore[union-attr]
            mine.resign()

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        wait_until(lambda: any(v.locks and v.locks[0].queue for v in a.inspect("hand")), "queued")
        assert not got
        leave.set()
        t.join(10)
        waiter.join(10)
        assert got and got[0] > terms[0]


def test_a_lost_leadership_is_reported_like_a_lock(ensemble: LocalEnsemble) -> None:
    urls = ensemble.urls[:3]
    lost: list[object] = []
    with LockManager(urls, lease=1.0, on_lost=lost.append) as mgr:
        e = mgr.election("fragile")
        e.campaign(value=b"x")
        signal_ = e.lost
        keys = [ELECTION.key("fragile"), ELECTION.changes("fragile")]
        delete_everywhere(urls, *keys)
        assert signal_.wait(5)
        wait_until(lambda: lost, "on_lost called")
        assert isinstance(lost[0], Election) and lost[0].name == "fragile"
        with pytest.raises(LockLostError):
            e.ensure_held()
        with pytest.raises(LockLostError):
            e.proclaim(b"y")
        with pytest.raises(LockLostError):
            e.resign()
    ensemble.flushall()


def test_a_proclaim_written_on_too_few_to_tell_keeps_the_leadership(
    ensemble: LocalEnsemble,
) -> None:
    # Two masters down and the record gone from one (its key deleted): written on two,
    # refused by one. The hold may still stand on a quorum: not a loss.
    urls = ensemble.urls
    with LockManager(urls, lease=10.0, master_timeout=0.3) as mgr:
        e = mgr.election("shaky")
        e.campaign(value=b"x")
        ensemble.servers[3].stop()
        ensemble.servers[4].stop()
        delete_everywhere(urls[2:3], ELECTION.key("shaky"), ELECTION.changes("shaky"))
        with pytest.raises(QuorumUnavailableError):
            e.proclaim(b"y")
        e.ensure_held()  # still the leader
        e.resign()
    heal(ensemble)
    drop_counters(ensemble)


def test_a_listener_is_told_of_an_election_by_its_label(masters: list[str]) -> None:
    events: list[tuple[str, str]] = []

    class Told(LockListener):
        def acquired(self, info: LockInfo, *_: object) -> None:
            events.append(("acquired", info.kind))

        def released(self, info: LockInfo, *_: object) -> None:
            events.append(("released", info.kind))

    with LockManager(masters, listener=Told()) as mgr, mgr.election("told").campaign():
        pass
    wait_until(lambda: len(events) == 2, "both events")
    assert events == [("acquired", "election"), ("released", "election")]


def test_an_observer_sees_every_change(masters: list[str]) -> None:
    with LockManager(masters, lease=5.0) as a, LockManager(masters, lease=5.0) as b:
        seen: list[tuple[str, int, bytes] | None] = []
        observer = b.election("watched").observe()
        seen.append(next(observer))  # nobody leads yet
        # Changes in quick succession, none waited for: each is reported, in order.
        e = a.election("watched")
        e.campaign(value=b"one")
        e.proclaim(b"two")
        e.resign()
        f = b.election("watched")
        f.campaign(value=b"three")
        f.resign()
        for _ in range(5):
            leader = next(observer)
            seen.append(None if leader is None else (leader.owner, leader.term, leader.value))
        observer.close()
        me, them = a.owner_id(), b.owner_id()
        first = seen[1][1] if seen[1] is not None else 0
        assert seen == [
            None,
            (me, first, b"one"),
            (me, first, b"two"),
            None,
            (them, first + 1, b"three"),
            None,
        ]


def test_a_dead_leader_is_seen_gone_and_a_standby_takes_over(ensemble: LocalEnsemble) -> None:
    urls = ensemble.urls[:3]
    # The leader is another process, killed while it leads: nothing publishes its end.
    code = (
        "import sys, time\n"
        "from redreentrant import LockManager\n"
        "m = LockManager(sys.argv[1].split(','), lease=1.0)\n"
        "m.election('standby').campaign(value=b'dead')\n"
        "print('leading', flush=True)\n"
        "time.sleep(60)\n"
    )
    leader = subprocess.Popen([PY, "-c", code, ",".join(urls)], stdout=subprocess.PIPE, text=True)
    try:
        assert leader.stdout is not None and leader.stdout.readline().strip() == "leading"
        with LockManager(urls, lease=1.0) as mgr:
            changes: list[LeaderView | None] = []
            stop = threading.Event()

            def observe() -> None:
                for change in mgr.election("standby").observe():
                    changes.append(change)
                    if stop.is_set():
                        return

            watcher = threading.Thread(target=observe)
            watcher.start()
            wait_until(lambda: changes and changes[0] is not None, "the leader seen")
            old = changes[0]
            assert old is not None and old.value == b"dead"
            leader.send_signal(signal.SIGKILL)
            standby = mgr.election("standby")
            started = time.monotonic()
            standby.campaign(value=b"standby", timeout=10)
            assert time.monotonic() - started < 5  # about a lease, a wide margin
            assert standby.term > old.term
            wait_until(lambda: changes[-1] is not None and changes[-1].value == b"standby", "seen")
            stop.set()
            standby.resign()
            watcher.join(10)
            assert None in changes[1:]  # the dead leader was seen gone before the standby
    finally:
        leader.kill()
        leader.wait()
    ensemble.flushall()


def test_asyncio_election(masters: list[str]) -> None:
    async def main() -> list[int]:
        async with ra.LockManager(masters, lease=5.0) as a, ra.LockManager(masters) as b:
            terms: list[int] = []
            seen: list[bytes | None] = []

            async def observe() -> None:
                async for leader in b.election("aio").observe():
                    seen.append(None if leader is None else leader.value)
                    if seen[-1] == b"third":
                        return

            watcher = asyncio.create_task(observe())
            while not seen:
                await asyncio.sleep(0.01)
            async with a.election("aio").campaign(value=b"first") as e:
                terms.append(e.term)
                assert (await b.election("aio").leader()).value == b"first"  # type: ignore[union-attr]
                with pytest.raises(LockTimeoutError):
                    await b.election("aio").campaign(timeout=0.2)
                await e.proclaim("second")
            e2 = await b.election("aio").campaign(value=b"third")
            terms.append(e2.term)
            await asyncio.wait_for(watcher, 10)
            await e2.resign()
            assert seen[:3] == [None, b"first", b"second"] and seen[-1] == b"third"
            assert set(seen[3:-1]) <= {None}
            assert await a.election("aio").leader() is None
            return terms

    terms = run(main())
    assert terms[0] < terms[1]


def test_asyncio_cancel_on_loss_cancels_the_leading_task(ensemble: LocalEnsemble) -> None:
    urls = ensemble.urls[:3]

    async def main() -> str:
        async with ra.LockManager(urls, lease=1.0) as mgr:
            election = mgr.election("cancelled", cancel_on_loss=True)

            async def lead() -> str:
                try:
                    async with election.campaign(value=b"x"):
                        delete_everywhere(urls, ELECTION.key("cancelled"))
                        await asyncio.sleep(30)
                except LockLostError:
                    return "lost"
                return "not cancelled"

            return await asyncio.wait_for(lead(), 10)

    assert run(main()) == "lost"
    ensemble.flushall()


def test_closing_the_manager_stops_its_observers(masters: list[str]) -> None:
    errors: list[BaseException] = []
    mgr = LockManager(masters, lease=5.0)
    observer = mgr.election("closing").observe()
    assert next(observer) is None

    def observe() -> None:
        try:
            next(observer)
        except BaseException as error:
            errors.append(error)

    t = threading.Thread(target=observe)
    t.start()
    mgr.close()
    t.join(10)
    assert len(errors) == 1 and isinstance(errors[0], ManagerClosedError)


def test_an_observer_that_starts_under_a_leader_reports_it_once(masters: list[str]) -> None:
    with LockManager(masters, lease=5.0) as a, LockManager(masters, lease=5.0) as b:
        e = a.election("once")
        e.campaign(value=b"a")
        observer = b.election("once").observe()
        first = next(observer)
        assert first is not None and first.value == b"a"
        e.resign()
        assert next(observer) is None  # the next report is the change, not a repeat
        observer.close()
