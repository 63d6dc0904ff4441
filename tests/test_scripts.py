"""The Lua scripts: versions pinned to their text, and their semantics on fakeredis."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import fakeredis
import pytest

from redreentrant._core import scripts
from redreentrant._core.keys import (
    HOME_PREFIX,
    home_channel,
    lock_key,
    reserved_key,
    waiters_key,
    wake_channel,
)

#: name -> (version, first 16 hex digits of the text's SHA-256). A script edit must bump
#: its version and then update this table; an edit without a bump fails the test below.
PINS: dict[str, tuple[int, str]] = {
    "acquire": (9, "bfd5605bca9c4c7a"),
    "release": (15, "6fc4429697ebf4ec"),
    "renew": (2, "4b4373812b601ec3"),
    "probe": (2, "b8f2fbe2e1a0c00a"),
    "rwlock": (6, "b11cc1b5a60c25ea"),
    "fairlock": (7, "0139c0ca038f81da"),
    "fence": (2, "86b825c3d1994952"),
    "fenced_write": (2, "51208ad8a45b1b4b"),
    "extend": (3, "a60d3d776416b2cf"),
    "semaphore": (4, "5e3504d222c6a10d"),
    "multilock": (3, "7902eea518c3d8a8"),
    "memory": (2, "b3627a0491e6c8ef"),
}


def test_every_script_is_pinned() -> None:
    on_disk = {p.stem for p in scripts.script_dir().glob("*.lua")}
    assert on_disk == set(PINS), "add new scripts to PINS (and remove deleted ones)"


@pytest.mark.parametrize("name", sorted(PINS))
def test_script_text_matches_its_version(name: str) -> None:
    script = scripts.load(name)
    digest = hashlib.sha256(script.source.encode()).hexdigest()[:16]
    version, pinned = PINS[name]
    if script.version == version:
        assert digest == pinned, (
            f"lua/{name}.lua changed but its version is still {version}: bump the version"
        )
    else:
        pytest.fail(f"lua/{name}.lua is now version {script.version}: pin it as {digest!r}")


def test_header_is_required() -> None:
    with pytest.raises(RuntimeError, match="header"):
        scripts.parse("return 1\n", "nameless")


@pytest.fixture
def r() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def run(r: fakeredis.FakeRedis, script: scripts.Script, keys: list[str], *args: object) -> object:
    return r.eval(script.source, len(keys), *keys, *args)


KEY = lock_key("job")
WAITERS = waiters_key("job")
CHANNEL = wake_channel("job")
RESERVED = reserved_key("job")
KEYS = [KEY, WAITERS, RESERVED]


def timed(reply: object) -> list[Any]:
    """A reply less the server's time (ms) that ends it (a try's: first in its stamp),
    checked to be there."""
    assert isinstance(reply, list), reply
    stamp = reply[-1]
    time = stamp[0] if isinstance(stamp, list) else stamp
    assert isinstance(time, int) and time > 1e12, reply
    return reply[:-1]


def acquire(
    r: fakeredis.FakeRedis,
    owner: str,
    count: int | str = 1,
    wait: int = 0,
    polite: int = 0,
    place: int = 0,
) -> object:
    extra = [polite, place] if place else [polite] if polite else []
    return timed(run(r, scripts.ACQUIRE, KEYS, owner, 5000, count, wait, *extra))


def release(
    r: fakeredis.FakeRedis,
    owner: str,
    left: int | str,
    rid: str,
    leave: str = "1",
    handover: int | str = 0,
    defer: str = "0",
    reserve: int = 0,
) -> object:
    args = (owner, left, CHANNEL, rid, HOME_PREFIX, leave, handover, defer, reserve)
    return run(r, scripts.RELEASE, KEYS, "release", *args)


def home(r: fakeredis.FakeRedis, manager: str) -> Any:
    """A pub/sub connection that hears ``manager``'s home channel."""
    pubsub = r.pubsub()
    pubsub.subscribe(home_channel(manager))
    pubsub.get_message(timeout=0.1)
    return pubsub


def test_acquire_takes_a_free_lock_with_a_ttl(r: fakeredis.FakeRedis) -> None:
    assert acquire(r, "a") == [1, 1]
    assert r.hgetall(KEY) == {b"a": b"1"}
    assert 0 < r.pttl(KEY) <= 5000


def test_acquire_refuses_another_owner_with_the_holders_ttl(r: fakeredis.FakeRedis) -> None:
    acquire(r, "a")
    status, ttl = acquire(r, "b")  # type: ignore[misc]
    assert status == 0 and 0 < ttl <= 5000
    assert r.hgetall(KEY) == {b"a": b"1"}
    assert not r.exists(WAITERS)  # not asked to register


def test_a_refused_waiter_registers_until_its_wait_ends_or_its_final_release(
    r: fakeredis.FakeRedis,
) -> None:
    acquire(r, "m:a")
    assert acquire(r, "m:b", wait=3000)[0] == 0  # type: ignore[index]
    assert acquire(r, "m:c", wait=1000)[0] == 0  # type: ignore[index]
    assert r.zrange(WAITERS, 0, -1) == [b"m:c", b"m:b"]  # the registration ending first
    assert 1000 < r.pttl(WAITERS) <= 3000  # the key lives as long as its last waiter
    assert acquire(r, "m:a", count=2, wait=3000) == [1, 2]  # a re-entry never registers
    r.delete(KEY)
    assert acquire(r, "m:b", wait=3000) == [1, 1]
    # The registration stays while it holds (an undo keeps its place): the final
    # release ends it.
    assert r.zrange(WAITERS, 0, -1) == [b"m:c", b"m:b"]
    assert release(r, "m:b", 0, "r1")[0] == 0  # type: ignore[index]
    assert b"m:b" not in r.zrange(WAITERS, 0, -1)


def test_reentry_records_the_count_and_never_recreates_a_lost_hold(
    r: fakeredis.FakeRedis,
) -> None:
    acquire(r, "a")
    assert timed(run(r, scripts.ACQUIRE, KEYS, "a", 9000, 2, 0)) == [1, 2]
    assert r.hget(KEY, "a") == b"2" and r.pttl(KEY) > 5000
    r.delete(KEY)
    assert acquire(r, "a", count=3, wait=5000) == [0, -2]
    assert not r.exists(KEY) and not r.exists(WAITERS)


def test_release_sets_the_count_and_frees_at_zero_waking_one_waiter_by_name(
    r: fakeredis.FakeRedis,
) -> None:
    hub1, hub2 = home(r, "m1"), home(r, "m2")
    acquire(r, "m0:a")
    acquire(r, "m0:a", count=2)
    acquire(r, "m1:b", wait=3000)
    acquire(r, "m2:c", wait=4000)
    assert release(r, "m0:a", 1, "r1") == [1, b""]
    assert r.hget(KEY, "m0:a") == b"1"
    assert hub1.get_message(timeout=0.05) is None  # not freed yet: no wake-up
    assert release(r, "m0:a", 0, "r2") == [0, b"m1:b", 0, 0]
    assert not r.exists(KEY)
    message = hub1.get_message(timeout=1)
    assert message is not None and message["channel"] == home_channel("m1").encode()
    # The release id (one release, however many masters), the waiter and its lock.
    assert message["data"] == b"r2\nm1:b\n" + CHANNEL.encode()
    assert hub2.get_message(timeout=0.05) is None  # one waiter woken, not every one
    assert r.zrange(WAITERS, 0, -1) == [b"m1:b", b"m2:c"]  # b's place: until it takes it


def test_a_waiter_whose_manager_hears_nothing_is_skipped(r: fakeredis.FakeRedis) -> None:
    hub2 = home(r, "m2")
    acquire(r, "m0:a")
    acquire(r, "dead:b", wait=3000)  # nobody subscribes to its home channel
    acquire(r, "m2:c", wait=4000)
    assert release(r, "m0:a", 0, "r1") == [0, b"m2:c", 0, 0]
    message = hub2.get_message(timeout=1)
    assert message is not None and message["data"].startswith(b"r1\nm2:c\n")
    assert not r.exists(KEY) and r.zrange(WAITERS, 0, -1) == [b"m2:c"]  # b dropped


def test_a_woken_waiter_that_loses_the_race_keeps_its_place_and_is_woken_again(
    r: fakeredis.FakeRedis,
) -> None:
    hub1, hub2 = home(r, "m1"), home(r, "m2")
    acquire(r, "m0:a")
    acquire(r, "m1:b", wait=1000)  # first in line
    acquire(r, "m2:c", wait=2000)
    assert release(r, "m0:a", 0, "r1") == [0, b"m1:b", 0, 0]
    # Before b comes, the lock is taken again (as by the releasing owner, or in a split
    # vote on several masters): b is refused and tries again, still waiting.
    assert acquire(r, "m0:a") == [1, 1]
    assert acquire(r, "m1:b", wait=3000)[0] == 0
    assert r.zrange(WAITERS, 0, -1) == [b"m1:b", b"m2:c"]  # b kept its place
    assert release(r, "m0:a", 0, "r2") == [0, b"m1:b", 0, 0]  # b again, not c
    assert hub2.get_message(timeout=0.05) is None
    assert acquire(r, "m1:b", wait=3000) == [1, 1]
    assert release(r, "m1:b", 0, "r3")[1] == b"m2:c"  # its release ends its place
    hub1.close()
    hub2.close()


def test_a_woken_waiter_that_never_comes_holds_up_the_others_for_a_second_at_most(
    r: fakeredis.FakeRedis,
) -> None:
    hub2, hub3 = home(r, "m2"), home(r, "m3")  # b's process is frozen: hears, never comes
    acquire(r, "m1:a")
    acquire(r, "m2:b", wait=30000)
    acquire(r, "m3:c", wait=40000)
    seconds, micros = r.time()
    now = seconds * 1000 + micros // 1000
    assert release(r, "m1:a", 0, "r1") == [0, b"m2:b", 0, 0]
    # Woken, b keeps its place, but its registration now ends within a second.
    keep = r.zscore(WAITERS, "m2:b")
    assert keep is not None and now < keep <= now + 1000 + 50
    acquire(r, "m1:a")
    assert release(r, "m1:a", 0, "r2") == [0, b"m2:b", 0, 0]  # woken again: first still
    assert r.zscore(WAITERS, "m2:b") == keep  # a second wake-up does not extend it
    r.zadd(WAITERS, {"m2:b": now - 1})  # as when that second has passed
    acquire(r, "m1:a")
    assert release(r, "m1:a", 0, "r3") == [0, b"m3:c", 0, 0]  # b's place is gone
    assert r.zrange(WAITERS, 0, -1) == [b"m3:c"]
    assert hub3.get_message(timeout=1) is not None
    hub2.close()
    hub3.close()


def test_a_release_with_a_hand_over_grants_the_lock_to_its_own_managers_waiter(
    r: fakeredis.FakeRedis,
) -> None:
    hub1 = home(r, "m1")
    acquire(r, "m1:a")
    acquire(r, "dead:x", wait=2000)  # its manager hears nothing: skipped, not granted
    acquire(r, "m1:b", wait=3000)
    acquire(r, "m1:c", wait=4000)
    assert release(r, "m1:a", 0, "r1", handover="7000:9") == [0, b"m1:b", 7000, 0]
    # Granted to b as a first hold, with the lease and the tag handed over; its wait is
    # over.
    assert r.hgetall(KEY) == {b"m1:b": b"1:9"} and 5000 < r.pttl(KEY) <= 7000
    assert r.zrange(WAITERS, 0, -1) == [b"m1:c"]
    # Nothing published: the releasing manager reads the reply and tells b itself.
    assert hub1.get_message(timeout=0.05) is None
    # The releasing owner coming back is refused (and registers behind c).
    assert acquire(r, "m1:a", wait=5000)[0] == 0  # type: ignore[index]
    # b holds it as its own: its next try (a later tag) is a grant, and so is its
    # release; a try of b's that was sent before the hand-over changes nothing.
    assert acquire(r, "m1:b", "1:8", wait=3000)[0] == 0  # type: ignore[index]
    assert acquire(r, "m1:b", "1:10", wait=3000) == [1, 1]
    assert release(r, "m1:b", "0:10", "r2", handover="7000:11") == [0, b"m1:c", 7000, 0]
    assert r.hgetall(KEY) == {b"m1:c": b"1:11"}


def test_a_hand_over_only_wakes_a_waiter_of_another_manager(r: fakeredis.FakeRedis) -> None:
    hub2 = home(r, "m2")
    acquire(r, "m1:a")
    acquire(r, "m2:b", wait=3000)
    assert release(r, "m1:a", 0, "r1", handover=7000) == [0, b"m2:b", 0, 0]
    assert not r.exists(KEY)  # free: b tries, as may anyone
    message = hub2.get_message(timeout=1)
    assert message is not None and message["data"] == b"r1\nm2:b\n" + CHANNEL.encode()


def test_a_hand_over_with_nobody_waiting_frees_the_lock(r: fakeredis.FakeRedis) -> None:
    acquire(r, "m0:a")
    assert release(r, "m0:a", 0, "r1", handover=7000) == [0, b"", 0, 0]
    assert not r.exists(KEY) and not r.exists(WAITERS)


def test_a_deferred_release_frees_the_lock_but_wakes_nobody_of_another_manager(
    r: fakeredis.FakeRedis,
) -> None:
    hub2 = home(r, "m2")
    acquire(r, "m1:a")
    acquire(r, "m2:b", wait=3000)
    reply = release(r, "m1:a", 0, "r1", handover=7000, defer="1", reserve=5000)
    assert reply == [0, b"", 0, 1]  # deferred: the releasing manager wakes b later
    assert not r.exists(KEY) and not r.exists(RESERVED)
    assert r.zrange(WAITERS, 0, -1) == [b"m2:b"]  # b keeps its place
    assert hub2.get_message(timeout=0.05) is None
    assert acquire(r, "m1:a") == [1, 1]  # the releasing manager's turn goes on


def test_a_deferred_release_hands_nothing_over_to_its_own_managers_waiter_either(
    r: fakeredis.FakeRedis,
) -> None:
    acquire(r, "m1:a")
    acquire(r, "m1:b", wait=3000)
    reply = release(r, "m1:a", 0, "r1", handover=7000, defer="1", reserve=5000)
    assert reply == [0, b"", 0, 1]
    assert not r.exists(KEY) and r.zrange(WAITERS, 0, -1) == [b"m1:b"]
    # Once the turn is over, the release hands it over as before.
    acquire(r, "m1:a")
    assert release(r, "m1:a", 0, "r2", handover=7000, reserve=5000) == [0, b"m1:b", 7000, 0]


def test_a_woken_waiter_of_another_manager_has_the_lock_reserved_until_it_takes_it(
    r: fakeredis.FakeRedis,
) -> None:
    hub2 = home(r, "m2")
    acquire(r, "m1:a")
    acquire(r, "m2:b", wait=3000)
    assert release(r, "m1:a", 0, "r1", handover=7000, reserve=5000) == [0, b"m2:b", 0, 0]
    assert hub2.get_message(timeout=1) is not None
    assert r.get(RESERVED) == b"m2:b" and 0 < r.pttl(RESERVED) <= 5000
    # The releasing owner coming back, and a newcomer, are refused: the TTL they are
    # told is the reservation's, and the one asking to wait registers.
    status, ttl = acquire(r, "m1:a", wait=3000)  # type: ignore[misc]
    assert status == 0 and 0 < ttl <= 5000
    assert acquire(r, "m3:x")[0] == 0  # type: ignore[index]
    assert r.zrange(WAITERS, 0, -1) == [b"m2:b", b"m1:a"]
    assert acquire(r, "m2:b") == [1, 1]  # the woken waiter takes it
    assert not r.exists(RESERVED) and r.zrange(WAITERS, 0, -1) == [b"m2:b", b"m1:a"]


def test_a_polite_acquire_lets_a_registered_waiter_go_first_for_a_while_at_most(
    r: fakeredis.FakeRedis,
) -> None:
    hub2 = home(r, "m2")
    acquire(r, "m1:a")
    acquire(r, "m2:b", wait=30000)
    assert release(r, "m1:a", 0, "r1") == [0, b"m2:b", 0, 0]  # several masters: no reservation
    # The releasing owner's polite try: refused although the lock is free, told at most
    # the courtesy, and registered behind the woken waiter.
    status, ttl = acquire(r, "m1:a", wait=30000, polite=50)  # type: ignore[misc]
    assert status == 0 and 0 < ttl <= 50
    assert not r.exists(KEY) and r.zrange(WAITERS, 0, -1) == [b"m2:b", b"m1:a"]
    # A plain try is not polite: anyone else may still take a free lock.
    assert acquire(r, "m3:c") == [1, 1]
    r.delete(KEY)
    assert acquire(r, "m2:b") == [1, 1]  # the woken waiter
    r.delete(KEY)
    r.zrem(WAITERS, "m1:a", "m2:b")
    # With nobody else registered (its own place does not count), a polite try takes it.
    assert acquire(r, "m3:c") == [1, 1]
    assert acquire(r, "m4:d", wait=30000)[0] == 0  # type: ignore[index]
    r.delete(KEY)
    assert r.zrange(WAITERS, 0, -1) == [b"m4:d"]
    assert acquire(r, "m4:d", polite=50) == [1, 1]
    assert r.zrange(WAITERS, 0, -1) == [b"m4:d"]  # until its final release
    hub2.close()


def test_a_try_granted_then_undone_keeps_its_place_and_its_undo_wakes_nobody(
    r: fakeredis.FakeRedis,
) -> None:
    # A split vote on several masters: a waiter's try is granted on some masters, not
    # by a quorum, and undone there. It must keep its place on every master (else the
    # masters' queues differ, and later releases wake different waiters, which split
    # again), and its undo must not wake another contender into the split.
    hub1, hub2 = home(r, "m1"), home(r, "m2")
    acquire(r, "m0:h")
    acquire(r, "m1:a", wait=30000)
    acquire(r, "m2:b", wait=30000)
    r.delete(KEY)  # free on this master (as the holder's lease ended here)
    assert acquire(r, "m1:a", wait=30000) == [1, 1]
    assert release(r, "m1:a", 0, "r1", leave="0") == [0, b"", 0, 0]  # the undo
    assert r.zrange(WAITERS, 0, -1) == [b"m1:a", b"m2:b"]
    assert hub1.get_message(timeout=0.05) is None and hub2.get_message(timeout=0.05) is None
    hub1.close()
    hub2.close()


def test_waiters_that_reach_the_masters_in_either_order_are_ordered_alike_by_their_places() -> None:
    # Two waiters' tries, sent at about the same time, reach two masters in opposite
    # orders. Registered by each master's own clock, they would be queued differently,
    # and a release on each would wake a different one first (a split vote). The place
    # each proposes (the same in every try, on every master) orders them alike.
    one, two = (fakeredis.FakeRedis(server=fakeredis.FakeServer()) for _ in range(2))
    now = int(time.time() * 1000)
    a, b = now + 30_000, now + 29_990  # b's acquire began first
    for master in (one, two):
        acquire(master, "m0:h")
    acquire(one, "m1:a", wait=30_000, place=a)
    acquire(one, "m2:b", wait=30_000, place=b)
    acquire(two, "m2:b", wait=30_000, place=b)
    acquire(two, "m1:a", wait=30_000, place=a)
    assert one.zrange(WAITERS, 0, -1) == two.zrange(WAITERS, 0, -1) == [b"m2:b", b"m1:a"]
    assert [int(s) for _, s in one.zrange(WAITERS, 0, -1, withscores=True)] == [b, a]


def test_an_implausible_place_is_ignored_for_the_masters_own_clock(
    r: fakeredis.FakeRedis,
) -> None:
    # A client whose clock is far off proposes a place in the past (it would be purged
    # at once) or far beyond its wait (a dead waiter's place would outlive it): the
    # master registers it by its own clock instead.
    acquire(r, "m0:h")
    before = int(time.time() * 1000)
    acquire(r, "m1:a", wait=3000, place=before - 10)
    acquire(r, "m2:b", wait=3000, place=before + 3000 + 60_000)
    after = int(time.time() * 1000)
    for _, score in r.zrange(WAITERS, 0, -1, withscores=True):
        assert before + 3000 <= score <= after + 3000


def test_a_reservation_ends_by_itself(r: fakeredis.FakeRedis) -> None:
    hub2 = home(r, "m2")  # kept: b's manager hears its wake-up
    acquire(r, "m1:a")
    acquire(r, "m2:b", wait=3000)
    release(r, "m1:a", 0, "r1", handover=7000, reserve=30)
    assert r.get(RESERVED) == b"m2:b" and hub2.get_message(timeout=1) is not None
    time.sleep(0.1)  # b never came
    assert acquire(r, "m1:a") == [1, 1]


def test_wake_sends_a_deferred_wake_up_only_where_the_lock_is_free(
    r: fakeredis.FakeRedis,
) -> None:
    hub2 = home(r, "m2")
    acquire(r, "m1:a")
    acquire(r, "m2:b", wait=3000)
    wake = ("wake", CHANNEL, "r2", HOME_PREFIX, 5000)
    assert run(r, scripts.RELEASE, KEYS, *wake) == [0, b""]  # held: its release wakes
    assert hub2.get_message(timeout=0.05) is None
    assert release(r, "m1:a", 0, "r1", handover=7000, defer="1", reserve=5000)[3] == 1  # type: ignore[index]
    assert run(r, scripts.RELEASE, KEYS, *wake) == [0, b"m2:b"]
    message = hub2.get_message(timeout=1)
    assert message is not None and message["data"].startswith(b"r2\nm2:b\n")
    assert r.get(RESERVED) == b"m2:b" and r.zrange(WAITERS, 0, -1) == [b"m2:b"]


def test_a_reserved_waiter_giving_up_ends_its_reservation_and_wakes_the_next(
    r: fakeredis.FakeRedis,
) -> None:
    hub2, hub3 = home(r, "m2"), home(r, "m3")
    acquire(r, "m1:a")
    acquire(r, "m2:b", wait=3000)
    acquire(r, "m3:c", wait=4000)
    release(r, "m1:a", 0, "r1", handover=7000, reserve=5000)
    assert r.get(RESERVED) == b"m2:b" and hub2.get_message(timeout=1) is not None
    reply = run(r, scripts.RELEASE, KEYS, "abandon", "m2:b", CHANNEL, "r2", HOME_PREFIX)
    assert reply == [0, b"m3:c"]
    assert not r.exists(RESERVED)  # c was woken without one: anyone may take it
    message = hub3.get_message(timeout=1)
    assert message is not None and message["data"].startswith(b"r2\nm3:c\n")


def test_abandon_takes_back_a_lock_handed_over_to_the_waiter_giving_up(
    r: fakeredis.FakeRedis,
) -> None:
    hub2 = home(r, "m2")
    acquire(r, "m1:a")
    acquire(r, "m1:b", wait=3000)
    acquire(r, "m2:c", wait=4000)
    assert release(r, "m1:a", 0, "r1", handover=7000)[2] == 7000  # type: ignore[index]
    # b gave up meanwhile: its abandon frees the lock and wakes c.
    reply = run(r, scripts.RELEASE, KEYS, "abandon", "m1:b", CHANNEL, "r2", HOME_PREFIX)
    assert reply == [0, b"m2:c"]
    assert not r.exists(KEY)
    message = hub2.get_message(timeout=1)
    assert message is not None and message["data"].startswith(b"r2\nm2:c\n")


def test_release_by_a_non_owner_changes_nothing(r: fakeredis.FakeRedis) -> None:
    acquire(r, "a")
    acquire(r, "m:b", wait=3000)
    assert release(r, "m:b", 0, "r3", leave="0") == [-1, b""]  # an undo keeps its place
    assert r.hgetall(KEY) == {b"a": b"1"} and r.zrange(WAITERS, 0, -1) == [b"m:b"]
    assert release(r, "m:b", 0, "r4") == [-1, b""]  # a final release ends it
    assert r.hgetall(KEY) == {b"a": b"1"} and not r.exists(WAITERS)


def test_abandon_ends_a_wait_and_passes_a_wake_up_on_where_the_lock_is_free(
    r: fakeredis.FakeRedis,
) -> None:
    hub2 = home(r, "m2")
    acquire(r, "m0:a")
    acquire(r, "m1:b", wait=3000)
    acquire(r, "m2:c", wait=4000)
    abandon = ("abandon", "m1:b", CHANNEL, "r5", HOME_PREFIX)
    assert run(r, scripts.RELEASE, KEYS, *abandon) == [0, b""]  # held: nobody to wake
    assert r.zrange(WAITERS, 0, -1) == [b"m2:c"]
    acquire(r, "m1:b", wait=3000)
    r.delete(KEY)  # the holder's lease ran out: nobody was told
    assert run(r, scripts.RELEASE, KEYS, *abandon) == [0, b"m2:c"]
    message = hub2.get_message(timeout=1)
    assert message is not None and message["data"].startswith(b"r5\nm2:c\n")
    assert r.zrange(WAITERS, 0, -1) == [b"m2:c"]  # until c takes the lock or gives up


def test_renew_resets_ttls_only_where_the_owner_holds(r: fakeredis.FakeRedis) -> None:
    other = lock_key("other")
    run(r, scripts.ACQUIRE, KEYS, "a", 1000, 1, 0)
    run(r, scripts.ACQUIRE, [other, waiters_key("other"), reserved_key("other")], "b", 1000, 1, 0)
    r.set(lock_key("string"), "x")
    keys = [KEY, other, lock_key("string")]
    reply = run(r, scripts.RENEW, keys, 60000, "a", "0:0", "a", "0:0", "a", "0:0")
    assert timed(reply) == [1, 0, 0]
    assert r.pttl(KEY) > 1000 and r.pttl(other) <= 1000


def test_force_unlock_deletes_a_lock_wakes_a_waiter_but_refuses_other_data(
    r: fakeredis.FakeRedis,
) -> None:
    hub1 = home(r, "m1")
    force = ("force", CHANNEL, "f", HOME_PREFIX)
    acquire(r, "a")
    acquire(r, "m1:b", wait=3000)
    assert run(r, scripts.RELEASE, KEYS, *force) == [1, b"m1:b"]
    message = hub1.get_message(timeout=1)
    assert message is not None and message["data"].startswith(b"f\nm1:b\n")
    assert run(r, scripts.RELEASE, KEYS, *force) == [0, b""]
    r.set(KEY, "not a lock")
    with pytest.raises(Exception, match="WRONGTYPE"):
        run(r, scripts.RELEASE, KEYS, *force)
    assert r.get(KEY) == b"not a lock"


def test_probe_reads_without_changing(r: fakeredis.FakeRedis) -> None:
    assert run(r, scripts.PROBE, [KEY, WAITERS]) == [-2, [], []]
    acquire(r, "a")
    acquire(r, "a", count=3)
    acquire(r, "m:b", wait=3000)
    acquire(r, "m:c", wait=2000)
    r.zadd(WAITERS, {"m:gone": 1})  # a registration that ended long ago
    ttl, fields, waiting = run(r, scripts.PROBE, [KEY, WAITERS])  # type: ignore[misc]
    assert 0 < ttl <= 5000 and fields == [b"a", b"3"]
    assert waiting == [b"m:c", b"m:b"]  # live registrations, the one ending first first
    assert r.zcard(WAITERS) == 3  # nothing purged: a probe changes nothing
    _, same, none = run(r, scripts.PROBE, [KEY])  # type: ignore[misc]
    assert same == fields and none == []  # no waiters' key given: none read


# -- tags: nothing sent for one try changes a hold a later try made ------------------------


def test_a_later_try_takes_over_an_earlier_ones_hold_and_an_earlier_one_changes_nothing(
    r: fakeredis.FakeRedis,
) -> None:
    assert acquire(r, "m:a", "1:5") == [1, 1]
    assert acquire(r, "m:a", "1:7") == [1, 1]  # the owner's hold of tag 5: taken over
    assert r.hgetall(KEY) == {b"m:a": b"1:7"}
    # The try of tag 5 (or 6), come late: refused, and registers nothing.
    assert acquire(r, "m:a", "1:6", wait=3000)[0] == 0  # type: ignore[index]
    assert r.hgetall(KEY) == {b"m:a": b"1:7"} and not r.exists(WAITERS)
    # A re-entry changes the hold of its own tag only.
    assert acquire(r, "m:a", "2:5")[0] == 0  # type: ignore[index]
    assert acquire(r, "m:a", "2:7") == [1, 2]
    assert r.hgetall(KEY) == {b"m:a": b"2:7"}


def test_a_release_frees_its_own_hold_or_an_earlier_one_never_a_later_one(
    r: fakeredis.FakeRedis,
) -> None:
    acquire(r, "m:a", "1:7")
    acquire(r, "m:a", "2:7")
    # An undo of the try of tag 5, or a release of the hold of tag 6, come late.
    assert release(r, "m:a", "0:5", "r1", leave="0") == [-1, b""]
    assert release(r, "m:a", "0:6", "r2") == [-1, b""]
    assert release(r, "m:a", "1:6", "r3") == [-1, b""]  # a count: the same tag only
    assert r.hgetall(KEY) == {b"m:a": b"2:7"}
    assert release(r, "m:a", "1:7", "r4") == [1, b""]
    assert r.hgetall(KEY) == {b"m:a": b"1:7"}
    # A later try's undo (or the give-up of a later acquire) frees an earlier hold.
    assert release(r, "m:a", "0:8", "r5", leave="0") == [0, b"", 0, 0]
    assert not r.exists(KEY)


def test_abandon_takes_back_only_holds_of_its_tag_or_an_earlier_one(
    r: fakeredis.FakeRedis,
) -> None:
    abandon = ("abandon", "m:a", CHANNEL, "r1", HOME_PREFIX)
    acquire(r, "m:a", "1:9")
    assert run(r, scripts.RELEASE, KEYS, *abandon, 8) == [0, b""]
    assert r.hgetall(KEY) == {b"m:a": b"1:9"}  # an acquire's give-up, come late
    assert run(r, scripts.RELEASE, KEYS, *abandon, 9) == [0, b""]
    assert not r.exists(KEY)


def test_renew_takes_a_hold_again_where_the_lock_is_free(r: fakeredis.FakeRedis) -> None:
    other, gone, mine = (lock_key(n) for n in ("other", "gone", "mine"))
    acquire(r, "m:a", "1:3")  # KEY: held by the owner, tag 3
    run(r, scripts.ACQUIRE, [other, waiters_key("other"), RESERVED], "m:b", 9000, "1:1", 0)
    run(r, scripts.ACQUIRE, [mine, waiters_key("mine"), RESERVED], "m:a", 9000, "1:2", 0)
    keys = [KEY, other, gone, mine, lock_key("only-renewed")]
    args = ["m:a", "2:3", "m:a", "1:3", "m:a", "1:3", "m:a", "1:3", "m:a", "0:3"]
    # Renewed (its tag); another's (not taken); free (taken again, with the hold given);
    # the owner's own hold of an earlier tag, alone (taken over); count 0: renew only.
    assert timed(run(r, scripts.RENEW, keys, 60000, *args)) == [1, 0, 2, 2, 0]
    assert r.hgetall(gone) == {b"m:a": b"1:3"} and r.pttl(gone) > 50000
    assert r.hgetall(mine) == {b"m:a": b"1:3"}
    assert r.hgetall(other) == {b"m:b": b"1:1"} and r.pttl(other) <= 9000
    assert not r.exists(lock_key("only-renewed"))


def test_every_kinds_renewal_takes_its_hold_again_where_the_lock_is_free(
    r: fakeredis.FakeRedis,
) -> None:
    from redreentrant._core.kinds import (
        ELECTION,
        FAIR,
        READ,
        WRITE,
        multi_kind,
        semaphore_kind,
    )

    owner = "m:a"
    renewals = {
        "fair": FAIR.renew([("f", owner, "1:4")], 60000),
        "election": ELECTION.renew([("e", owner, "1:4")], 60000),
        "read": READ.renew([("rw", owner, "1:4")], 60000),
        "write": WRITE.renew([("rw2", owner, "1:4")], 60000),
        "permit": semaphore_kind(2, 1).renew([("s", owner, "1:4")], 60000),
        "multi": multi_kind(("m1", "m2")).renew([("m", owner, "1:4")], 60000),
    }
    for kind, call in renewals.items():
        reply = timed(r.eval(call.script.source, len(call.keys), *call.keys, *call.args))
        assert reply == [2], kind  # free: taken again
        reply = timed(r.eval(call.script.source, len(call.keys), *call.keys, *call.args))
        assert reply == [1], kind  # now renewed
    # What each took is the owner's hold, as that kind keeps it.
    assert r.hgetall(FAIR.key("f")) == {b"m:a": b"1:4"}
    assert r.hget(READ.key("rw"), "r:m:a") == b"1:4"
    assert r.hget(WRITE.key("rw2"), "writer") == b"m:a"
    assert r.hgetall(semaphore_kind(2, 1).key("s")) == {b"m:a": b"1:4"}
    assert r.hgetall(lock_key("m1")) == r.hgetall(lock_key("m2")) == {b"m:a": b"1:4"}


def test_the_last_upgradeable_release_frees_an_upgrade_granted_without_it_of_that_tag(
    r: fakeredis.FakeRedis,
) -> None:
    rw = scripts.load("rwlock")
    keys = ["{n}:rw", "{n}:rw:leases", "{n}:rw:writers"]
    # A master that refused the upgradeable hold (tag 1, another owner's then) and
    # granted its upgrade (tag 2) as a plain write once that owner had left.
    assert run(r, rw, keys, "acquire", "w", "o", 60000, "1:2", 0)[0] == 1  # type: ignore[index]

    def release(*upgrade: int) -> object:
        return run(r, rw, keys, "release", "u", "o", "0:1", "r", "w", "id", "1", "u", *upgrade)

    assert release() == -1 and r.hget(keys[0], "w:o") == b"1:2"  # the upgrade not named
    assert release(1) == -1 and r.hget(keys[0], "w:o") == b"1:2"  # a later write hold
    assert release(2) == -1 and not r.exists(*keys)
