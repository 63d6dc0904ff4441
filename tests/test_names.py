"""Public introspection on real masters: ``mgr.names(pattern)`` lists the names held or
waited for, by family (sync and asyncio); ``mgr.ping()`` tells each master's health;
``mgr.owner_id(owner)`` names an ``owner=`` object as its holds carry it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from helpers import run, wait_until

import redreentrant.asyncio as ra
from redreentrant import LockManager, QuorumUnavailableError, parse_owner
from redreentrant.testing import LocalEnsemble


def test_names_lists_every_kind_held_or_waited_for(ensemble: LocalEnsemble) -> None:
    urls = ensemble.urls[:3]
    with LockManager(urls, lease=5.0, fencing=True) as mgr, LockManager(urls) as other:
        held = [
            mgr.lock("job:a"),
            mgr.rw_lock("job:b").read,
            mgr.fair_lock("job:c"),
            mgr.semaphore("job:d", permits=2),
            mgr.multi_lock(["job:e", "job:a}odd"]),
            mgr.lock("other"),
        ]
        for lock in held:
            assert lock.acquire()
        leader = mgr.election("job:f")
        leader.campaign("me")
        # A name that only has a waiter registered is listed too.
        blocker = mgr.lock("job:g")
        assert blocker.acquire()
        waiting = threading.Thread(target=lambda: other.lock("job:g").acquire(timeout=3))
        waiting.start()
        try:
            wait_until(lambda: "job:g" in mgr.names("job:g"), "the waiter listed")
            assert mgr.names("job:*") == {
                "job:a": ("lock",),
                "job:a}odd": ("lock",),
                "job:b": ("rw",),
                "job:c": ("fair",),
                "job:d": ("semaphore",),
                "job:e": ("lock",),
                "job:f": ("election",),
                "job:g": ("lock",),
            }
            assert list(mgr.names()) == sorted(mgr.names())  # name order
            assert "other" in mgr.names() and mgr.names("nothing*") == {}
            # One name, several families.
            with mgr.fair_lock("other"):
                assert mgr.names("other") == {"other": ("lock", "fair")}
        finally:
            blocker.release()
            waiting.join()
            leader.resign()
            for lock in held:
                lock.release()
        # Released: only the fencing counters are left, and they are not locks.
        assert mgr.names() == {}
    ensemble.flushall()


def test_names_needs_a_quorum_and_ping_tells_who_answers(ensemble: LocalEnsemble) -> None:
    urls = ensemble.urls[:3]
    with LockManager(urls) as mgr:
        lock = mgr.lock("seen")
        assert lock.acquire()
        answers = mgr.ping()
        assert all(isinstance(a, float) and 0 <= a < 1 for a in answers), answers
        ensemble[2].stop()
        assert mgr.names() == {"seen": ("lock",)}  # a quorum answers
        answers = mgr.ping()
        assert isinstance(answers[2], Exception) and isinstance(answers[0], float)
        lock.release()  # on the two masters that answer
        ensemble[1].stop()
        with pytest.raises(QuorumUnavailableError):
            mgr.names()
    with pytest.raises(TypeError):
        LockManager(urls).names(b"*")  # type: ignore[arg-type]


def test_asyncio_names_and_ping(ensemble: LocalEnsemble) -> None:
    async def main() -> tuple[dict[str, tuple[str, ...]], list[Any]]:
        async with (
            ra.LockManager(ensemble.urls) as mgr,
            mgr.lock("a"),
            mgr.semaphore("b", permits=3),
        ):
            return await mgr.names(), await mgr.ping()

    names, answers = run(main())
    assert names == {"a": ("lock",), "b": ("semaphore",)}
    assert len(answers) == 5 and all(isinstance(a, float) for a in answers)


def test_owner_id_of_an_object_is_what_its_holds_carry(ensemble: LocalEnsemble) -> None:
    class Job:
        pass

    job = Job()
    with LockManager(ensemble.urls[:1]) as mgr:
        lock = mgr.lock("owned", owner=job)
        assert lock.acquire()
        try:
            [view] = mgr.inspect("owned")[0].locks
            assert list(view.holders) == [mgr.owner_id(job)]
            info = parse_owner(mgr.owner_id(job))
            assert info is not None and info.kind == "object"
            assert mgr.owner_id() != mgr.owner_id(job)  # the calling thread's
            assert parse_owner(mgr.owner_id()).kind == "thread"  # type: ignore[union-attr]
        finally:
            lock.release()
