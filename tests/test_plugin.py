"""The pytest plugin (redreentrant.testing.plugin): small test files that use its
fixtures, run by pytester in a session of their own, against real redis-server
processes on 127.0.0.1."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import require_redis_server

from redreentrant.testing import LocalServer
from redreentrant.testing.loopback import pid_on

pytest_plugins = ["pytester"]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DOCS = Path(__file__).resolve().parents[1] / "docs" / "testing.md"
# A Python block of the docs whose first line names a file: "# billing.py".
FILE_BLOCK = re.compile(r"```python\n# ([\w.]+\.py)\n(.*?)```", re.DOTALL)


@pytest.fixture(autouse=True)
def _inner_sessions_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The inner sessions need a redis-server, as the project's other integration
    tests do; they must not see this session's CI setting unless a test sets it."""
    binary = require_redis_server("the plugin's tests")
    monkeypatch.setenv("REDIS_SERVER", binary)
    monkeypatch.delenv("CI", raising=False)
    yield


def _run(
    pytester: pytest.Pytester, source: str, *args: str, asyncio_plugin: str | None = None
) -> pytest.RunResult:
    """Run ``source`` as a test file in a session of its own; the asyncio plugins that
    may be installed stay out of it unless ``asyncio_plugin`` names one."""
    pytester.makepyfile(test_app=textwrap.dedent(source))
    plugins = [name for name in ("asyncio", "anyio") if name != asyncio_plugin]
    blocked = [arg for name in plugins for arg in ("-p", f"no:{name}")]
    return pytester.runpytest("-p", "no:cacheprovider", *blocked, *args)


def _servers_gone(record: Path) -> None:
    """Every server that the inner session recorded (its port and pid) is gone."""
    servers = json.loads(record.read_text())
    assert servers
    for port, pid in servers:
        assert pid_on(port) != pid, f"the server on 127.0.0.1:{port} still answers"


def test_the_entry_point_names_the_plugin() -> None:
    points = importlib.metadata.entry_points(group="pytest11")
    assert {point.name: point.value for point in points}["redreentrant"] == (
        "redreentrant.testing.plugin"
    )


def test_importing_the_testing_package_does_not_import_pytest() -> None:
    code = "import sys, redreentrant.testing; print('pytest' in sys.modules)"
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert output.strip() == "False"


def test_a_fresh_manager_per_test_and_the_tests_lock_keys_removed(
    pytester: pytest.Pytester,
) -> None:
    record = pytester.path / "urls.json"
    result = _run(
        pytester,
        f"""
        import json
        import pytest
        import redis
        from redreentrant import LockManager

        PREFIX = "redreentrant:v1:"
        seen = []

        @pytest.fixture(scope="session", autouse=True)
        def planted(redreentrant_ensembles):
            # A lock key that was there before the tests: not theirs to remove.
            for url in redreentrant_ensembles.get(3).urls:
                with redis.Redis.from_url(url) as r:
                    r.set(PREFIX + "{{planted}}", "x")
                    r.set("app:data", "kept")

        def keys(urls):
            out = set()
            for url in urls:
                with redis.Redis.from_url(url, decode_responses=True) as r:
                    out |= set(r.keys(PREFIX + "{{*"))
            return out

        def test_first(redreentrant_manager, redreentrant_urls, redreentrant_ensemble):
            assert isinstance(redreentrant_manager, LockManager)
            assert redreentrant_manager.quorum == 2
            seen.append(redreentrant_manager)
            redreentrant_manager.lock("held-at-the-end").acquire()   # never released
            redreentrant_manager.rw_lock("rw").read.acquire()
            redreentrant_manager.fair_lock("fair").acquire()
            with LockManager(redreentrant_urls) as own:              # any manager's keys
                own.lock("own").acquire()
            assert len(keys(redreentrant_urls)) > 4
            assert all(url.startswith("redis://127.0.0.1:") for url in redreentrant_urls)
            with open({str(record)!r}, "w") as f:
                json.dump([(s.port, s.pid) for s in redreentrant_ensemble], f)

        def test_second(redreentrant_manager, redreentrant_urls):
            assert seen[0] is not redreentrant_manager and seen[0].closed
            assert keys(redreentrant_urls) == {{PREFIX + "{{planted}}"}}
            for url in redreentrant_urls:
                with redis.Redis.from_url(url) as r:
                    assert r.get("app:data") == b"kept"
            lock = redreentrant_manager.lock("held-at-the-end")
            assert lock.acquire(blocking=False)
            lock.release()
        """,
    )
    result.assert_outcomes(passed=2)
    _servers_gone(record)


def test_the_ensemble_size_from_the_marker_the_ini_option_or_a_parameter(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\nredreentrant_masters = 1\n")
    result = _run(
        pytester,
        """
        import pytest

        urls = {}

        def test_ini(redreentrant_ensemble, redreentrant_manager):
            assert len(redreentrant_ensemble) == 1 and redreentrant_manager.quorum == 1
            urls[1] = redreentrant_ensemble.urls

        @pytest.mark.redreentrant(masters=5, lease=2.0)
        def test_marker(redreentrant_manager, redreentrant_urls):
            assert len(redreentrant_urls) == 5 and redreentrant_manager.quorum == 3
            assert redreentrant_manager.lease == 2.0
            with redreentrant_manager.lock("five"):
                pass
            urls[5] = redreentrant_urls

        @pytest.mark.redreentrant(masters=5)
        def test_the_same_size_shares_its_ensemble(redreentrant_urls, redreentrant_ensembles):
            assert redreentrant_urls == urls[5]
            assert redreentrant_ensembles.sizes == [1, 5]

        @pytest.mark.parametrize("redreentrant_masters", [2, 3])
        def test_parametrized(redreentrant_masters, redreentrant_manager):
            assert len(redreentrant_manager.masters) == redreentrant_masters

        @pytest.mark.redreentrant(masters=3)
        class TestClass:
            @pytest.mark.redreentrant(lease=4.0)
            def test_merged(self, redreentrant_manager):
                assert redreentrant_manager.quorum == 2
                assert redreentrant_manager.lease == 4.0

            @pytest.mark.redreentrant(masters=1)
            def test_closest_wins(self, redreentrant_urls):
                assert redreentrant_urls == urls[1]

        @pytest.mark.redreentrant(masters=0)
        def test_bad_size(redreentrant_ensemble):
            pass

        @pytest.mark.redreentrant(3)
        def test_positional(redreentrant_ensemble):
            pass

        @pytest.mark.redreentrant(masers=3)
        def test_typo(redreentrant_ensemble):
            pass
        """,
    )
    result.assert_outcomes(passed=7, errors=3)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_bad_size*",
            "*number of masters must be an int >= 1, got 0",
            "*ERROR at setup of test_positional*",
            "*takes keywords only*",
            "*ERROR at setup of test_typo*",
            "*unknown keyword(s) ?'masers'?*",
        ]
    )


def test_faults_on_a_three_master_ensemble(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        """
        import time
        import pytest
        import redis
        from redreentrant import QuorumUnavailableError

        pytestmark = pytest.mark.redreentrant(lease=5.0)

        def acquired_soon(lock, timeout=1):
            # A master that answers again rejoins the manager's rounds as soon as the
            # manager hears from it (a probe runs at most every min(lease / 3, 1 s)).
            deadline = time.monotonic() + 10
            while True:
                try:
                    return lock.acquire(timeout=timeout)
                except QuorumUnavailableError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)

        def test_a_minority_stopped_or_killed(redreentrant_manager, redreentrant_faults):
            lock = redreentrant_manager.lock("job")
            redreentrant_faults.stop(0)
            assert redreentrant_faults.down() == [0]
            with lock:
                assert lock.is_owned()
            redreentrant_faults.kill(1)
            with pytest.raises(QuorumUnavailableError) as failed:
                lock.acquire()
            assert len(failed.value.errors) == 2 and failed.value.needed == 2
            assert not lock.is_owned()

        def test_healed_after_the_previous_test(redreentrant_faults, redreentrant_manager):
            assert redreentrant_faults.down() == []
            with redreentrant_manager.lock("job"):
                pass

        def test_frozen_and_thawed(redreentrant_manager, redreentrant_faults):
            lock = redreentrant_manager.lock("job")
            redreentrant_faults.freeze(2)
            with lock:
                pass
            redreentrant_faults.freeze(1)
            assert redreentrant_faults.down() == [1, 2]
            with pytest.raises(QuorumUnavailableError):
                lock.acquire()
            redreentrant_faults.thaw(1, 2)
            assert acquired_soon(lock)
            lock.release()

        def test_restarted_empty(redreentrant_manager, redreentrant_faults, redreentrant_urls):
            lock = redreentrant_manager.lock("job")
            lock.acquire()
            with redis.Redis.from_url(redreentrant_urls[0]) as r:
                assert r.dbsize() > 0
            redreentrant_faults.restart(0)
            with redis.Redis.from_url(redreentrant_urls[0]) as r:
                assert r.dbsize() == 0       # the master forgot the lock
            lock.release()                   # still held on the other two: a quorum

        def test_restarted_later(redreentrant_manager, redreentrant_faults):
            redreentrant_faults.restart(0, 1, delay=0.2)
            assert redreentrant_faults.down() == []
            redreentrant_faults.restart(0, 1, delay=60, wait=False)
            assert redreentrant_faults.down() == [0, 1]
            with pytest.raises(QuorumUnavailableError):
                redreentrant_manager.lock("job").acquire()
            redreentrant_faults.heal()       # the pending restarts happen now
            assert redreentrant_faults.down() == []
            lock = redreentrant_manager.lock("job")
            assert acquired_soon(lock, timeout=8)  # restarted empty: quarantined a lease
            lock.release()

        def test_left_broken(redreentrant_faults):
            redreentrant_faults.freeze(0)
            redreentrant_faults.kill(1)
            redreentrant_faults.restart(2, delay=60, wait=False)

        def test_healed_again(redreentrant_ensemble):
            assert all(s.running and not s.paused for s in redreentrant_ensemble)

        def test_bad_index(redreentrant_faults):
            with pytest.raises(IndexError):
                redreentrant_faults.kill(3)
            with pytest.raises(TypeError):
                redreentrant_faults.kill()
        """,
    )
    result.assert_outcomes(passed=8)


ASYNC_TESTS = """
    import asyncio
    import pytest
    from redreentrant.asyncio import LockManager, QuorumUnavailableError

    def test_with_asyncio_run(redreentrant_async_manager, redreentrant_faults):
        async def main():
            async with redreentrant_async_manager(lease=5.0) as mgr:
                assert isinstance(mgr, LockManager) and mgr.lease == 5.0
                redreentrant_faults.kill(0)
                async with mgr.lock("job"):
                    assert await mgr.lock("job").locked()
                redreentrant_faults.freeze(1)
                with pytest.raises(QuorumUnavailableError):
                    await mgr.lock("job").acquire()
        asyncio.run(main())

    @pytest.mark.redreentrant(masters=1, lease=7.0)
    def test_marker_settings(redreentrant_async_manager):
        async def main():
            async with redreentrant_async_manager() as mgr:
                return mgr.lease, mgr.quorum
        assert asyncio.run(main()) == (7.0, 1)

    def test_left_open(redreentrant_async_manager):
        redreentrant_async_manager()
"""


def test_asyncio_without_an_asyncio_plugin(pytester: pytest.Pytester) -> None:
    result = _run(pytester, ASYNC_TESTS)
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*1 asyncio LockManager(s) made by *were not closed*"])


def test_asyncio_with_pytest_asyncio(pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_asyncio")
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = _run(
        pytester,
        """
        import pytest

        @pytest.mark.asyncio
        async def test_coroutine(redreentrant_async_manager, redreentrant_faults):
            async with redreentrant_async_manager() as mgr, mgr.lock("job") as lock:
                redreentrant_faults.stop(2)
                assert lock.hold_count == 1 and await lock.locked()
        """,
        asyncio_plugin="asyncio",
    )
    result.assert_outcomes(passed=1)


def test_asyncio_with_anyio(pytester: pytest.Pytester) -> None:
    pytest.importorskip("anyio")
    result = _run(
        pytester,
        """
        import pytest

        @pytest.fixture
        def anyio_backend():
            return "asyncio"

        @pytest.mark.anyio
        async def test_coroutine(redreentrant_async_manager):
            async with redreentrant_async_manager() as mgr, mgr.lock("job") as lock:
                assert lock.hold_count == 1
        """,
        asyncio_plugin="anyio",
    )
    result.assert_outcomes(passed=1)


def test_nothing_happens_to_a_test_that_uses_no_fixture_of_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_server(self: LocalServer) -> None:
        raise AssertionError("a redis-server was started")

    monkeypatch.setattr(LocalServer, "spawn", no_server)
    # The project's own fixture names, and a test that reads markers and fixtures.
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture
        def ensemble():
            return "mine"

        @pytest.fixture
        def manager(ensemble):
            return "mine too"
        """
    )
    result = _run(
        pytester,
        """
        def test_plain():
            assert 1 + 1 == 2

        def test_own_fixtures(ensemble, manager, request):
            assert (ensemble, manager) == ("mine", "mine too")
            assert not [name for name in request.fixturenames if "redreentrant" in name]
        """,
        "--setup-show",
    )
    result.assert_outcomes(passed=2)
    result.stdout.no_fnmatch_line("*redreentrant_*")
    markers = pytester.runpytest("-p", "no:asyncio", "-p", "no:anyio", "--markers")
    markers.stdout.fnmatch_lines(["*@pytest.mark.redreentrant(masters=N*"])


def test_the_plugin_can_be_disabled(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        """
        def test_uses_it(redreentrant_manager):
            pass
        """,
        "-p",
        "no:redreentrant",
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'redreentrant_manager' not found*"])


MISSING = """
    def test_uses_it(redreentrant_manager):
        pass

    def test_plain():
        pass
"""


@pytest.mark.parametrize(
    ("ci", "ini", "outcome"),
    [
        ("", "", "skipped"),
        ("true", "", "errors"),
        ("true", "skip", "skipped"),
        ("", "fail", "errors"),
    ],
)
def test_without_a_redis_server(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    ci: str,
    ini: str,
    outcome: str,
) -> None:
    monkeypatch.setenv("REDIS_SERVER", str(tmp_path / "no-such-redis-server"))
    monkeypatch.setenv("CI", ci)
    if ini:
        pytester.makeini(f"[pytest]\nredreentrant_missing_server = {ini}\n")
    result = _run(pytester, MISSING, "-rs")
    result.assert_outcomes(passed=1, **{outcome: 1})
    result.stdout.fnmatch_lines(["*redreentrant fixtures need a redis-server*"])


def test_the_docs_example_runs_as_shown(pytester: pytest.Pytester) -> None:
    files = dict(FILE_BLOCK.findall(DOCS.read_text(encoding="utf-8")))
    assert {"billing.py", "test_billing.py", "test_billing_async.py"} <= set(files)
    for name, source in files.items():
        (pytester.path / name).write_text(source, encoding="utf-8")
    pytester.syspathinsert()
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:asyncio", "-p", "no:anyio")
    result.assert_outcomes(passed=8)
