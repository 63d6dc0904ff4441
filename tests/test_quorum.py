"""The sans-IO acquire round, driven with generated replies (no Redis involved).

Whatever the masters answer, a round must grant exactly when a quorum granted within
the validity, undo everywhere whenever any master may have granted, and raise
QuorumUnavailableError exactly when failures leave a quorum out of reach.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from redreentrant._core.effects import Fanout
from redreentrant._core.errors import QuorumUnavailableError
from redreentrant._core.kinds import EXCLUSIVE
from redreentrant._core.quorum import Quorum
from redreentrant._core.rounds import Acquire, Grant, acquire_steps

GRANT, REFUSE, FAIL = "grant", "refuse", "fail"


def reply(kind: str) -> object:
    if kind == GRANT:
        return [1, 1]
    if kind == REFUSE:
        return [0, 5000]
    return ConnectionError("refused")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([GRANT, REFUSE, FAIL]), min_size=1, max_size=7))
def test_one_non_blocking_round_is_judged_by_quorum(answers: list[str]) -> None:
    q = Quorum(tuple(f"m{i}" for i in range(len(answers))), 0.01, 0.05)
    steps = acquire_steps(Acquire(q, EXCLUSIVE, "x", "owner", 1, 30.0, False, None))
    first = next(steps)
    assert isinstance(first, Fanout) and len(first.calls) == len(answers)
    grants = answers.count(GRANT)
    fails = answers.count(FAIL)
    sent: list[Fanout] = []
    outcome: object
    try:
        effect = steps.send([[reply(a)] for a in answers])
        while True:  # later effects: the undo round (answered with successes)
            assert isinstance(effect, Fanout)
            sent.append(effect)
            effect = steps.send([[1] for _ in answers])
    except StopIteration as stop:
        outcome = stop.value
    except QuorumUnavailableError as error:
        outcome = error
    if grants >= q.needed:
        assert isinstance(outcome, Grant) and outcome.token is None  # granted, unfenced
        assert sent == []  # nothing to undo
        return
    # Not granted: whatever any master may have granted is undone on every master.
    assert len(sent) == (1 if grants or fails else 0)
    for undo in sent:
        assert all(call.script.name == "release" for per in undo.calls for call in per)
        assert len(undo.calls) == len(answers)
    if fails > q.tolerated:
        assert isinstance(outcome, QuorumUnavailableError)
        assert len(outcome.errors) == fails
    else:
        assert outcome is None  # contention: not an error


@given(st.integers(min_value=1, max_value=9))
def test_quorum_is_a_strict_majority(n: int) -> None:
    q = Quorum(tuple(f"m{i}" for i in range(n)), 0.01, 0.05)
    assert q.needed == n // 2 + 1
    assert 2 * q.needed > n  # two quorums always share a master
    assert q.tolerated == n - q.needed


@given(st.floats(min_value=0.01, max_value=3600), st.floats(min_value=0, max_value=0.49))
def test_drift_allowance_grows_with_the_lease(lease: float, factor: float) -> None:
    q = Quorum(("m0",), factor, 0.05)
    assert q.drift(lease) == lease * factor + 0.002
