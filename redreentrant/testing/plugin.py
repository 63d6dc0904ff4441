"""A pytest plugin for testing code that takes redreentrant locks.

Testing an application's locking against a mock proves little: what matters is what
the quorum does when masters crash, freeze or come back empty. This plugin gives the
tests of a project that uses redreentrant real ``redis-server`` masters on
``127.0.0.1`` (a :class:`~redreentrant.testing.LocalEnsemble`, started once per session
and size), a fresh manager per test, a clean slate of lock keys after each test, and
faults on demand. See ``docs/testing.md`` for a walk-through.

It is registered through the ``pytest11`` entry point, so it is active wherever
redreentrant is installed, and it is opt-in by fixture use: it has no autouse fixture,
and its only hooks register its ini options and its marker. A test that uses none of
its fixtures runs as if it were not there, and no server is started for it.

Fixtures (all function-scoped but the first):

``redreentrant_ensembles``
    The session's ensembles, one per size, each started when a test first needs it and
    stopped at the end of the session: ``.get(size)``. For fixtures of a wider scope.
``redreentrant_masters``
    The size of this test's ensemble: ``@pytest.mark.redreentrant(masters=N)`` on the
    test, its class or module, else the ``redreentrant_masters`` ini option (default 3).
    Parametrize it to run a test on several sizes.
``redreentrant_ensemble``
    This test's :class:`~redreentrant.testing.LocalEnsemble`: every master running and
    answering when the test starts; afterwards every master is healed and the lock keys
    made during the test are removed.
``redreentrant_urls``
    The URLs of its masters.
``redreentrant_manager``
    A fresh :class:`redreentrant.LockManager` over them, closed after the test.
``redreentrant_async_manager``
    A factory of :class:`redreentrant.asyncio.LockManager` over them: call it in the
    test's event loop (``async with redreentrant_async_manager() as mgr:``). It needs no
    asyncio pytest plugin (the test may run its own ``asyncio.run``) and works with
    pytest-asyncio or anyio's plugin.
``redreentrant_faults``
    A :class:`~redreentrant.testing.faults.Faults` for the ensemble: stop, kill,
    freeze, thaw and restart masters by index; all healed after the test.
``redreentrant_netlab``
    A fresh :class:`~redreentrant.testing.NetLab` of ``redreentrant_masters`` masters
    (no client paths): real packet faults (cut, loss, delay) in a network namespace of
    the test's own, deleted after the test. Linux and root only: elsewhere the test is
    skipped, with the reason (:func:`~redreentrant.testing.netlab.available`).
``redreentrant_clocks``
    ``(ensemble, clocks)``: a fresh ensemble of ``redreentrant_masters`` masters whose
    every master has a :class:`~redreentrant.testing.clocks.ServerClock` of its own
    (``clocks[i]`` is master i's: fast, slow or jumping clocks), stopped after the
    test. Skipped, with the reason, where the clock shim cannot be built (no C
    compiler, not Linux: :func:`~redreentrant.testing.clocks.available`).

The marker's other keywords (``lease``, ``master_timeout``, ``drift_factor``,
``retry_jitter``, ``fencing``, ``on_lost``) are the settings of the managers these
fixtures make.

Without a ``redis-server`` binary (see :func:`~redreentrant.testing.find_redis_server`)
the tests that use the fixtures are skipped, or fail where the ``CI`` environment
variable is true; the ``redreentrant_missing_server`` ini option (``auto``, ``skip``,
``fail``) decides otherwise.

Importing this module imports pytest; ``import redreentrant.testing`` does not.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

import redreentrant.asyncio
from redreentrant import LockManager
from redreentrant._core.keys import PREFIX

from .binary import RedisServerNotFound, find_redis_server
from .clocks import ServerClock, clocked_ensemble
from .clocks import available as clocks_available
from .ensemble import LocalEnsemble
from .faults import Faults, heal, lock_keys, remove_keys
from .netlab import NetLab, available

# The fixtures are found by pytest through the entry point, not imported.
__all__ = ["AsyncManagerFactory", "EnsemblePool"]

MARKER = "redreentrant"
MASTERS_INI = "redreentrant_masters"
MISSING_SERVER_INI = "redreentrant_missing_server"
DEFAULT_MASTERS = 3

#: the keywords of the marker that are settings of the managers the fixtures make
MANAGER_OPTIONS = frozenset(
    {"lease", "master_timeout", "drift_factor", "retry_jitter", "fencing", "on_lost"}
)
_MISSING_SERVER_CHOICES = ("auto", "skip", "fail")
_TRUE = ("1", "true", "yes")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        MASTERS_INI,
        help="redreentrant plugin: masters in a test's local ensemble unless its "
        f"'{MARKER}' marker says (default {DEFAULT_MASTERS})",
        default=str(DEFAULT_MASTERS),
    )
    parser.addini(
        MISSING_SERVER_INI,
        help="redreentrant plugin: without a redis-server binary, 'skip' or 'fail' the "
        "tests that use its fixtures; 'auto' (default) fails if $CI is true, else skips",
        default="auto",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(masters=N, **manager_settings): the size of the local ensemble of the "
        "redreentrant fixtures (and settings such as lease=, fencing= of the managers "
        "they make)",
    )


class EnsemblePool:
    """The session's local ensembles, one per size, started when first asked for.

    :meth:`get` raises :class:`~redreentrant.testing.RedisServerNotFound` when there is no
    ``redis-server`` binary; :meth:`close` stops every ensemble.
    """

    def __init__(self) -> None:
        self._ensembles: dict[int, LocalEnsemble] = {}
        self._binary: str | None = None

    def get(self, size: int) -> LocalEnsemble:
        """The running ensemble of ``size`` masters (started on the first call)."""
        if size < 1:
            raise ValueError(f"an ensemble needs at least 1 master, got {size}")
        ensemble = self._ensembles.get(size)
        if ensemble is None:
            if self._binary is None:
                self._binary = find_redis_server()
            ensemble = LocalEnsemble(size, binary=self._binary).start()
            self._ensembles[size] = ensemble
        return ensemble

    @property
    def sizes(self) -> list[int]:
        """The sizes started so far."""
        return sorted(self._ensembles)

    def close(self) -> None:
        """Stop every ensemble (and remove its directories)."""
        ensembles, self._ensembles = list(self._ensembles.values()), {}
        for ensemble in ensembles:
            ensemble.stop()


class AsyncManagerFactory:
    """Makes :class:`redreentrant.asyncio.LockManager` s over one test's masters.

    Call it inside the test's event loop, and close what it returns, best with
    ``async with``::

        async with redreentrant_async_manager(lease=5.0) as mgr:
            ...

    Keywords are :class:`~redreentrant.asyncio.LockManager` settings; they override the
    ``redreentrant`` marker's. A manager left open at the end of the test is an error
    (its loop is gone by then, so it can no longer be closed for the test).
    """

    def __init__(self, urls: list[str], options: dict[str, Any]) -> None:
        self.urls = list(urls)
        self._options = dict(options)
        self._made: list[redreentrant.asyncio.LockManager] = []

    def __call__(self, **options: Any) -> redreentrant.asyncio.LockManager:
        manager = redreentrant.asyncio.LockManager(self.urls, **{**self._options, **options})
        self._made.append(manager)
        return manager

    def left_open(self) -> list[redreentrant.asyncio.LockManager]:
        """The managers made here and not closed."""
        return [manager for manager in self._made if not manager.closed]


def _marker_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The keywords of every ``redreentrant`` marker on the test, its class and module,
    the closest winning."""
    settings: dict[str, Any] = {}
    for marker in request.node.iter_markers(MARKER):  # the closest first
        if marker.args:
            pytest.fail(
                f"@pytest.mark.{MARKER} takes keywords only, e.g. masters=5; got {marker.args!r}",
                pytrace=False,
            )
        for key, value in marker.kwargs.items():
            settings.setdefault(key, value)
    unknown = set(settings) - MANAGER_OPTIONS - {"masters"}
    if unknown:
        pytest.fail(
            f"@pytest.mark.{MARKER}: unknown keyword(s) {sorted(unknown)}; "
            f"known: masters, {', '.join(sorted(MANAGER_OPTIONS))}",
            pytrace=False,
        )
    return settings


def _manager_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    return {k: v for k, v in _marker_settings(request).items() if k in MANAGER_OPTIONS}


def _size(value: object, where: str) -> int:
    """``value`` (an int, or the text of one from an ini file) as a number of masters."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        pytest.fail(
            f"{where}: the number of masters must be an int >= 1, got {value!r}",
            pytrace=False,
        )
    return value


def _missing_server(config: pytest.Config, error: RedisServerNotFound) -> NoReturn:
    choice = str(config.getini(MISSING_SERVER_INI)).strip().lower() or "auto"
    if choice not in _MISSING_SERVER_CHOICES:
        pytest.fail(
            f"ini option {MISSING_SERVER_INI} must be one of "
            f"{', '.join(_MISSING_SERVER_CHOICES)}; got {choice!r}",
            pytrace=False,
        )
    in_ci = os.environ.get("CI", "").strip().lower() in _TRUE
    message = f"redreentrant fixtures need a redis-server: {error}"
    if choice == "fail" or (choice == "auto" and in_ci):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _binary(request: pytest.FixtureRequest, unavailable: str | None) -> str:
    """The ``redis-server`` for a fixture that makes its own servers; the test is
    skipped with ``unavailable``, the reason they cannot be made here, if there is one."""
    if unavailable is not None:
        pytest.skip(unavailable)
    try:
        return find_redis_server()
    except RedisServerNotFound as error:
        _missing_server(request.config, error)


@pytest.fixture(scope="session")
def redreentrant_ensembles() -> Iterator[EnsemblePool]:
    """The session's local ensembles (an :class:`EnsemblePool`), one per size, started
    when first asked for and stopped at the end of the session.

    Tests want :func:`redreentrant_ensemble`; this is for fixtures of a wider scope
    (module, session), which do their own healing and clean-up."""
    pool = EnsemblePool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def redreentrant_masters(request: pytest.FixtureRequest) -> int:
    """How many masters this test's ensemble has: the ``redreentrant`` marker's
    ``masters=`` on the test (or its class or module), else the ``redreentrant_masters``
    ini option (default 3). Parametrize this fixture's name to run a test on several
    sizes."""
    settings = _marker_settings(request)
    if "masters" in settings:
        return _size(settings["masters"], f"@pytest.mark.{MARKER}(masters=...)")
    return _size(request.config.getini(MASTERS_INI), f"ini option {MASTERS_INI}")


@pytest.fixture
def redreentrant_ensemble(
    request: pytest.FixtureRequest,
    redreentrant_ensembles: EnsemblePool,
    redreentrant_masters: int,
) -> Iterator[LocalEnsemble]:
    """This test's :class:`~redreentrant.testing.LocalEnsemble` of
    ``redreentrant_masters`` masters on ``127.0.0.1``, shared with the other tests of the
    session that ask for the same size.

    Before the test every master is running and answering. After it, every master is
    healed (started if down, thawed if frozen) and the keys under redreentrant's prefix
    that were not there when the test started are removed, on every master: locks,
    queues, fencing counters. Other keys (your application's data) are left alone."""
    try:
        ensemble = redreentrant_ensembles.get(redreentrant_masters)
    except RedisServerNotFound as error:
        _missing_server(request.config, error)
    heal(ensemble, remember=True)
    before = lock_keys(ensemble, PREFIX + "{")
    yield ensemble
    heal(ensemble, remember=True)
    after = lock_keys(ensemble, PREFIX + "{")
    remove_keys(ensemble, {index: keys - before.get(index, set()) for index, keys in after.items()})


@pytest.fixture
def redreentrant_urls(redreentrant_ensemble: LocalEnsemble) -> list[str]:
    """The ``redis://127.0.0.1:PORT/0`` URLs of this test's masters."""
    return redreentrant_ensemble.urls


@pytest.fixture
def redreentrant_manager(
    request: pytest.FixtureRequest, redreentrant_urls: list[str]
) -> Iterator[LockManager]:
    """A fresh :class:`redreentrant.LockManager` over this test's masters, with the
    ``redreentrant`` marker's settings, closed after the test."""
    with LockManager(redreentrant_urls, **_manager_settings(request)) as manager:
        yield manager


@pytest.fixture
def redreentrant_async_manager(
    request: pytest.FixtureRequest, redreentrant_urls: list[str]
) -> Iterator[AsyncManagerFactory]:
    """A factory of :class:`redreentrant.asyncio.LockManager` s over this test's
    masters (an :class:`AsyncManagerFactory`). Call it in the test's event loop and
    close what it makes: ``async with redreentrant_async_manager() as mgr:``.

    A factory rather than a manager, because a manager belongs to the event loop it runs
    in, and the loop is the test's: the test may run it with ``asyncio.run`` (no plugin
    needed), or be a coroutine run by pytest-asyncio or anyio's plugin."""
    factory = AsyncManagerFactory(redreentrant_urls, _manager_settings(request))
    yield factory
    left = factory.left_open()
    if left:
        pytest.fail(
            f"{len(left)} asyncio LockManager(s) made by redreentrant_async_manager were "
            "not closed: use 'async with redreentrant_async_manager() as mgr:' or "
            "'await mgr.close()' in the test's event loop",
            pytrace=False,
        )


@pytest.fixture
def redreentrant_faults(redreentrant_ensemble: LocalEnsemble) -> Iterator[Faults]:
    """Faults on this test's masters by index (a
    :class:`~redreentrant.testing.faults.Faults`): ``stop``, ``kill``, ``freeze``,
    ``thaw``, ``restart`` (``delay=``, ``wait=``), ``start``, ``down()``. Every master is
    healed after the test."""
    faults = Faults(redreentrant_ensemble)
    try:
        yield faults
    finally:
        faults.heal()


@pytest.fixture
def redreentrant_netlab(
    request: pytest.FixtureRequest, redreentrant_masters: int
) -> Iterator[NetLab]:
    """A fresh :class:`~redreentrant.testing.NetLab` of ``redreentrant_masters``
    masters, started, and closed after the test (its namespace, rules and processes
    gone). Skipped, with the reason, where labs cannot be made (not Linux, not root, no
    ``ip``, ``nft`` or ``iptables``)."""
    with NetLab(redreentrant_masters, binary=_binary(request, available())) as lab:
        yield lab


@pytest.fixture
def redreentrant_clocks(
    request: pytest.FixtureRequest, redreentrant_masters: int
) -> Iterator[tuple[LocalEnsemble, list[ServerClock]]]:
    """A fresh ensemble of ``redreentrant_masters`` masters, each with its own
    :class:`~redreentrant.testing.clocks.ServerClock` (``clocks[i]`` is master i's):
    ``ensemble, clocks = redreentrant_clocks; clocks[0].rate(10)``. Stopped, and the
    clocks' files removed, after the test. Skipped, with the reason, where the clock
    shim cannot be built (no C compiler, not Linux)."""
    binary = _binary(request, clocks_available())
    with clocked_ensemble(redreentrant_masters, binary=binary) as pair:
        yield pair
