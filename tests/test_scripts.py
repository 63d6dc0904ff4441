"""The Lua scripts: versions pinned to their text, and their semantics on fakeredis."""

from __future__ import annotations

import hashlib

import fakeredis
import pytest

from redreentrant._core import scripts
from redreentrant._core.keys import lock_key, wake_channel

#: name -> (version, first 16 hex digits of the text's SHA-256). A script edit must bump
#: its version and then update this table; an edit without a bump fails the test below.
PINS: dict[str, tuple[int, str]] = {
    "acquire": (1, "2ea7dabf21c4d9dc"),
    "release": (2, "53e03ce28597c8f9"),
    "renew": (1, "25bd8edda58852a6"),
    "force_unlock": (2, "cba81e2c4840f734"),
    "probe": (1, "7a9585981bbb8ce4"),
    "rwlock": (1, "6eca856f431d1e9f"),
    "fairlock": (3, "c55931264e875e51"),
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
CHANNEL = wake_channel("job")


def test_acquire_takes_a_free_lock_with_a_ttl(r: fakeredis.FakeRedis) -> None:
    assert run(r, scripts.ACQUIRE, [KEY], "a", 5000, 1) == [1, 1]
    assert r.hgetall(KEY) == {b"a": b"1"}
    assert 0 < r.pttl(KEY) <= 5000


def test_acquire_refuses_another_owner_with_the_holders_ttl(r: fakeredis.FakeRedis) -> None:
    run(r, scripts.ACQUIRE, [KEY], "a", 5000, 1)
    status, ttl = run(r, scripts.ACQUIRE, [KEY], "b", 5000, 1)  # type: ignore[misc]
    assert status == 0 and 0 < ttl <= 5000
    assert r.hgetall(KEY) == {b"a": b"1"}


def test_reentry_records_the_count_and_never_recreates_a_lost_hold(
    r: fakeredis.FakeRedis,
) -> None:
    run(r, scripts.ACQUIRE, [KEY], "a", 5000, 1)
    assert run(r, scripts.ACQUIRE, [KEY], "a", 9000, 2) == [1, 2]
    assert r.hget(KEY, "a") == b"2" and r.pttl(KEY) > 5000
    r.delete(KEY)
    assert run(r, scripts.ACQUIRE, [KEY], "a", 5000, 3) == [0, -2]
    assert not r.exists(KEY)


def test_release_sets_the_count_and_frees_at_zero_with_a_wakeup(r: fakeredis.FakeRedis) -> None:
    pubsub = r.pubsub()
    pubsub.subscribe(CHANNEL)
    pubsub.get_message(timeout=0.1)
    run(r, scripts.ACQUIRE, [KEY], "a", 5000, 1)
    run(r, scripts.ACQUIRE, [KEY], "a", 5000, 2)
    assert run(r, scripts.RELEASE, [KEY], "a", 1, CHANNEL, "r1") == 1
    assert r.hget(KEY, "a") == b"1"
    assert pubsub.get_message(timeout=0.05) is None  # not freed yet: no wake-up
    assert run(r, scripts.RELEASE, [KEY], "a", 0, CHANNEL, "r2") == 0
    assert not r.exists(KEY)
    message = pubsub.get_message(timeout=1)
    assert message is not None and message["channel"] == CHANNEL.encode()
    assert message["data"] == b"r2"  # the release id: one release, however many masters


def test_release_by_a_non_owner_changes_nothing(r: fakeredis.FakeRedis) -> None:
    run(r, scripts.ACQUIRE, [KEY], "a", 5000, 1)
    assert run(r, scripts.RELEASE, [KEY], "b", 0, CHANNEL, "r3") == -1
    assert r.hgetall(KEY) == {b"a": b"1"}


def test_renew_resets_ttls_only_where_the_owner_holds(r: fakeredis.FakeRedis) -> None:
    other = lock_key("other")
    run(r, scripts.ACQUIRE, [KEY], "a", 1000, 1)
    run(r, scripts.ACQUIRE, [other], "b", 1000, 1)
    r.set(lock_key("string"), "x")
    reply = run(r, scripts.RENEW, [KEY, other, lock_key("string")], 60000, "a", "a", "a")
    assert reply == [1, 0, 0]
    assert r.pttl(KEY) > 1000 and r.pttl(other) <= 1000


def test_force_unlock_deletes_a_lock_but_refuses_other_data(r: fakeredis.FakeRedis) -> None:
    run(r, scripts.ACQUIRE, [KEY], "a", 5000, 1)
    assert run(r, scripts.FORCE_UNLOCK, [KEY], CHANNEL, "f") == 1
    assert run(r, scripts.FORCE_UNLOCK, [KEY], CHANNEL, "f") == 0
    r.set(KEY, "not a lock")
    with pytest.raises(Exception, match="WRONGTYPE"):
        run(r, scripts.FORCE_UNLOCK, [KEY], CHANNEL, "f")
    assert r.get(KEY) == b"not a lock"


def test_probe_reads_without_changing(r: fakeredis.FakeRedis) -> None:
    assert run(r, scripts.PROBE, [KEY]) == [-2, []]
    run(r, scripts.ACQUIRE, [KEY], "a", 5000, 1)
    run(r, scripts.ACQUIRE, [KEY], "a", 5000, 3)
    ttl, fields = run(r, scripts.PROBE, [KEY])  # type: ignore[misc]
    assert 0 < ttl <= 5000 and fields == [b"a", b"3"]
