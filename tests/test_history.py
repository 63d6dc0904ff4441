"""The history recorder and checker (:mod:`redreentrant.testing.history`), and proof that
the checker bites.

The unit tests judge hand-made histories, one rule and its boundaries at a time. The
integration tests record real runs against the masters: a broken lock and a store that
ignores tokens must be caught, the library's lock and a compare-and-set store must pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from helpers import in_threads
from typing_extensions import Unpack

from redreentrant import Lock, LockLostError, LockManager
from redreentrant.testing.history import (
    Event,
    Fields,
    Hold,
    Recorder,
    Report,
    check,
    derive_holds,
    load,
)

MS = 1_000_000


def ev(
    client: str,
    op: str,
    phase: str,
    ms: float,
    lock: str = "L",
    mode: str = "x",
    **f: Unpack[Fields],
) -> Event:
    """An event at ``ms`` milliseconds."""
    return Event(client=client, op=op, phase=phase, t=round(ms * MS), lock=lock, mode=mode, **f)


def held(
    client: str,
    start: float,
    end: float | None,
    lock: str = "L",
    mode: str = "x",
    **f: Unpack[Fields],
) -> list[Event]:
    """The events of one hold: acquired at ``start``, released at ``end`` (None: never)."""
    events = [
        ev(client, "acquire", "invoke", start - 0.5, lock, mode),
        ev(client, "acquire", "ok", start, lock, mode, **f),
    ]
    if end is not None:
        events += [
            ev(client, "release", "invoke", end, lock, mode, owner=f.get("owner")),
            ev(client, "release", "ok", end + 0.5, lock, mode, owner=f.get("owner")),
        ]
    return events


# Times in a violation's detail count from the history's first event: with held(),
# that is its acquire invoke, half a millisecond before the ok.


def spans(holds: list[Hold]) -> list[tuple[str, float, float, str]]:
    return [(h.client, h.start / MS, h.end / MS, h.ended_by) for h in holds]


# -- events and recording -------------------------------------------------------------


def test_an_event_round_trips_through_json() -> None:
    e = ev("p1/t2", "write", "ok", 3, owner="o", token=7, accepted=True, seq=4, value=9)
    assert Event.from_json(e.to_json()) == e
    assert e.who == "o" and ev("p1", "acquire", "ok", 1).who == "p1"


@pytest.mark.parametrize(
    "bad", [{"phase": "done"}, {"mode": "rw"}, {"t": 1.5}, {"t": True}], ids=str
)
def test_an_event_refuses_what_the_checker_would_ignore(bad: dict[str, object]) -> None:
    data: dict[str, object] = {
        "client": "c",
        "op": "acquire",
        "phase": "ok",
        "t": 1,
        "lock": "L",
        **bad,
    }
    with pytest.raises((ValueError, TypeError)):
        Event(**data)  # type: ignore[arg-type]


def test_the_recorder_writes_one_flushed_line_per_event(tmp_path: Path) -> None:
    path = tmp_path / "p1.jsonl"
    with Recorder(path, "p1") as rec:
        t1 = rec.child("t1")
        first = rec.invoke("acquire", "L", owner="me")
        second = t1.ok("acquire", "L", "fair", owner="me", token=3, valid_until=99)
        # Readable before the recorder is closed: every line is flushed.
        assert load([path]) == [first, second]
        assert second.client == "p1/t1" and second.t >= first.t
        t1.close()  # a child's close leaves the shared file open
        rec.fail("release", "L")
    assert [e.phase for e in load([path])] == ["invoke", "ok", "fail"]
    with pytest.raises(ValueError, match="closed"):
        rec.ok("acquire", "L")


def test_a_span_records_invoke_then_ok_or_fail(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    with Recorder(path, "p") as rec:
        with rec.span("acquire", "L", owner="o") as out:
            out.update(token=5)
        with rec.span("acquire", "L", owner="o") as out:
            out.fail()  # e.g. acquire(blocking=False) returned False
        with pytest.raises(LockLostError), rec.span("release", "L", owner="o"):
            raise LockLostError("lost")
    got = [(e.op, e.phase, e.owner, e.token) for e in load([path])]
    assert got == [
        ("acquire", "invoke", "o", None),
        ("acquire", "ok", "o", 5),
        ("acquire", "invoke", "o", None),
        ("acquire", "fail", "o", None),
        ("release", "invoke", "o", None),
        ("release", "fail", "o", None),
    ]


def test_threads_share_a_recorder_safely(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    with Recorder(path, "p") as rec:

        def work(i: int) -> None:
            child = rec.child(f"t{i}")
            for n in range(200):
                child.ok("incr", "c", value=n)

        in_threads(work, [(i,) for i in range(8)], timeout=None)
    lines = path.read_text().splitlines()
    events = [Event.from_json(line) for line in lines]
    assert len(events) == 1600
    # Times are read under the recorder's lock: the file is in time order.
    assert [e.t for e in events] == sorted(e.t for e in events)


def test_load_merges_files_by_time_and_skips_a_torn_last_line(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(e.to_json() for e in [ev("a", "x", "ok", 1), ev("a", "x", "ok", 3)]))
    torn = ev("b", "x", "ok", 4).to_json()[:-7]
    b.write_text(ev("b", "x", "ok", 2).to_json() + "\n" + torn)
    assert [(e.client, e.t // MS) for e in load([a, b])] == [("a", 1), ("b", 2), ("a", 3)]
    assert load(str(a)) == load([a])
    # Reopened by a restarted writer, the file loses the fragment, not the next event.
    with Recorder(b, "b") as rec:
        late = rec.ok("x", "L")
    assert load([b]) == [ev("b", "x", "ok", 2), late]


def test_load_refuses_damage_that_is_not_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("{not json\n" + ev("p", "x", "ok", 1).to_json() + "\n")
    with pytest.raises(ValueError, match=r"p\.jsonl:1"):
        load([path])


def test_a_killed_recorder_leaves_a_loadable_file(tmp_path: Path) -> None:
    path = tmp_path / "killed.jsonl"
    code = (
        "import sys\n"
        "from redreentrant.testing.history import Recorder\n"
        "rec = Recorder(sys.argv[1], 'p9')\n"
        "rec.ok('incr', 'c', value=0)\n"
        "print('ready', flush=True)\n"
        "n = 1\n"
        "while True:\n"
        "    rec.ok('incr', 'c', value=n)\n"
        "    n += 1\n"
    )
    here = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        time.sleep(0.05)
    finally:
        proc.kill()  # SIGKILL: no exit handlers, no buffered writes flushed
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    events = load([path])
    lines = path.read_text().splitlines()
    assert len(events) >= max(1, len(lines) - 1)
    assert [e.value for e in events] == list(range(len(events)))


# -- holds ----------------------------------------------------------------------------


def test_a_hold_runs_from_acquire_ok_to_release_invoke() -> None:
    assert spans(derive_holds(held("a", 1, 5))) == [("a", 1, 5, "release")]


def test_nested_acquires_are_levels_of_one_hold() -> None:
    events = [
        ev("a", "acquire", "ok", 1),
        ev("a", "acquire", "ok", 2),  # re-entry: no new hold
        ev("a", "release", "invoke", 3),  # back to level 1: still held
        ev("a", "release", "ok", 3.5),
        ev("a", "release", "invoke", 6),  # level 0: the hold ends here
        ev("a", "release", "ok", 6.5),
    ]
    assert spans(derive_holds(events)) == [("a", 1, 6, "release")]


def test_a_reentry_refreshes_the_validity_and_a_renewal_extends_it() -> None:
    events = [
        ev("a", "acquire", "ok", 1, valid_until=10 * MS),
        ev("a", "acquire", "ok", 8, valid_until=20 * MS),
        ev("a", "renew", "ok", 15, valid_until=30 * MS),
        ev("b", "acquire", "ok", 40),  # makes the history run on past a's validity
    ]
    assert spans(derive_holds(events))[0] == ("a", 1, 30, "validity")


def test_a_renewal_after_the_validity_ended_does_not_revive_the_hold() -> None:
    events = [
        ev("a", "acquire", "ok", 1, valid_until=10 * MS),
        ev("a", "renew", "ok", 12, valid_until=30 * MS),
        ev("a", "release", "invoke", 25),
    ]
    assert spans(derive_holds(events)) == [("a", 1, 10, "validity")]


def test_a_reentry_after_the_validity_ended_starts_a_new_hold() -> None:
    events = [
        ev("a", "acquire", "ok", 1, valid_until=10 * MS),
        ev("a", "acquire", "ok", 12, valid_until=30 * MS),
        ev("a", "release", "invoke", 14),  # level 1: still held
        ev("a", "release", "invoke", 16),
    ]
    assert spans(derive_holds(events)) == [("a", 1, 10, "validity"), ("a", 12, 16, "release")]


def test_a_killed_holder_holds_until_its_validity_ends() -> None:
    events = [*held("a", 1, None, valid_until=50 * MS), *held("b", 60, 70)]
    assert spans(derive_holds(events)) == [("a", 1, 50, "validity"), ("b", 60, 70, "release")]


def test_without_a_validity_an_unreleased_hold_lasts_to_the_end_of_the_history() -> None:
    events = [*held("a", 1, None), ev("b", "acquire", "invoke", 9)]
    assert spans(derive_holds(events)) == [("a", 1, 9, "end-of-history")]
    assert spans(derive_holds(events, end=20 * MS)) == [("a", 1, 20, "end-of-history")]


def test_a_validity_before_the_release_ends_the_hold() -> None:
    events = held("a", 1, 30, valid_until=20 * MS)
    assert spans(derive_holds(events)) == [("a", 1, 20, "validity")]


def test_a_failed_release_ends_the_hold_at_its_invoke_whatever_the_level() -> None:
    events = [
        ev("a", "acquire", "ok", 1),
        ev("a", "acquire", "ok", 2),
        ev("a", "release", "invoke", 5),
        ev("a", "release", "fail", 6),  # LockLostError: nothing is held any more
        ev("a", "release", "invoke", 9),  # the outer level's release finds nothing
    ]
    assert spans(derive_holds(events)) == [("a", 1, 5, "release")]


# -- overlap and reader-writer -----------------------------------------------------------


def test_overlapping_exclusive_holds_are_reported_with_who_and_when() -> None:
    report = check([*held("a", 1, 10, owner="A", token=1), *held("b", 5, 15, owner="B")])
    assert report.kinds() == {"overlap"}
    detail = report.violations[0].detail
    for name in ("a (owner A, token 1)", "b (owner B)", "+4.500ms", "for 5.000ms"):
        assert name in detail, detail
    assert "overlap" in report.format() and not report.ok


def test_touching_holds_do_not_overlap() -> None:
    events = [*held("a", 1, 5), *held("b", 5, 9)]
    first, second = derive_holds(events)
    assert not first.overlaps(second) and not second.overlaps(first)
    assert check(events).ok


def test_holds_of_one_owner_never_conflict() -> None:
    events = [*held("p1/t1", 1, 10, owner="O"), *held("p1/t2", 5, 15, owner="O")]
    assert check(events).ok


def test_a_killed_holder_conflicts_only_within_its_validity() -> None:
    dead = held("a", 1, None, valid_until=50 * MS)
    assert check([*dead, *held("b", 50, 60)]).ok
    assert check([*dead, *held("b", 49, 60)]).kinds() == {"overlap"}


@pytest.mark.parametrize("mode", ["x", "w", "fair"])
def test_every_exclusive_mode_is_judged(mode: str) -> None:
    report = check([*held("a", 1, 10, mode=mode), *held("b", 5, 15, mode=mode)])
    assert report.kinds() == {"overlap"}


def test_lock_families_and_names_are_separate_locks() -> None:
    events = [
        *held("a", 1, 10, mode="x"),
        *held("b", 2, 10, mode="fair"),
        *held("c", 3, 10, mode="w"),
        *held("d", 4, 10, lock="M"),
    ]
    assert check(events).ok


def test_readers_share_a_writer_excludes_them() -> None:
    readers = [*held("r1", 1, 10, mode="r"), *held("r2", 2, 12, mode="r")]
    assert check(readers).ok
    report = check([*readers, *held("w", 11, 20, mode="w")])
    assert report.kinds() == {"reader-writer"}
    assert len(report.violations) == 1 and "r2" in report.violations[0].detail
    assert check([*held("w1", 1, 10, mode="w"), *held("w2", 9, 12, mode="w")]).kinds() == {
        "overlap"
    }


def test_a_writer_may_read_as_well() -> None:
    events = [*held("a", 1, 10, mode="w", owner="O"), *held("a", 2, 15, mode="r", owner="O")]
    assert check(events).ok


# -- fifo ----------------------------------------------------------------------------


def fair(client: str, invoke: float, ok: float | None, release: float | None = None) -> list[Event]:
    events = [ev(client, "acquire", "invoke", invoke, mode="fair")]
    if ok is None:
        return [*events, ev(client, "acquire", "fail", 200, mode="fair")]
    events.append(ev(client, "acquire", "ok", ok, mode="fair"))
    if release is not None:
        events.append(ev(client, "release", "invoke", release, mode="fair"))
    return events


def test_a_later_arrival_served_first_breaks_fifo() -> None:
    events = [
        *fair("holder", 0, 1, 100),
        *fair("a", 10, 150, 160),  # waited from 10 ...
        *fair("b", 30, 100, 150),  # ... but b, arrived 20 ms later, went first
    ]
    report = check(events, fifo_slack_ns=5 * MS)
    assert report.kinds() == {"fifo"}
    assert "a (owner a) asked at +10.000ms" in report.violations[0].detail


def test_arrivals_within_the_slack_may_be_served_in_either_order() -> None:
    events = [*fair("holder", 0, 1, 100), *fair("a", 10, 150, 160), *fair("b", 30, 100, 150)]
    assert check(events, fifo_slack_ns=20 * MS).ok  # exactly the slack apart: not judged
    assert check(events, fifo_slack_ns=20 * MS - 1).kinds() == {"fifo"}


def test_fifo_compares_only_waiters_that_waited_together() -> None:
    # b arrived after a was served: no order between them to keep.
    assert check([*fair("a", 0, 1, 50), *fair("b", 20, 50, 60)], fifo_slack_ns=1).ok
    # a gave up (its acquire failed): b owes it nothing.
    assert check([*fair("a", 0, None), *fair("b", 20, 50, 60)], fifo_slack_ns=1).ok


def test_fifo_ignores_reentries_and_other_modes() -> None:
    events = [
        *fair("a", 0, 1),
        *fair("b", 10, 100, 110),
        *fair("a", 20, 21),  # a re-enters the fair lock it holds: it never queues
        ev("a", "release", "invoke", 30, mode="fair"),
        ev("a", "release", "invoke", 100, mode="fair"),
    ]
    assert check(events, fifo_slack_ns=1).ok
    plain = [
        ev("a", "acquire", "invoke", 10),
        ev("b", "acquire", "invoke", 30),
        *held("b", 100, 150),
        *held("a", 150, 160),
    ]
    assert check(plain, fifo_slack_ns=1).ok


# -- stale writes --------------------------------------------------------------------------


def write(
    client: str, ms: float, token: int, accepted: bool, seq: int | None = None, lock: str = "L"
) -> Event:
    return ev(client, "write", "ok", ms, lock, token=token, accepted=accepted, seq=seq)


def test_an_accepted_write_with_an_older_token_is_stale() -> None:
    events = [write("b", 10, 2, True), write("a", 20, 1, True)]
    report = check(events)
    assert report.kinds() == {"stale-write"}
    assert "token 1" in report.violations[0].detail and "token 2" in report.violations[0].detail
    assert check([write("b", 10, 2, True), write("a", 20, 1, False)]).ok  # refused: fine
    assert check([write("b", 10, 2, True), write("b", 20, 2, True)]).ok  # one holder, twice


def test_the_resources_own_order_decides_when_it_is_given() -> None:
    # Recorded in this time order, but the resource applied a's write first.
    events = [write("b", 10, 2, True, seq=2), write("a", 20, 1, True, seq=1)]
    assert check(events).ok
    events = [write("a", 10, 1, True, seq=2), write("b", 20, 2, True, seq=1)]
    assert check(events).kinds() == {"stale-write"}


def test_a_late_write_accepted_after_a_newer_hold_began_is_stale() -> None:
    events = [
        *held("a", 1, None, token=1, valid_until=10 * MS),
        ev("a", "write", "invoke", 5, token=1),
        write("a", 6, 1, True),  # inside a's hold: fine
        *held("b", 12, 30, token=2),
        ev("a", "write", "invoke", 15, token=1),  # a, paused past its validity, writes
        write("a", 16, 1, True),
    ]
    report = check(events)
    assert report.kinds() == {"stale-write"}
    assert len(report.violations) == 1
    detail = report.violations[0].detail
    assert "+14.500ms" in detail and "ended at +9.500ms (validity)" in detail, detail
    # A resource that only knows the tokens it was sent may accept it: judge by rule 1.
    assert check(events, late_writes=False).ok


def test_a_write_after_the_hold_ended_with_no_newer_holder_is_not_judged() -> None:
    events = [*held("a", 1, 5, token=1), write("a", 8, 1, True)]
    assert check(events).ok


# -- lost updates --------------------------------------------------------------------------


def incr(client: str, ms: float, value: int, lock: str = "L") -> Event:
    return ev(client, "incr", "ok", ms, lock, value=value)


def test_a_value_written_twice_is_a_lost_update() -> None:
    events = [incr("a", 1, 1), incr("b", 2, 2), incr("a", 3, 2), incr("b", 4, 3)]
    report = check(events)
    assert report.kinds() == {"lost-update"}
    assert "value 2 written 2 times: b at +1.000ms, a at +2.000ms" in report.format()


def test_a_final_counter_short_of_the_increments_is_a_lost_update() -> None:
    events = [incr("a", 1, 1), incr("b", 2, 2), incr("a", 3, 3)]
    assert check(events, final_counter=3).ok
    assert check(events, final_counter=2).kinds() == {"lost-update"}
    assert check(events, final_counter={"L": 3, "M": 0}).ok
    assert check(events, final_counter={"M": 1}).kinds() == {"lost-update"}
    with pytest.raises(ValueError, match="ambiguous"):
        check([*events, incr("a", 4, 1, lock="M")], final_counter=4)


def test_the_report_summarises_by_kind() -> None:
    events = [*held("a", 1, 10), *held("b", 5, 15), incr("a", 2, 1), incr("b", 6, 1)]
    report = check(events, final_counter=1)
    assert report.summary() == (
        "history of 10 events, 2 holds: 3 violation(s) (overlap: 1, lost-update: 2)"
    )
    assert str(report).count("\n") == 3
    assert check([]).summary() == "history of 0 events, 0 holds: no violation"


# -- proof against real servers: the checker catches what is broken -----------------------


class GetThenSet:
    """Not a lock: GET, then SET with a lease. Two clients can both see the key free."""

    def __init__(self, r: redis.Redis, name: str) -> None:
        self.r, self.key = r, f"history-test:broken:{name}"

    def acquire(self) -> int:
        while True:
            if self.r.get(self.key) is None:
                time.sleep(0.001)  # widen the race between the check and the claim
                valid_until = time.monotonic_ns() + 5_000 * MS
                self.r.set(self.key, "taken", px=5_000)
                return valid_until
            time.sleep(0.0005)

    def release(self) -> None:
        self.r.delete(self.key)


class Library:
    """The library's lock, reporting the validity its hold has left."""

    def __init__(self, manager: LockManager, name: str, lease: float | None = None) -> None:
        self.lock, self.lease = manager.lock(name), lease

    def acquire(self) -> int:
        self.lock.acquire(lease=self.lease)
        return time.monotonic_ns() + int(self.lock.remaining() * 1e9)

    def release(self) -> None:
        self.lock.release()


def contend(
    r: redis.Redis,
    rec: Recorder,
    name: str,
    guard: Callable[[], GetThenSet | Library],
    owner: Callable[[], str],
    *,
    threads: int,
    times: int,
    work: float,
    lossy: bool = False,
) -> Report:
    """``threads`` threads each ``times`` times: acquire, a read-sleep-write increment of
    a counter on ``r``, release; all recorded. Returns the checker's report. ``lossy``:
    a release may raise LockLostError (a lease shorter than the work)."""
    counter = f"history-test:counter:{name}"
    errors: list[BaseException] = []

    def run(i: int) -> None:
        me, lock = rec.child(f"t{i}"), guard()
        try:
            who = owner()
            for _ in range(times):
                with me.span("acquire", name, owner=who) as out:
                    out.update(valid_until=lock.acquire())
                value = int(r.get(counter) or 0)
                time.sleep(work)  # widen the race a broken lock would lose
                r.set(counter, value + 1)
                me.ok("incr", name, owner=who, value=value + 1)
                try:
                    with me.span("release", name, owner=who):
                        lock.release()
                except LockLostError:
                    # The lease ran out during the work: the span recorded a failed
                    # release, which ends the hold like any other.
                    if not lossy:
                        raise
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    # Daemon threads: a lock that never grants fails this test instead of hanging
    # the run (closing the manager then wakes them).
    pool = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    deadline = time.monotonic() + 60
    for t in pool:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not [t for t in pool if t.is_alive()], "threads still waiting after 60 s"
    assert not errors, errors
    return check(load([rec.path]), final_counter=int(r.get(counter) or 0))


def test_the_checker_catches_a_broken_lock(urls: list[str], tmp_path: Path) -> None:
    with redis.Redis.from_url(urls[0]) as r, Recorder(tmp_path / "p0.jsonl", "p0") as rec:
        report = contend(
            r,
            rec,
            "broken",
            lambda: GetThenSet(r, "broken"),
            lambda: threading.current_thread().name,
            threads=6,
            times=10,
            work=0.002,
        )
    assert {"overlap", "lost-update"} <= report.kinds(), report.format()
    assert len(report.holds) == 60


def test_the_checker_passes_the_librarys_lock(
    manager: LockManager, urls: list[str], tmp_path: Path
) -> None:
    with redis.Redis.from_url(urls[0]) as r, Recorder(tmp_path / "p0.jsonl", "p0") as rec:
        report = contend(
            r,
            rec,
            "real",
            lambda: Library(manager, "real"),
            manager.owner_id,
            threads=6,
            times=10,
            work=0.002,
        )
        assert int(r.get("history-test:counter:real") or 0) == 60
    assert report.ok, report.format()
    assert len(report.holds) == 60 and {h.ended_by for h in report.holds} == {"release"}


def test_work_that_outlives_its_lease_loses_updates_without_overlapping(
    urls: list[str], tmp_path: Path
) -> None:
    # Each hold ends at its reported validity, before the next owner's grant: exclusion
    # held as promised, but the work went on past it and its increments were lost.
    with (
        LockManager(urls, master_timeout=0.01) as manager,  # short enough for a 50 ms lease
        redis.Redis.from_url(urls[0]) as r,
        Recorder(tmp_path / "p0.jsonl", "p0") as rec,
    ):
        report = contend(
            r,
            rec,
            "short",
            lambda: Library(manager, "short", lease=0.05),
            manager.owner_id,
            threads=3,
            times=3,
            work=0.12,
            lossy=True,
        )
    assert report.kinds() == {"lost-update"}, report.format()
    assert "validity" in {h.ended_by for h in report.holds}


#: A compare-and-set store (for this test only): a write is accepted when its token is at
#: least the largest accepted so far. Replies {accepted, seq}: seq orders all writes.
FENCED = """
local seq = redis.call('INCR', KEYS[3])
local top = tonumber(redis.call('GET', KEYS[1]) or '-1')
if tonumber(ARGV[1]) < top then return {0, seq} end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return {1, seq}
"""

#: A store that ignores tokens: every write is accepted.
UNFENCED = """
local seq = redis.call('INCR', KEYS[3])
redis.call('SET', KEYS[2], ARGV[2])
return {1, seq}
"""


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "unfenced"])
def test_the_checker_catches_a_store_that_accepts_a_paused_holders_write(
    urls: list[str], tmp_path: Path, fenced: bool
) -> None:
    name = "fenced"
    keys = [f"history-test:{{{name}}}:{k}" for k in ("top", "value", "seq")]
    with (
        LockManager(urls, master_timeout=0.02) as mgr_a,  # short enough for a 200 ms lease
        LockManager(urls) as mgr_b,
        redis.Redis.from_url(urls[0]) as r,
        Recorder(tmp_path / "p0.jsonl", "p0") as rec,
    ):
        store = r.register_script(FENCED if fenced else UNFENCED)
        a, b = rec.child("a"), rec.child("b")
        owner_a, owner_b = mgr_a.owner_id(), mgr_b.owner_id()
        lock_a, lock_b = mgr_a.lock(name), mgr_b.lock(name)

        def grant(who: Recorder, owner: str, lock: Lock, lease: float | None) -> int:
            with who.span("acquire", name, owner=owner) as out:
                lock.acquire(lease=lease)
                # A token per grant, made here: this test is about the checker.
                token = int(r.incr(f"history-test:{{{name}}}:tokens"))
                valid_until = time.monotonic_ns() + int(lock.remaining() * 1e9)
                out.update(token=token, valid_until=valid_until)
            return token

        def put(who: Recorder, owner: str, token: int, value: str) -> bool:
            with who.span("write", name, owner=owner, token=token) as out:
                accepted, seq = store(keys=keys, args=[token, value])
                out.update(accepted=bool(accepted), seq=int(seq))
            return bool(accepted)

        token_a = grant(a, owner_a, lock_a, 0.2)
        assert put(a, owner_a, token_a, "a1")
        time.sleep(lock_a.remaining() + 0.05)  # a pauses past its validity ...
        token_b = grant(b, owner_b, lock_b, None)  # ... b is granted ...
        assert token_b > token_a and put(b, owner_b, token_b, "b1")
        assert put(a, owner_a, token_a, "a2") is not fenced  # ... and a writes late
        with pytest.raises(LockLostError), a.span("release", name, owner=owner_a):
            lock_a.release()
        with b.span("release", name, owner=owner_b):
            lock_b.release()
    report = check(load([rec.path]))
    if fenced:
        assert report.ok, report.format()
    else:
        assert report.kinds() == {"stale-write"}, report.format()
        assert len(report.violations) == 1 and "token 1" in report.violations[0].detail


# -- the semaphore: at most P holders ------------------------------------------------------


def test_more_permit_holders_than_permits_at_one_instant_is_over_capacity() -> None:
    three = [
        *held("a", 1, 10, mode="sem", owner="A"),
        *held("b", 2, 10, mode="sem", owner="B"),
        *held("c", 5, 12, mode="sem", owner="C"),
    ]
    report = check(three, permits=2)
    assert report.kinds() == {"over-capacity"}
    assert "3 owners hold one of 2 permits" in report.violations[0].detail
    assert check(three, permits=3).ok
    assert check(three, permits={"other": 1}).ok  # a name without a number: not judged
    assert check(three).ok  # permit holds never overlap-fail as exclusive holds


def test_permit_holds_that_merely_touch_do_not_count_together() -> None:
    events = [
        *held("a", 1, 5, mode="sem", owner="A"),
        *held("b", 1, 9, mode="sem", owner="B"),
        *held("c", 5, 9, mode="sem", owner="C"),  # starts where a ends
    ]
    assert check(events, permits=2).ok


def test_a_killed_permit_holder_counts_until_its_validity_ends() -> None:
    gone = [ev("a", "acquire", "ok", 1, mode="sem", owner="A", valid_until=round(20 * MS))]
    events = [
        *gone,
        *held("b", 2, 30, mode="sem", owner="B"),
        *held("c", 15, 30, mode="sem", owner="C"),
    ]
    assert check(events, permits=2).kinds() == {"over-capacity"}  # a held until 20
    late = [
        *gone,
        *held("b", 2, 30, mode="sem", owner="B"),
        *held("c", 21, 30, mode="sem", owner="C"),
    ]
    assert check(late, permits=2).ok


# -- leader election: one leader at a time, growing terms, fenced writes ---------------------


def lead(
    client: str, start: float, end: float | None, term: int, **f: Unpack[Fields]
) -> list[Event]:
    """One leadership: campaigned at ``start`` with ``term``, resigned at ``end``."""
    return held(client, start, end, mode="lead", owner=client.upper(), token=term, **f)


def lead_write(client: str, ms: float, term: int, accepted: bool) -> list[Event]:
    """A write fenced by ``term`` (invoked half a millisecond before its outcome)."""
    return [
        ev(client, "write", "invoke", ms - 0.5, mode="lead", token=term),
        ev(client, "write", "ok", ms, mode="lead", token=term, accepted=accepted),
    ]


def test_two_leaders_at_one_instant_overlap() -> None:
    report = check([*lead("a", 1, 10, term=1), *lead("b", 5, 15, term=2)])
    assert report.kinds() == {"overlap"}
    detail = report.violations[0].detail
    assert "[lead]" in detail and "a (owner A, term 1) held lead" in detail, detail
    # A leader ends where the next begins: no overlap, and an election is a lock of its
    # own (a plain lock of the same name is another family).
    assert check([*lead("a", 1, 10, term=1), *lead("b", 10, 15, term=2)]).ok
    assert check([*lead("a", 1, 10, term=1), *held("b", 5, 15, owner="B")]).ok


def test_a_killed_leader_leads_until_the_validity_it_reported() -> None:
    gone = lead("a", 1, None, term=1, valid_until=50 * MS)
    assert check([*gone, *lead("b", 50, 60, term=2)]).ok
    report = check([*gone, *lead("b", 49, 60, term=2)])
    assert report.kinds() == {"overlap"} and "ended by validity" in report.format()


def test_a_leader_told_lost_leads_no_more() -> None:
    told = lead("a", 1, None, term=1, valid_until=100 * MS)
    successor = lead("b", 30, 40, term=2)
    lost = ev("a/watch", "lost", "ok", 20, mode="lead", owner="A", token=1)
    report = check([*told, lost, *successor])
    assert report.ok, report.format()
    assert [h.ended_by for h in report.holds] == ["lost", "release"]
    assert check([*told, *successor]).kinds() == {"overlap"}
    # A report of another leadership (another term), or of nobody, ends nothing.
    other = ev("a/watch", "lost", "ok", 20, mode="lead", owner="A", token=7)
    nobody = ev("a", "lost", "ok", 20, mode="lead")
    assert check([*told, other, *successor]).kinds() == {"overlap"}
    assert check([*told, nobody, *successor]).kinds() == {"overlap"}


def test_a_new_leaders_term_must_be_larger_than_every_earlier_one() -> None:
    report = check([*lead("a", 1, 10, term=5), *lead("b", 12, 20, term=3)])
    assert report.kinds() == {"term-order"}
    detail = report.violations[0].detail
    assert "b (owner B, term 3)" in detail and "a (owner A, term 5)" in detail, detail
    # Equal is not larger.
    equal = [*lead("a", 1, 10, term=5), *lead("b", 12, 20, term=5)]
    assert check(equal).kinds() == {"term-order"}
    # Every earlier one, across processes: c's term is larger than b's, not than a's.
    report = check(
        [*lead("a", 1, 10, term=5), *lead("b", 12, 20, term=6), *lead("c", 22, 30, term=5)]
    )
    assert report.kinds() == {"term-order"} and "c (owner C, term 5)" in report.format()
    # The same process elected again is a new leader, with a new term.
    again = [*held("a", 1, 10, mode="lead", owner="A", token=5)]
    again += held("a", 12, 20, mode="lead", owner="A", token=5)
    assert check(again).kinds() == {"term-order"}
    # Grown in the order the holds began, whatever the order of the records' files.
    ok = [*lead("b", 12, 20, term=6), *lead("a", 1, 10, term=5), *lead("c", 22, 30, term=9)]
    assert check(ok).ok


def test_a_grant_recorded_after_its_validity_is_judged_only_as_an_earlier_one() -> None:
    # a was granted term 4, then paused before it recorded the grant: by then its
    # validity had ended (an empty hold at 30), and b had been granted term 5 meanwhile.
    late = ev("a", "acquire", "ok", 30, mode="lead", owner="A", token=4, valid_until=30 * MS)
    paused = [ev("a", "acquire", "invoke", 1, mode="lead"), late]
    assert check([*paused, *lead("b", 10, 20, term=5)]).ok
    # Still, a was granted before its record: a later leader needs a larger term.
    report = check([*paused, *lead("b", 10, 20, term=5), *lead("c", 40, 50, term=3)])
    assert report.kinds() == {"term-order"} and "c (owner C, term 3)" in report.format()


def test_a_deposed_leaders_write_accepted_after_a_later_leaders_is_stale() -> None:
    a = lead("a", 1, None, term=1, valid_until=10 * MS)
    b = lead("b", 12, 30, term=2)
    # (1) the resource accepted term 1 after it had accepted term 2
    report = check([*a, *b, *lead_write("b", 15, 2, True), *lead_write("a", 20, 1, True)])
    assert report.kinds() == {"stale-write"}
    assert "token 1" in report.violations[0].detail
    # (2) a, paused past its validity, wrote once b led (before b's first write)
    report = check([*a, *b, *lead_write("a", 14, 1, True), *lead_write("b", 20, 2, True)])
    assert report.kinds() == {"stale-write"}
    assert "ended at +9.500ms (validity)" in report.violations[0].detail
    # Refused, both are fine.
    refused = [*lead_write("b", 15, 2, True), *lead_write("a", 20, 1, False)]
    assert check([*a, *b, *refused]).ok


def test_a_valid_history_of_leaders_passes() -> None:
    events = [
        *lead("a", 1, 10, term=3),  # resigns
        *lead_write("a", 5, 3, True),
        *lead("b", 11, None, term=4, valid_until=40 * MS),  # killed: leads until 40
        *lead_write("b", 12, 4, True),
        *lead("c", 41, None, term=9, valid_until=90 * MS),  # told lost at 60
        ev("c/watch", "lost", "ok", 60, mode="lead", owner="C", token=9),
        *lead_write("c", 42, 9, True),
        *lead("d", 61, 70, term=10),
        *lead_write("d", 62, 10, True),
        *lead_write("c", 65, 9, False),  # c's late write: refused
        *lead("a", 71, 80, term=11),  # a leads again, with a new term
    ]
    report = check(events)
    assert report.ok, report.format()
    assert [h.ended_by for h in report.holds] == [
        "release",
        "validity",
        "lost",
        "release",
        "release",
    ]


# -- the soak's checks: token order, late losses, holds gone while valid ----------------------


def test_an_event_may_name_the_error_of_a_failure() -> None:
    e = ev("p1", "release", "fail", 3, owner="o", error="LockLostError")
    assert Event.from_json(e.to_json()) == e and e.error == "LockLostError"


def test_tokens_must_grow_in_the_order_exclusive_holds_began() -> None:
    events = [*held("a", 1, 10, owner="A", token=5), *held("b", 12, 20, owner="B", token=3)]
    assert check(events).ok  # off by default
    report = check(events, token_order=True)
    assert report.kinds() == {"token-order"}
    detail = report.violations[0].detail
    assert "[x] b (owner B, token 3)" in detail and "a (owner A, token 5)" in detail, detail
    # Per lock and family: a fair lock of the same name, or another name, counts apart.
    other = [*held("a", 1, 10, owner="A", token=5), *held("b", 12, 20, "M", owner="B", token=3)]
    assert check(other, token_order=True).ok
    fair = [*held("a", 1, 10, owner="A", token=5), *held("b", 12, 20, mode="fair", token=3)]
    assert check(fair, token_order=True).ok
    # The write side of a read/write lock is judged; readers have no token.
    writers = [*held("a", 1, 10, mode="w", owner="A", token=5)]
    writers += held("b", 12, 20, mode="w", owner="B", token=5)
    assert check(writers, token_order=True).kinds() == {"token-order"}
    # Grown in the order the holds began, whatever the order of the records' files.
    grown = [*held("b", 12, 20, owner="B", token=6), *held("a", 1, 10, owner="A", token=5)]
    assert check(grown, token_order=True).ok


def test_a_grant_recorded_after_its_validity_is_judged_for_token_order_as_an_earlier_one() -> None:
    late = ev("a", "acquire", "ok", 30, owner="A", token=4, valid_until=30 * MS)
    paused = [ev("a", "acquire", "invoke", 1), late]
    assert check([*paused, *held("b", 10, 20, owner="B", token=5)], token_order=True).ok
    report = check(
        [*paused, *held("b", 10, 20, owner="B", token=5), *held("c", 40, 50, owner="C", token=3)],
        token_order=True,
    )
    assert report.kinds() == {"token-order"} and "c (owner C, token 3)" in report.format()


def lost(client: str, ms: float, owner: str, token: int | None = None) -> Event:
    return ev(client, "lost", "ok", ms, owner=owner, token=token)


def test_a_loss_reported_after_the_validity_ended_is_late() -> None:
    hold = held("a", 1, None, owner="A", token=1, valid_until=100 * MS)
    assert check([*hold, lost("a/on-lost", 90, "A", 1)], late_losses=True).ok
    # Within the slack: the recording's own delay.
    assert check([*hold, lost("a/on-lost", 140, "A", 1)], late_losses=True).ok
    report = check([*hold, lost("a/on-lost", 160, "A", 1)], late_losses=True)
    assert report.kinds() == {"late-loss"}
    detail = report.violations[0].detail
    assert "60.000ms after its validity ended at +99.500ms" in detail, detail
    assert check([*hold, lost("a/on-lost", 160, "A", 1)]).ok  # off by default
    slack = check([*hold, lost("a", 160, "A", 1)], late_losses=True, loss_slack_ns=70 * MS)
    assert slack.ok


def test_a_renewal_moves_the_validity_a_loss_is_judged_by() -> None:
    hold = held("a", 1, None, owner="A", valid_until=100 * MS)
    renewed = ev("a", "renew", "ok", 60, owner="A", valid_until=200 * MS)
    assert check([*hold, renewed, lost("a", 190, "A")], late_losses=True).ok
    assert check([*hold, lost("a", 190, "A")], late_losses=True).kinds() == {"late-loss"}


def test_a_late_loss_is_matched_to_its_own_hold() -> None:
    # The owner's second hold (another token) is not the one told lost.
    first = held("a", 1, 50, owner="A", token=1, valid_until=100 * MS)
    second = held("a", 60, None, owner="A", token=2, valid_until=300 * MS)
    assert check([*first, *second, lost("a", 250, "A", 2)], late_losses=True).ok
    report = check([*first, *second, lost("a", 250, "A", 1)], late_losses=True)
    assert report.kinds() == {"late-loss"}
    # A report that names no owner is matched to nothing.
    assert check([*first, ev("a", "lost", "ok", 250)], late_losses=True).ok


def release_lost(client: str, ms: float, owner: str, error: str = "LockLostError") -> list[Event]:
    return [
        ev(client, "release", "invoke", ms - 1, owner=owner),
        ev(client, "release", "fail", ms, owner=owner, error=error),
    ]


def test_a_hold_its_own_release_finds_gone_while_valid_is_reported() -> None:
    hold = held("a", 1, None, owner="A", token=1, valid_until=100 * MS)
    report = check([*hold, *release_lost("a", 50, "A")])
    assert report.kinds() == {"gone-while-valid"}
    detail = report.violations[0].detail
    assert "a's release found a (owner A, token 1)" in detail and "50.000ms before" in detail
    # Found after the validity ended: the lease ran out, as it may.
    assert check([*hold, *release_lost("a", 101, "A")]).ok
    # Reported lost (before the release, or by a report still under way): told.
    assert check([*hold, lost("a/w", 40, "A", 1), *release_lost("a", 50, "A")]).ok
    assert check([*hold, *release_lost("a", 50, "A"), lost("a/w", 51, "A", 1)]).ok
    # Other failures, or a failure that names no error, are not judged.
    assert check([*hold, *release_lost("a", 50, "A", "QuorumUnavailableError")]).ok
    assert check([*hold, *release_lost("a", 50, "A", "")]).ok
    # A release of a hold recorded without a validity is not judged either.
    assert check([*held("a", 1, None, owner="A"), *release_lost("a", 50, "A")]).ok
