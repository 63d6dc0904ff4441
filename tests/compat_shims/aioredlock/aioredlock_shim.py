"""A pytest plugin (``-p aioredlock_shim``) that runs aioredlock's own tests against
redreentrant.compat.aioredlock, by hand: aioredlock's source distribution has no tests,
so they come from a checkout of its repository (0.7.3), copied outside the project::

    git -C CHECKOUT archive HEAD tests setup.cfg | tar x -C /tmp/aioredlock
    pip install --target /tmp/aioredlock-deps "aioredis<2" async-timeout
    cd /tmp/aioredlock && PYTHONPATH=THIS_DIR:/tmp/aioredlock-deps \\
        python -m pytest -p aioredlock_shim -o addopts= -o junit_family=xunit1 \\
        -o asyncio_default_fixture_loop_scope=function \\
        tests/acceptance tests/ut/test_algorithm.py tests/ut/test_lock.py

(aioredis 1.x only for the tests that use it themselves; the adapter does not. The
``-o`` options: its setup.cfg's ``junit_family = xunit`` is refused by current pytest, and
its ``filterwarnings = error`` makes pytest-asyncio's warning about an unset loop scope
an error.) Of the 56 tests 24 pass: 7 of the 8 acceptance tests (not the one that
passes an aioredis 1.x pool), the 16 argument checks and ``TestLock::test_lock``. The
others patch or call aioredlock's internals (``aioredlock.algorithm.Redis``, the
``_validate_*`` methods), or (``TestLock::test_extend``, ``test_release``) make an
``asyncio.Future()`` outside a running loop, refused on Python 3.11 with
pytest-asyncio 1.x (no current event loop; the real aioredlock's ``test_release`` fails
so too).

- This directory comes first on the import path, so ``aioredlock`` is the shim package
  beside this file; the plugin checks it.
- The tests' ``redis_one_connection`` and ``redis_two_connections`` fixtures name
  localhost:6379, databases 0 and 1 (two "instances" of one server). Before each test
  their values are rewritten in place to local ``redis-server`` masters on free ports,
  database ``n`` to master ``n`` (independent masters, as the adapter requires),
  started for the session; the adapter's default master (localhost:6379) is master 0.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from redreentrant.testing import LocalEnsemble

SHIMS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SHIMS)

FIXTURES = ("redis_one_connection", "redis_two_connections")

_ensembles: list[LocalEnsemble] = []


def _local(connection: dict[str, Any]) -> None:
    """Point one of the tests' connection dicts (localhost:6379/db) at a local master."""
    if connection.get("host") == "localhost" and connection.get("port", 6379) == 6379:
        servers = _ensembles[0].servers
        server = servers[int(connection.get("db", 0)) % len(servers)]
        connection.update(host=server.host, port=server.port, db=0)


def pytest_configure(config: pytest.Config) -> None:
    import aioredlock

    from redreentrant.compat.aioredlock import Aioredlock

    if os.path.dirname(os.path.dirname(os.path.abspath(aioredlock.__file__ or ""))) != SHIMS:
        raise pytest.UsageError(f"aioredlock is not the shim but {aioredlock.__file__}")
    ensemble = LocalEnsemble(2).start()
    _ensembles.append(ensemble)
    defaults = list(Aioredlock.__init__.__defaults__ or ())
    for connection in defaults[0]:
        _local(connection)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    funcargs = getattr(item, "funcargs", {})
    for name in FIXTURES:
        for connection in funcargs.get(name, ()):
            _local(connection)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _ensembles:
        _ensembles.pop().stop()
