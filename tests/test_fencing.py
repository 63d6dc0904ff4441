"""Fencing tokens: the core's judgement of counters (no server), and tokens on real
masters, also when masters restart without persistence."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from helpers import FLAVOURS, aw, in_threads, on_masters, run

import redreentrant.asyncio as aio
from redreentrant import (
    FencedStore,
    FencingError,
    LockManager,
    LockNotOwnedError,
    QuorumUnavailableError,
)
from redreentrant._core.effects import Fanout
from redreentrant._core.fencing import check_token, token_of
from redreentrant._core.keys import PREFIX
from redreentrant._core.kinds import EXCLUSIVE
from redreentrant._core.quorum import Quorum
from redreentrant._core.replies import Counter, counter_of
from redreentrant._core.rounds import Acquire, Grant, acquire_steps
from redreentrant.cli import app as cli_app
from redreentrant.cli import main as cli_main
from redreentrant.testing import LocalEnsemble

Q5 = Quorum(tuple(f"m{i}" for i in range(5)), 0.01, 0.05)
GRANT = [1, 1]
REFUSE = [0, 5000]


def kept(value: int, held: bool = True) -> list[int]:
    return [int(held), value, 0]


def fresh(clock_us: int, held: bool = True) -> list[int]:
    return [int(held), clock_us, 1]


# -- the judgement of counters (no server) ------------------------------------------------


def test_the_token_is_the_largest_kept_counter_of_a_granting_quorum() -> None:
    replies = [[GRANT, kept(7)], [GRANT, kept(9)], [GRANT, kept(8)], [REFUSE, kept(12, False)]]
    replies.append([GRANT, fresh(10**15)])
    # A fresh counter proves nothing and does not count, however large its clock.
    assert token_of(Q5, "x", [0, 1, 2, 4], replies) == 9


def test_too_few_kept_counters_among_the_grants_prove_no_token_this_round() -> None:
    # Two kept among the grants, one lost: not a proof, but a later round may give one.
    replies = [[GRANT, kept(7)], [GRANT, kept(9)], [GRANT, fresh(5)], [REFUSE, kept(9, False)]]
    replies.append([REFUSE, kept(9, False)])
    assert token_of(Q5, "x", [0, 1, 2], replies) is None


def test_counters_lost_on_a_majority_refuse_with_what_an_operator_can_do() -> None:
    replies = [[GRANT, fresh(5)], [GRANT, fresh(6)], [GRANT, fresh(7)], [GRANT, kept(40)]]
    replies.append([GRANT, kept(41)])
    with pytest.raises(FencingError, match=r"lost on 3 of 5 masters.*raise_fence"):
        token_of(Q5, "x", [0, 1, 2, 3, 4], replies)
    # Lost plus silent counters beyond what a quorum tolerates: no round can prove one.
    silent = [[GRANT, fresh(5)], [GRANT, kept(40)], [GRANT, kept(41)]]
    silent += [[ConnectionError(), ConnectionError()]] * 2
    with pytest.raises(FencingError, match="did not answer"):
        token_of(Q5, "x", [0, 1, 2], silent)


def test_a_name_no_master_knows_starts_from_the_granting_masters_clocks() -> None:
    replies = [[GRANT, fresh(100)], [GRANT, fresh(300)], [GRANT, fresh(200)]]
    replies += [[REFUSE, fresh(999, False)], [ConnectionError(), ConnectionError()]]
    # The refusing master's clock is not the grant's: only granting masters count.
    assert token_of(Q5, "x", [0, 1, 2], replies) == 300


def drive(steps: Iterator[object], answer: object) -> object:
    """Run core steps, answering each effect with ``answer(effect)``."""
    effect = next(steps)  # type: ignore[call-overload]
    try:
        while True:
            effect = steps.send(answer(effect))  # type: ignore[attr-defined]
    except StopIteration as stop:
        return stop.value


def fenced_answer(counters: list[list[int]], acks: int, log: list[Fanout]) -> object:
    def answer(effect: object) -> object:
        assert isinstance(effect, Fanout)
        log.append(effect)
        names = {c.script.name for per in effect.calls for c in per}
        first = effect.calls[0][0]
        if names == {"acquire", "fence"}:
            return [[GRANT, c] for c in counters]
        if names == {"fence"} and first.args[0] == "raise":
            return [[int(first.args[1])] if i < acks else [ConnectionError()] for i in range(5)]
        return [[1] for _ in effect.calls]  # an undo

    return answer


def test_a_fenced_grant_writes_its_token_back_before_handing_it_out() -> None:
    log: list[Fanout] = []
    counters = [kept(3), kept(5), kept(4), kept(5), fresh(10**15)]
    steps = acquire_steps(Acquire(Q5, EXCLUSIVE, "x", "o", 1, 30.0, False, None, fencing=True))
    grant = drive(steps, fenced_answer(counters, 5, log))
    assert isinstance(grant, Grant) and grant.token == 5 and grant.votes == 5
    # Round 1: acquire and step the counter, pipelined; round 2: the write-back.
    assert [c.script.name for c in log[0].calls[0]] == ["acquire", "fence"]
    assert all(c.args[:2] == ("raise", 5) for per in log[1].calls for c in per)
    assert len(log) == 2


def test_a_write_back_short_of_a_quorum_hands_out_nothing_and_undoes_the_grant() -> None:
    log: list[Fanout] = []
    counters = [kept(3)] * 5
    steps = acquire_steps(Acquire(Q5, EXCLUSIVE, "x", "o", 1, 30.0, False, None, fencing=True))
    assert drive(steps, fenced_answer(counters, 2, log)) is None  # non-blocking: gave up
    assert [c.script.name for c in log[2].calls[0]] == ["release"]  # the undo


def test_an_acquire_refused_for_lost_counters_undoes_its_grant_before_raising() -> None:
    log: list[Fanout] = []
    counters = [fresh(1), fresh(2), fresh(3), kept(50), kept(51)]
    steps = acquire_steps(Acquire(Q5, EXCLUSIVE, "x", "o", 1, 30.0, True, None, fencing=True))
    with pytest.raises(FencingError):
        drive(steps, fenced_answer(counters, 5, log))
    assert any(c.script.name == "release" for c in log[-2].calls[0] + log[-1].calls[0])
    assert not any(c.args[:1] == ("raise",) for f in log for per in f.calls for c in per)


# -- on real masters ----------------------------------------------------------------------


@pytest.fixture
def fenced_urls(ensemble: LocalEnsemble) -> Iterator[list[str]]:
    """The ensemble's URLs; the counters (which outlive locks on purpose) are removed
    afterwards, with a check that nothing else was left."""
    yield ensemble.urls
    for server in ensemble.servers:
        if server.paused:
            server.resume()
        if not server.running:
            server.start()
    for keys in ensemble.keys(PREFIX + "{*").values():
        assert all(k.endswith(":fence") for k in keys), keys
    ensemble.flushall()


def test_tokens_grow_with_every_grant_across_managers_and_kinds(fenced_urls: list[str]) -> None:
    with LockManager(fenced_urls, fencing=True) as a, LockManager(fenced_urls) as b:
        tokens = []
        for mgr in (a, b, a, b):
            lock = mgr.lock("t", fencing=True)
            with lock:
                tokens.append(lock.token)
                with lock:  # a re-entry keeps the hold's token
                    assert lock.token == tokens[-1]
        assert tokens == sorted(set(tokens)) and tokens[-1] - tokens[0] == 3
        write = a.rw_lock("t").write
        with write:
            w1 = write.token
        with write:
            assert write.token == w1 + 1
        fair = a.fair_lock("t")
        with fair:
            assert isinstance(fair.token, int)
        read = a.rw_lock("t").read
        with read, pytest.raises(FencingError, match="holders share"):
            _ = read.token
        with pytest.raises(LockNotOwnedError):
            _ = a.lock("t").token
        with b.lock("u") as plain, pytest.raises(FencingError, match="without fencing"):
            _ = plain.token


def test_concurrent_holders_get_tokens_in_the_order_they_held(fenced_urls: list[str]) -> None:
    held: list[int] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with LockManager(fenced_urls, fencing=True) as mgr:
                for _ in range(8):
                    with mgr.lock("order") as lock:
                        held.append(lock.token)  # appended while held: in hold order
        except BaseException as error:
            errors.append(error)

    in_threads(worker, [()] * 4, timeout=None)
    assert not errors
    assert len(held) == 32 and held == sorted(held) and len(set(held)) == 32


def test_tokens_stay_monotonic_when_a_minority_restarts_without_persistence(
    ensemble: LocalEnsemble, fenced_urls: list[str]
) -> None:
    # A short lease: each restarted pair is quarantined for it, and three pairs within
    # one lease would be a majority out.
    with LockManager(fenced_urls, fencing=True, lease=1.5) as mgr:
        last = 0
        for restart in ([0, 1], [2, 3], [4, 0]):
            with mgr.lock("m") as lock:
                assert lock.token > last
                last = lock.token
            for i in restart:
                ensemble[i].restart()
            # The first round after a restart may meet closed connections: the lock
            # is then unavailable, never held with a smaller token.
            for _ in range(3):
                try:
                    with mgr.lock("m") as lock:
                        assert lock.token > last
                        last = lock.token
                    break
                except QuorumUnavailableError:
                    continue
            else:
                pytest.fail("the lock never came back after a minority restart")


def test_without_quarantine_counters_lost_on_a_majority_refuse_until_an_operator_raises_them(
    ensemble: LocalEnsemble, fenced_urls: list[str]
) -> None:
    with LockManager(fenced_urls, fencing=True, quarantine=0) as mgr:
        with mgr.lock("maj") as lock:
            last = lock.token
        for i in (0, 1, 2):
            ensemble[i].restart()
        refused = None
        for _ in range(3):
            try:
                with mgr.lock("maj"):
                    pytest.fail("a token was handed out that nothing proves larger")
            except QuorumUnavailableError:
                continue  # closed connections after the restart
            except FencingError as error:
                refused = error
                break
        assert refused is not None and "raise_fence" in str(refused)
        # Nothing is held: the lock's own keys are gone everywhere.
        assert not mgr.lock("maj").locked()
        assert mgr.lock("maj").raise_fence(last + 1000) == 5
        with mgr.lock("maj") as lock:
            assert lock.token == last + 1001


def test_with_fencing_off_no_key_of_a_released_lock_remains(ensemble: LocalEnsemble) -> None:
    with LockManager(ensemble.urls) as mgr:
        plain, write, fair = mgr.lock("off"), mgr.rw_lock("off").write, mgr.fair_lock("off")
        with plain, write, fair:
            pass
    assert all(not keys for keys in ensemble.keys(PREFIX + "{*").values())


def test_a_fenced_store_refuses_the_late_write_of_a_holder_whose_lease_ran_out(
    fenced_urls: list[str],
) -> None:
    resource = redis.Redis.from_url(fenced_urls[0])
    store = FencedStore(resource, "{res}:value")
    with LockManager(fenced_urls, fencing=True) as a, LockManager(fenced_urls) as b:
        slow = a.lock("res", fencing=True)
        assert slow.acquire(lease=0.5)
        old = slow.token
        assert store.write(old, "first")
        # The holder pauses past its lease; another client takes the lock and writes.
        fast = b.lock("res", fencing=True)
        assert fast.acquire(timeout=5)
        assert fast.token > old and store.write(fast.token, "second")
        assert store.write(fast.token, "again")  # one hold may write many times
        assert not store.write(old, "late")  # the paused holder's late write
        assert store.read() == b"again" and store.largest_token() == fast.token
        fast.release()
        with pytest.raises(ValueError):
            store.write(-1, "x")
    resource.delete("{res}:value", "{res}:value:fencing-token")
    resource.close()


def test_asyncio_tokens_and_store(fenced_urls: list[str]) -> None:
    async def main() -> None:
        import redis.asyncio as aredis

        async with aio.LockManager(fenced_urls, fencing=True) as mgr:
            lock = mgr.lock("a")
            async with lock:
                first = lock.token
            async with lock:
                assert lock.token == first + 1
            assert await lock.raise_fence(first + 100) == 5
            async with lock:
                assert lock.token == first + 101
            client = aredis.Redis.from_url(fenced_urls[0])
            store = aio.FencedStore(client, "{ares}:v")
            assert await store.write(first + 101, "x")
            assert not await store.write(first, "y")
            assert await store.read() == b"x" and await store.largest_token() == first + 101
            await client.delete("{ares}:v", "{ares}:v:fencing-token")
            await client.aclose()

    asyncio.run(main())


# -- the range: exact at any size, signed 64 bit ---------------------------------------------

MAX = 2**63 - 1
#: starts around 2**53 (where doubles stop being exact) and below 2**63 - 1
STARTS = [2**53 - 2, 10**18, MAX - 3]
#: a FencedStore's writes, in order, as (token, value, accepted): past 2**53, where a
#: double can no longer tell 2**53 from 2**53 + 1, and at the maximum; both flavours'
#: store tests replay them
STORE_WRITES = [
    (2**53 - 1, "a", True),
    (2**53 + 1, "b", True),
    (2**53, "late", False),  # a double would call it equal
    (2**53 + 1, "again", True),  # one hold may write many times
    (MAX, "last", True),
    (MAX - 1, "late", False),
]
#: tokens a FencedStore refuses with ValueError (naming the argument), sending nothing
STORE_OUT_OF_RANGE = (2**63, -(2**63) - 1, -1, True, 1.5)
#: what the store holds after STORE_WRITES: the last accepted value and the largest token
STORE_LAST = (b"last", MAX)
STORE_REFUSED = r"FencedStore\.write\(token=\.\.\.\)"


def largest_accepted(step: int) -> int:
    """The largest token among STORE_WRITES[: step + 1] that the store accepted."""
    return max(token for token, _, ok in STORE_WRITES[: step + 1] if ok)


def counters(ensemble: LocalEnsemble, name: str) -> list[bytes | None]:
    """Each master's fencing counter of the plain lock ``name``, as stored."""
    return on_masters(ensemble.urls, lambda r: r.get(EXCLUSIVE.fence_key(name)))


def test_counter_replies_are_read_exactly_as_integers_or_decimal_strings() -> None:
    big = 2**53 + 1
    for value in (big, str(big), str(big).encode()):
        assert counter_of([1, value, 0]) == Counter(True, big, False)
    assert counter_of([1, MAX, 2]) == Counter(True, MAX, False, full=True)
    assert counter_of([1, b"x", 0]) is None and counter_of([1, 2.0, 0]) is None
    replies = [[GRANT, [1, str(big + i).encode(), 0]] for i in range(3)]
    replies += [[REFUSE, [0, str(MAX).encode(), 0]], [ConnectionError(), ConnectionError()]]
    assert token_of(Q5, "x", [0, 1, 2], replies) == big + 2


def test_a_counter_at_its_maximum_refuses_the_grant_rather_than_repeat_a_token() -> None:
    replies = [[GRANT, [1, MAX - 5, 0]], [GRANT, [1, MAX, 2]], [GRANT, [1, MAX - 3, 0]]]
    replies += [[REFUSE, [0, MAX, 0]], [ConnectionError(), ConnectionError()]]
    with pytest.raises(FencingError, match="maximum"):
        token_of(Q5, "x", [0, 1, 2], replies)


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, -1, True, 1.0, "5"], ids=repr)
def test_tokens_outside_the_range_are_refused_with_the_argument_named(value: object) -> None:
    with pytest.raises(ValueError, match=r"raise_fence\(at_least=\.\.\.\): .*9223372036854775807"):
        check_token(value, "raise_fence(at_least=...)")
    assert check_token(MAX, "x") == MAX and check_token(0, "x") == 0


@pytest.mark.parametrize("start", STARTS, ids=["2**53-2", "10**18", "2**63-4"])
def test_grants_and_raises_are_exact_at_any_size(
    ensemble: LocalEnsemble, fenced_urls: list[str], start: int
) -> None:
    with LockManager(fenced_urls, fencing=True) as mgr:
        lock = mgr.lock("big")
        assert lock.raise_fence(start) == 5
        assert lock.raise_fence(start - 1) == 5  # never lowers, even by one
        tokens = []
        for _ in range(3):
            with lock:
                tokens.append(lock.token)
        assert tokens == [start + 1, start + 2, start + 3]
        assert counters(ensemble, "big") == [str(start + 3).encode()] * 5


def test_raise_fence_compares_exactly_past_2_53(
    ensemble: LocalEnsemble, fenced_urls: list[str]
) -> None:
    with LockManager(fenced_urls, fencing=True) as mgr:
        lock = mgr.lock("r")
        lock.raise_fence(2**53)
        lock.raise_fence(2**53 + 1)  # one more than a double tells apart
        assert counters(ensemble, "r") == [str(2**53 + 1).encode()] * 5
        lock.raise_fence(10)  # shorter: smaller, whatever the digits
        with lock:
            assert lock.token == 2**53 + 2


def test_a_grant_past_the_maximum_raises_and_changes_nothing(
    ensemble: LocalEnsemble, fenced_urls: list[str]
) -> None:
    with LockManager(fenced_urls, fencing=True) as mgr:
        lock = mgr.lock("max")
        lock.raise_fence(MAX - 1)
        with lock:
            assert lock.token == MAX
        with pytest.raises(FencingError, match="maximum"):
            lock.acquire(timeout=2)
        assert not lock.is_owned() and not lock.locked()
        assert counters(ensemble, "max") == [str(MAX).encode()] * 5
        assert lock.raise_fence(MAX) == 5  # in range: a no-op here
        # A counter past the range (not written by this library) refuses alike.
        on_masters(fenced_urls, lambda r: r.set(EXCLUSIVE.fence_key("max"), str(2**63)))
        with pytest.raises(FencingError, match="maximum"):
            lock.acquire(timeout=2)


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, True, 7.0], ids=repr)
def test_raise_fence_refuses_a_value_outside_the_range_before_sending_it(
    ensemble: LocalEnsemble, fenced_urls: list[str], value: object
) -> None:
    refused = pytest.raises(ValueError, match=r"raise_fence\(at_least=\.\.\.\)")
    with LockManager(fenced_urls, fencing=True) as mgr, refused:
        mgr.lock("out").raise_fence(value)  # type: ignore[arg-type]
    assert counters(ensemble, "out") == [None] * 5


@pytest.mark.parametrize("api", FLAVOURS)
def test_a_fenced_store_compares_tokens_exactly_and_refuses_out_of_range_ones(
    fenced_urls: list[str], api: Any
) -> None:
    async def main() -> None:
        client = redis.asyncio if api is aio else redis
        resource = client.Redis.from_url(fenced_urls[0])
        store = api.FencedStore(resource, "{big}:value")
        try:
            for step, (token, value, ok) in enumerate(STORE_WRITES):
                assert await aw(store.write(token, value)) is ok, (token, value)
                assert await aw(store.largest_token()) == largest_accepted(step)
            for bad in STORE_OUT_OF_RANGE:
                with pytest.raises(ValueError, match=STORE_REFUSED):
                    await aw(store.write(bad, "x"))
            assert (await aw(store.read()), await aw(store.largest_token())) == STORE_LAST
        finally:
            await aw(resource.delete("{big}:value", "{big}:value:fencing-token"))
            await aw(resource.aclose() if api is aio else resource.close())

    run(main())


def test_fence_cli_refuses_an_out_of_range_floor_as_a_usage_error(
    ensemble: LocalEnsemble,
    fenced_urls: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli_app, "setup_logging", lambda: None)  # leave logging alone
    masters = ",".join(fenced_urls)
    for value in (str(2**63), str(-(2**63) - 1)):
        assert cli_main(["--masters", masters, "fence", "cli", "--at-least", value]) == 2
        assert "--at-least" in capsys.readouterr().err
    assert counters(ensemble, "cli") == [None] * 5
    assert cli_main(["--masters", masters, "fence", "cli", "--at-least", str(MAX)]) == 0
    assert f"to at least {MAX} on 5 of 5" in capsys.readouterr().out
    assert counters(ensemble, "cli") == [str(MAX).encode()] * 5


def test_asyncio_grants_and_raises_are_exact_past_2_53(
    ensemble: LocalEnsemble, fenced_urls: list[str]
) -> None:
    async def main() -> list[int]:
        async with aio.LockManager(fenced_urls, fencing=True) as mgr:
            lock = mgr.lock("abig")
            assert await lock.raise_fence(2**53 - 2) == 5
            tokens = []
            for _ in range(3):
                async with lock:
                    tokens.append(lock.token)
            await lock.raise_fence(2**53 + 3)
            await lock.raise_fence(2**53 + 2)  # never lowers, even by one
            async with lock:
                tokens.append(lock.token)
            return tokens

    assert asyncio.run(main()) == [2**53 - 1, 2**53, 2**53 + 1, 2**53 + 4]
    assert counters(ensemble, "abig") == [str(2**53 + 4).encode()] * 5


def test_asyncio_refuses_out_of_range_floors_and_grants_past_the_maximum(
    ensemble: LocalEnsemble, fenced_urls: list[str]
) -> None:
    async def main() -> None:
        async with aio.LockManager(fenced_urls, fencing=True) as mgr:
            lock = mgr.lock("amax")
            for value in (2**63, -(2**63) - 1, False, 3.0):
                with pytest.raises(ValueError, match=r"raise_fence\(at_least=\.\.\.\)"):
                    await lock.raise_fence(value)  # type: ignore[arg-type]
            assert counters(ensemble, "amax") == [None] * 5
            await lock.raise_fence(MAX - 1)
            async with lock:
                assert lock.token == MAX
            with pytest.raises(FencingError, match="maximum"):
                await lock.acquire(timeout=2)
            assert not lock.is_owned() and not await lock.locked()

    asyncio.run(main())
    assert counters(ensemble, "amax") == [str(MAX).encode()] * 5
