"""A hold handed off between owners (``lock.hand_off()`` and ``lock.take_over(ticket)``)
against real masters, one and five, sync and asyncio: the hold moves with its count
and fencing token, from one process to another too; a ticket is taken over once; a
ticket never taken over frees the lock within its lease; the new owner's watchdog
renews it."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator

import pytest
from helpers import PY, WORKERS, drop_counters, run, wait_until

import redreentrant.asyncio as aio
from redreentrant import LockLostError, LockManager, LockNotOwnedError
from redreentrant.testing import LocalEnsemble


class Owner:
    """An object that owns holds (``owner=``)."""


@pytest.fixture(autouse=True)
def _counters(ensemble: LocalEnsemble) -> Iterator[None]:
    """The fencing counters the tests leave (they outlive the locks by design)."""
    yield
    drop_counters(ensemble)


def test_a_hold_moves_with_its_count_and_token(masters: list[str]) -> None:
    with LockManager(masters, fencing=True) as a, LockManager(masters, lease=5.0) as b:
        sent, got = a.lock("moved"), b.lock("moved")
        sent.acquire()
        sent.acquire()  # count 2
        token = sent.token
        ticket = sent.hand_off()
        assert not sent.is_owned()
        with pytest.raises(LockNotOwnedError):
            sent.release()
        assert not b.lock("moved").acquire(blocking=False)  # still held: by the ticket
        got.take_over(ticket)
        assert (got.hold_count, got.token) == (2, token)
        assert not sent.acquire(blocking=False)  # the sender is another owner now
        got.release()
        assert got.locked()
        got.release()
        assert not got.locked()


def test_a_ticket_is_taken_over_once(masters: list[str]) -> None:
    with LockManager(masters) as a, LockManager(masters) as b:
        sent = a.lock("once")
        sent.acquire()
        ticket = sent.hand_off()
        first = b.lock("once")
        first.take_over(ticket)
        other = Owner()
        second = b.lock("once", owner=other)  # another owner, the same ticket
        with pytest.raises(LockLostError, match="the hold handed off is gone"):
            second.take_over(ticket)
        assert not second.is_owned()
        with pytest.raises(ValueError, match="held by this owner already"):
            first.take_over(ticket)
        first.release()
        assert not first.locked()
        with pytest.raises(LockLostError):  # released: gone too
            second.take_over(ticket)
        assert not first.locked()  # the failed take-over left nothing behind


def test_a_ticket_never_taken_over_frees_the_lock_within_its_lease(masters: list[str]) -> None:
    with LockManager(masters) as a:
        sent = a.lock("dropped")
        sent.acquire(lease=1.0)
        sent.hand_off()
        assert sent.locked()
        handed = time.monotonic()
        assert a.lock("dropped").acquire(timeout=5.0)
        assert time.monotonic() - handed < 1.0 + 0.5
        a.lock("dropped").release()


def test_a_hold_handed_off_by_a_process_that_ended_is_taken_over(masters: list[str]) -> None:
    out = subprocess.run(
        [PY, str(WORKERS), "hand-off", ",".join(masters), "crossed", "20"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    ticket = out.stdout.strip().splitlines()[-1]
    with LockManager(masters, lease=1.0) as mgr:
        lock = mgr.lock("crossed")
        assert lock.locked()  # the process ended; its hold did not
        lock.take_over(ticket)
        assert lock.token > 0
        time.sleep(2.5)  # over two leases: this manager's watchdog renews it
        lock.ensure_held()
        lock.release()
        assert not lock.locked()


def test_wrong_tickets_and_kinds_are_refused_changing_nothing(masters: list[str]) -> None:
    with LockManager(masters) as mgr:
        lock = mgr.lock("right")
        lock.acquire()
        ticket = lock.hand_off()
        with pytest.raises(ValueError, match="not for lock 'wrong'"):
            mgr.lock("wrong").take_over(ticket)
        with pytest.raises(ValueError, match="not a hand-off ticket"):
            lock.take_over("{}")
        with pytest.raises(ValueError, match="not a hand-off ticket"):
            lock.take_over("nonsense")
        lock.take_over(ticket)
        lock.release()
        rw = mgr.rw_lock("rw").write
        rw.acquire()
        with pytest.raises(ValueError, match="cannot be handed off"):
            rw.hand_off()
        assert rw.is_owned()
        rw.release()
        with pytest.raises(LockNotOwnedError):
            lock.hand_off()


def test_asyncio_takes_over_a_hold_handed_off_by_a_thread(masters: list[str]) -> None:
    with LockManager(masters, fencing=True) as sync_mgr:
        sent = sync_mgr.lock("twin")
        sent.acquire()
        token, ticket = sent.token, sent.hand_off()

    async def main() -> None:
        async with aio.LockManager(masters, lease=1.0) as mgr:
            lock = mgr.lock("twin")
            await lock.take_over(ticket)
            assert lock.token == token
            await asyncio.sleep(2.5)  # renewed by this manager's watchdog
            lock.ensure_held()
            again = await lock.hand_off()
            owner = Owner()
            other = mgr.lock("twin", owner=owner)
            await other.take_over(again)
            await other.release()
            assert not await other.locked()

    run(main())


def test_the_watchdog_of_the_sender_no_longer_renews(masters: list[str]) -> None:
    with LockManager(masters, lease=1.0) as mgr:
        lock = mgr.lock("left")
        lock.acquire()
        lock.hand_off()
        wait_until(lambda: not lock.locked(), "the hold's lease ends", limit=3.0)
