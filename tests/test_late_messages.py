"""Nothing sent for one try changes a hold that a later try made, however late it comes.

A request can reach a master long after it was sent: TCP retransmits it after a cut
heals, or a later request of the same owner overtakes it on another connection. Each
scenario here makes an acquire take two tries on five real masters (a rival holds the
lock on three of them, so the first try is granted by the other two only, and undone),
records everything the owner's manager sent, and, once the second try won, sends every
request of the first try again, on every master, as if it had come late: the grant,
its undo, whatever else. The hold must stand as it is, on every master that granted
it, and its release must find it there.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from helpers import drop_counters, run, wait_until

import redreentrant.asyncio as aio
from redreentrant import LockManager
from redreentrant._core.effects import Call, Fanout
from redreentrant._core.keys import tag
from redreentrant._core.packing import evalsha_args
from redreentrant.testing import LocalEnsemble

pytestmark = pytest.mark.integration

#: the scripts' first argument, or script name, that makes a try
TRIES = {"acquire", "rwlock", "fairlock", "semaphore", "multilock"}


def is_try(fanout: Fanout) -> bool:
    call = next((c for calls in fanout.calls for c in calls), None)
    if call is None:
        return False
    name = call.script.name
    return name == "acquire" or (name in TRIES and call.args[:1] == ("acquire",))


class Recorder:
    """Every round a manager sends, in order."""

    def __init__(self) -> None:
        self.rounds: list[Fanout] = []
        self.lock = threading.Lock()

    def note(self, fanout: Fanout) -> None:
        with self.lock:
            self.rounds.append(fanout)

    def undone(self) -> bool:
        """Whether a try was granted somewhere and undone (an undo round went out)."""
        with self.lock:
            return any(f.cleanup and not is_try(f) for f in self.rounds[1:])

    def before_the_last_try(self) -> list[Fanout]:
        with self.lock:
            last = max(i for i, f in enumerate(self.rounds) if is_try(f))
            return self.rounds[:last]


def record(mgr: Any) -> Recorder:
    """Record the rounds ``mgr`` (sync or asyncio) sends from now on."""
    recorder = Recorder()
    transport = mgr._transport
    send = transport.fanout

    def fanout(fanout: Fanout) -> Any:  # the result, or the asyncio transport's awaitable
        recorder.note(fanout)
        return send(fanout)

    transport.fanout = fanout
    return recorder


class Owner:
    """An object that owns holds (``owner=``): any thread may release them."""


def replay(urls: list[str], rounds: list[Fanout]) -> int:
    """Send every call of ``rounds`` again, in order, to every master it went to (as if
    each came late); the number of calls sent."""
    sent = 0
    for url_index, url in enumerate(urls):
        with redis.Redis.from_url(url) as r:
            for fanout in rounds:
                for call in fanout.calls[url_index]:
                    sent += 1
                    send(r, call)
    return sent


def send(r: redis.Redis, call: Call) -> None:
    r.script_load(call.script.source)
    # Refused, as a late request may be: what it changed (nothing) is checked.
    with contextlib.suppress(redis.ResponseError):
        r.execute_command(*evalsha_args(call))


def keep_only(urls: list[str], name: str, masters: range) -> None:
    """Delete every key of lock ``name`` on the masters not in ``masters`` (the rival
    then holds it there only)."""
    for i, url in enumerate(urls):
        if i not in masters:
            with redis.Redis.from_url(url) as r:
                keys = list(r.scan_iter(match=tag(name).replace("{", "[{]") + "*"))
                if keys:
                    r.delete(*keys)


#: keys of waiting owners' registrations: no hold. A master that refused the winning try
#: (the rival's release reached it after that try) keeps its registration there, and
#: a replayed undo of an earlier try may end it, which changes no hold.
WAITING = (b":waiters", b":reserved", b":writers", b":queue", b":deadlines", b":tickets")


def lock_state(urls: list[str], name: str) -> list[dict[bytes, Any]]:
    """Every key of lock ``name`` that holds it on each master, with its content (fencing
    counters left out: a replayed try may step them, which only makes later tokens
    greater; registrations of waiting owners left out, see WAITING)."""
    out = []
    for url in urls:
        with redis.Redis.from_url(url) as r:
            state: dict[bytes, Any] = {}
            for key in r.scan_iter(match=tag(name).replace("{", "[{]") + "*"):
                if key.endswith(WAITING):
                    continue
                kind = r.type(key)
                if kind == b"hash":
                    state[key] = r.hgetall(key)
                elif kind == b"zset":
                    state[key] = r.zrange(key, 0, -1)
            out.append(state)
    return out


#: per kind: the owner's lock, and the rival's (owned by an object: another thread
#: releases it), made from a manager, a name and an owner
Kinds = dict[str, tuple[Callable[[Any, str], Any], Callable[[Any, str, object], Any]]]

KINDS: Kinds = {
    "lock": (lambda m, n: m.lock(n), lambda m, n, o: m.lock(n, owner=o)),
    "rw write": (lambda m, n: m.rw_lock(n).write, lambda m, n, o: m.rw_lock(n, owner=o).write),
    "rw read": (lambda m, n: m.rw_lock(n).read, lambda m, n, o: m.rw_lock(n, owner=o).write),
    "rw upgradeable": (
        lambda m, n: m.rw_lock(n).upgradeable,
        lambda m, n, o: m.rw_lock(n, owner=o).write,
    ),
    "fair": (lambda m, n: m.fair_lock(n), lambda m, n, o: m.fair_lock(n, owner=o)),
    "semaphore": (lambda m, n: m.semaphore(n, 1), lambda m, n, o: m.semaphore(n, 1, owner=o)),
    "multi-lock": (lambda m, n: m.multi_lock([n, n + ":2"]), lambda m, n, o: m.lock(n, owner=o)),
}


def release_once(recorder: Recorder, release: Callable[[], object]) -> threading.Thread:
    """A thread that releases the rival's hold once a first try was undone."""

    def run() -> None:
        wait_until(recorder.undone, "a first try granted by masters 0 and 1, and undone", 20)
        release()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def urls(ensemble: LocalEnsemble) -> Iterator[list[str]]:
    yield ensemble.urls


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_earlier_tries_requests_coming_late_change_nothing(urls: list[str], kind: str) -> None:
    name = f"late-{kind.replace(' ', '-')}"
    ours, rivals = KINDS[kind]
    with LockManager(urls, lease=10.0) as mine, LockManager(urls, lease=10.0) as rival:
        lock, theirs = ours(mine, name), rivals(rival, name, Owner())
        assert theirs.acquire()
        keep_only(urls, name, range(2, 5))  # the rival holds masters 2, 3 and 4 only
        recorder = record(mine)
        helper = release_once(recorder, theirs.release)
        assert lock.acquire(timeout=20)
        helper.join(5)
        before = lock_state(urls, name)
        assert replay(urls, recorder.before_the_last_try()) > 0
        # Everything the first try sent, come late, changed nothing: the hold stands
        # where it was granted, and its release finds it there.
        assert lock_state(urls, name) == before
        # On every master, or on a quorum when the rival's release reached a master
        # after the winning try.
        assert sum(bool(state) for state in before) >= 3
        lock.release()


def test_an_election_campaigns_late_requests_change_nothing(
    urls: list[str], ensemble: LocalEnsemble
) -> None:
    name = "late-election"
    with LockManager(urls, lease=10.0) as mine, LockManager(urls, lease=10.0) as rival:
        leader = rival.election(name, owner=Owner()).campaign(b"rival")
        keep_only(urls, name, range(2, 5))
        recorder = record(mine)
        helper = release_once(recorder, leader.resign)
        election = mine.election(name).campaign(b"mine", timeout=20)
        helper.join(5)
        before = lock_state(urls, name)
        assert replay(urls, recorder.before_the_last_try()) > 0
        assert lock_state(urls, name) == before
        election.resign()
    drop_counters(ensemble)


def test_an_asyncio_owners_earlier_try_coming_late_changes_nothing(urls: list[str]) -> None:
    name = "late-asyncio"

    async def main() -> None:
        async with (
            aio.LockManager(urls, lease=10.0) as mine,
            aio.LockManager(urls, lease=10.0) as rival,
        ):
            theirs = rival.lock(name, owner=Owner())
            assert await theirs.acquire()
            keep_only(urls, name, range(2, 5))
            recorder = record(mine)

            async def release_once() -> None:
                while not recorder.undone():
                    await asyncio.sleep(0.01)
                await theirs.release()

            helper = asyncio.ensure_future(release_once())
            lock = mine.lock(name)
            assert await lock.acquire(timeout=20)
            await helper
            before = lock_state(urls, name)
            assert replay(urls, recorder.before_the_last_try()) > 0
            assert lock_state(urls, name) == before
            await lock.release()

    run(main())
