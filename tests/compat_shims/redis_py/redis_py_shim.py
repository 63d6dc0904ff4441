"""A pytest plugin (``-p redis_py_shim``) that runs redis-py's own lock tests against
:mod:`redreentrant.compat.redis_py`.

- ``redis.lock.Lock`` and ``redis.asyncio.lock.Lock`` become the adapter's ``Lock`` and
  ``AsyncLock`` before the test modules import them (they pass ``lock_class=Lock``).
- Unless ``--redis-url`` is given, a :class:`~redreentrant.testing.LocalServer` is
  started on a free port of 127.0.0.1 for the session, and every URL redis-py's
  conftest would reach (``--redis-url``, ``--redis-mod-url``, ``--redis-ssl-url``) is
  pointed at it, so nothing else is contacted.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis.asyncio.lock
import redis.lock

from redreentrant.compat.redis_py import AsyncLock, Lock
from redreentrant.testing import LocalServer

redis.lock.Lock = Lock
redis.asyncio.lock.Lock = AsyncLock

_server: LocalServer | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    global _server
    option = config.option
    if getattr(option, "redis_url", None) in (None, "redis://localhost:6379/0"):
        _server = LocalServer()
        _server.start()
        option.redis_url = _server.url
    option.redis_mod_url = option.redis_url
    option.redis_ssl_url = option.redis_url.replace("redis://", "rediss://")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _server is not None:
        _server.close()


@pytest.fixture(autouse=True)
def _adapter_in_place() -> Iterator[None]:
    """The adapters stay in place for every test (a test must not undo them)."""
    yield
    assert redis.lock.Lock is Lock and redis.asyncio.lock.Lock is AsyncLock
