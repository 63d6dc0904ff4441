"""A pytest plugin (``-p pottery_shim``) that runs pottery's own lock tests
(tests/test_redlock.py, tests/test_aioredlock.py) against redreentrant.compat.pottery.

- pottery's lock names (``Redlock``, ``AIORedlock``, ``synchronize`` and the lock
  exceptions) are replaced by the adapter's in the modules the tests import them from;
  everything else (``ContextTimer``, ``pottery.base.logger``) stays the real pottery's.
- pottery's conftest.py, which its source distribution lacks, gave the ``redis_url``,
  ``redis`` and ``aioredis`` fixtures for a server on localhost:6379: here they are for
  local masters on free ports (five, started when the session starts).
- Clients the tests make from ``redis://localhost:6379/<db>`` (test_contention's five
  "masters", five databases of one server) are redirected to master ``db % 5``: five
  independent masters, as the adapter requires.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import pottery
import pottery.aioredlock
import pottery.exceptions
import pottery.redlock
import pytest
import redis as redis_py
from redis.asyncio import Redis as AIORedis

from redreentrant.compat import pottery as adapter
from redreentrant.testing import LocalEnsemble

REPLACED = (
    "Redlock",
    "AIORedlock",
    "synchronize",
    "PrimitiveError",
    "QuorumNotAchieved",
    "TooManyExtensions",
    "ExtendUnlockedLock",
    "ReleaseUnlockedLock",
    "QuorumIsImpossible",
)

for module in (pottery, pottery.redlock, pottery.aioredlock, pottery.exceptions):
    for name in REPLACED:
        if hasattr(module, name):
            setattr(module, name, getattr(adapter, name))

_ensemble: list[LocalEnsemble] = []


def _redirect(url: str) -> str:
    """A URL of localhost:6379 (pottery's tests' server) as one of the local masters."""
    parts = urlsplit(url)
    if parts.hostname in ("localhost", "127.0.0.1") and parts.port in (None, 6379):
        db = int(parts.path.strip("/") or 0)
        servers = _ensemble[0].servers
        return servers[db % len(servers)].url
    return url


_sync_from_url = redis_py.Redis.from_url.__func__  # type: ignore[attr-defined]
_async_from_url = AIORedis.from_url.__func__  # type: ignore[attr-defined]


def _sync_redirected(cls: type[redis_py.Redis], url: str, **kwargs: Any) -> redis_py.Redis:
    return _sync_from_url(cls, _redirect(url), **kwargs)  # type: ignore[no-any-return]


def _async_redirected(cls: type[Any], url: str, *args: Any, **kwargs: Any) -> Any:
    return _async_from_url(cls, _redirect(url), *args, **kwargs)


def pytest_configure(config: pytest.Config) -> None:
    ensemble = LocalEnsemble(5).start()
    _ensemble.append(ensemble)
    redis_py.Redis.from_url = classmethod(_sync_redirected)  # type: ignore[method-assign,assignment]
    AIORedis.from_url = classmethod(_async_redirected)  # type: ignore[method-assign,assignment]
    # pottery's default master (Redlock without masters=), read when first used.
    os.environ["REDIS_URL"] = ensemble.servers[0].url


def pytest_unconfigure(config: pytest.Config) -> None:
    while _ensemble:
        _ensemble.pop().stop()


@pytest.fixture(scope="session")
def redis_url() -> str:
    return _ensemble[0].servers[0].url


@pytest.fixture
def redis(redis_url: str) -> Iterator[redis_py.Redis]:
    client = redis_py.Redis.from_url(redis_url, socket_timeout=1)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
async def aioredis(redis_url: str) -> AsyncIterator[Any]:
    client = AIORedis.from_url(redis_url, socket_timeout=1)
    await client.flushdb()
    yield client
    await client.flushdb()
    await client.aclose()
