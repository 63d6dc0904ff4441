"""A pytest plugin (``-p redlock_shim``) that runs redlock-py's own tests
(tests/test_redlock.py) against redreentrant.compat.redlock.

- This directory comes first on the import path, so ``import redlock`` is the shim
  beside this file (``python -m pytest`` put the source directory, which holds the real
  ``redlock`` package, first); the plugin checks it.
- The tests make ``Redlock([{"host": "localhost"}])``, a client of localhost:6379: the
  clients made through ``redis.StrictRedis`` for localhost:6379 are clients of a local
  ``redis-server`` on a free port instead, started for the session.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import redis

from redreentrant.testing import LocalServer

SHIMS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SHIMS)

_servers: list[LocalServer] = []


class LocalStrictRedis(redis.Redis):
    """``redis.StrictRedis``, with localhost:6379 (the tests' server) the local one."""

    def __init__(self, host: str = "localhost", port: int = 6379, *args: Any, **kwargs: Any):
        if host == "localhost" and int(port) == 6379:
            host, port = _servers[0].host, _servers[0].port
        super().__init__(host, port, *args, **kwargs)


def pytest_configure(config: pytest.Config) -> None:
    import redlock

    if os.path.dirname(os.path.abspath(redlock.__file__ or "")) != SHIMS:
        raise pytest.UsageError(f"redlock is not the shim but {redlock.__file__}")
    server = LocalServer()
    server.start()
    _servers.append(server)
    redis.StrictRedis = LocalStrictRedis  # type: ignore[misc]


def pytest_unconfigure(config: pytest.Config) -> None:
    while _servers:
        _servers.pop().close()
