"""Fencing tokens: the core's judgement of counters (no server), and tokens on real
masters, also when masters restart without persistence."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import redis

import redreentrant.asyncio as aio
from redreentrant import (
    FencedStore,
    FencingError,
    LockManager,
    LockNotOwnedError,
    QuorumUnavailableError,
)
from redreentrant._core.effects import Fanout
from redreentrant._core.fencing import token_of
from redreentrant._core.kinds import EXCLUSIVE
from redreentrant._core.quorum import Quorum
from redreentrant._core.rounds import Grant, acquire_steps
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
    steps = acquire_steps(Q5, EXCLUSIVE, "x", "o", 1, 30.0, False, None, fencing=True)
    grant = drive(steps, fenced_answer(counters, 5, log))
    assert isinstance(grant, Grant) and grant.token == 5 and grant.votes == 5
    # Round 1: acquire and step the counter, pipelined; round 2: the write-back.
    assert [c.script.name for c in log[0].calls[0]] == ["acquire", "fence"]
    assert all(c.args[:2] == ("raise", 5) for per in log[1].calls for c in per)
    assert len(log) == 2


def test_a_write_back_short_of_a_quorum_hands_out_nothing_and_undoes_the_grant() -> None:
    log: list[Fanout] = []
    counters = [kept(3)] * 5
    steps = acquire_steps(Q5, EXCLUSIVE, "x", "o", 1, 30.0, False, None, fencing=True)
    assert drive(steps, fenced_answer(counters, 2, log)) is None  # non-blocking: gave up
    assert [c.script.name for c in log[2].calls[0]] == ["release"]  # the undo


def test_an_acquire_refused_for_lost_counters_undoes_its_grant_before_raising() -> None:
    log: list[Fanout] = []
    counters = [fresh(1), fresh(2), fresh(3), kept(50), kept(51)]
    steps = acquire_steps(Q5, EXCLUSIVE, "x", "o", 1, 30.0, True, None, fencing=True)
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
    for keys in ensemble.keys("redreentrant:*").values():
        assert all(k.endswith(":fence") for k in keys), keys
    ensemble.flushall()


@pytest.mark.integration
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
        with read, pytest.raises(FencingError, match="readers share"):
            _ = read.token
        with pytest.raises(LockNotOwnedError):
            _ = a.lock("t").token
        with b.lock("u") as plain, pytest.raises(FencingError, match="without fencing"):
            _ = plain.token


@pytest.mark.integration
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

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(held) == 32 and held == sorted(held) and len(set(held)) == 32


@pytest.mark.integration
def test_tokens_stay_monotonic_when_a_minority_restarts_without_persistence(
    ensemble: LocalEnsemble, fenced_urls: list[str]
) -> None:
    with LockManager(fenced_urls, fencing=True) as mgr:
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


@pytest.mark.integration
def test_counters_lost_on_a_majority_refuse_until_an_operator_raises_them(
    ensemble: LocalEnsemble, fenced_urls: list[str]
) -> None:
    with LockManager(fenced_urls, fencing=True) as mgr:
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


@pytest.mark.integration
def test_with_fencing_off_no_key_of_a_released_lock_remains(ensemble: LocalEnsemble) -> None:
    with LockManager(ensemble.urls) as mgr:
        plain, write, fair = mgr.lock("off"), mgr.rw_lock("off").write, mgr.fair_lock("off")
        with plain, write, fair:
            pass
    assert all(not keys for keys in ensemble.keys("*").values())


@pytest.mark.integration
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


@pytest.mark.integration
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
