"""The seeded soak (:mod:`redreentrant.testing.soak`): its fault schedule follows the
seed and the model's limits (no root needed), and a short run passes (Linux and root:
elsewhere it skips with the reason, and fails under CI=true where no test may skip).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from redreentrant.testing import clocks, netlab, soak
from redreentrant.testing.history import Violation
from redreentrant.testing.soak import (
    CLIENT_FAULTS,
    MASTER_FAULTS,
    SETTLE,
    Fault,
    by_a_clock,
    main,
    plan,
)

LEASE = 1.5


def busy_masters(faults: list[Fault], t: float) -> set[int]:
    """The masters that count as faulted at ``t`` (until a settle after the undo)."""
    return {
        f.master for f in faults if f.master is not None and f.at <= t < f.until + SETTLE * LEASE
    }


def test_the_same_seed_gives_the_same_schedule() -> None:
    first = plan(7, 75, 5, 6, LEASE)
    assert first == plan(7, 75, 5, 6, LEASE)
    assert first != plan(8, 75, 5, 6, LEASE)
    out = io.StringIO()
    assert main(["--seed", "7", "--plan-only"], out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "seed 7"
    assert lines[1:] == [f.describe() for f in first]


def test_a_fresh_seed_is_printed_first() -> None:
    out = io.StringIO()
    assert main(["--plan-only", "--seconds", "5"], out=out) == 0
    first = out.getvalue().splitlines()[0]
    assert first.startswith("seed ") and first.split()[1].isdigit()


@pytest.mark.parametrize("seed", range(20))
def test_the_schedule_keeps_the_models_limits(seed: int) -> None:
    faults = plan(seed, 300, 5, 6, LEASE)
    assert len(faults) > 100
    kinds = {f.kind for f in faults}
    assert kinds == set(MASTER_FAULTS) | set(CLIENT_FAULTS)
    for f in faults:
        assert 1.0 <= f.at < 300 and f.at < f.until
        # At most a minority of masters faulted at once, a settle after each undo included.
        assert len(busy_masters(faults, f.at)) <= 2, f
        if f.kind == "kill":
            assert f.until - f.at > LEASE  # restarted, empty, only after a lease
        else:
            assert 0.3 <= f.until - f.at <= 3.0
        if f.kind == "client-cut":
            assert len(f.masters) == 3  # a majority of the client's masters
        elif f.kind in CLIENT_FAULTS:
            assert f.masters == (0, 1, 2, 3, 4)
    # A client's path has one fault at a time, at most two paths at once.
    on_clients = [f for f in faults if f.client is not None]
    for f in on_clients:
        at_once = [g for g in on_clients if g.at <= f.at < g.until]
        assert len(at_once) <= 2 and len({g.client for g in at_once}) == len(at_once)


def test_it_says_why_it_cannot_run_and_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soak.netlab_module, "available", lambda: "network labs need root")
    out = io.StringIO()
    assert main(["--seconds", "5", "--seed", "3"], out=out) == 2
    assert out.getvalue().splitlines() == ["seed 3", "cannot run here: network labs need root"]


def test_a_hold_gone_while_a_clock_ran_fast_is_documented_not_a_violation() -> None:
    fast = Fault(1.0, 2.0, "clock-10x", master=2)
    cut = Fault(1.0, 2.0, "cut", master=3)
    log = [(100, "+", fast), (100, "+", cut), (200, "-", fast), (200, "-", cut)]

    def gone(since: int, t: int, kind: str = "gone-while-valid") -> Violation:
        return Violation(kind, "x", t, "", since)

    assert by_a_clock(gone(150, 160), log)  # during the fault
    assert by_a_clock(gone(50, 160), log)  # the fault began while it was held
    assert not by_a_clock(gone(250, 260), log)  # after the fault: a violation
    assert not by_a_clock(gone(50, 90), log)  # before it
    assert not by_a_clock(gone(150, 160), [e for e in log if e[2] is cut])  # not a clock
    assert not by_a_clock(gone(150, 160, "overlap"), log)
    assert by_a_clock(gone(150, 160), log[:2])  # still running at the end


def test_one_master_has_only_client_faults() -> None:
    faults = plan(1, 60, 1, 2, LEASE)
    assert faults and all(f.kind in CLIENT_FAULTS for f in faults)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_short_soak_finds_no_violation(tmp_path: Path) -> None:
    for why in (netlab.available(), clocks.available()):
        if why is not None:
            pytest.skip(why)
    figures = tmp_path / "soak.json"
    done = subprocess.run(
        [sys.executable, "-m", "redreentrant.testing.soak", "--seconds", "15",
         "--processes", "3", "--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    lines = done.stdout.splitlines()
    assert lines[0].startswith("seed ") and lines[0].split()[1].isdigit(), output
    for figure in ("holds:", "faults:", "violations: 0", "time:"):
        assert any(line.startswith(figure) for line in lines), output
    result = json.loads(figures.read_text())
    assert result["holds_total"] > 0 and result["violations_total"] == 0, output
    assert len(result["faults"]) >= 3, output  # several kinds of fault were injected
    assert not result["workers_failed"], output
