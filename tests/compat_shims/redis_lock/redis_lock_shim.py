"""A pytest plugin (``-p redis_lock_shim``) for python-redis-lock's own tests.

Their ``redis_server`` fixture starts ``redis-server`` from the PATH on a unix socket
(no TCP port): the PATH is made to start with the binary redreentrant's tests use
(:func:`redreentrant.testing.find_redis_server`), so they run against the same server.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from redreentrant.testing import RedisServerNotFound, find_redis_server


def pytest_configure(config: pytest.Config) -> None:
    try:
        binary = find_redis_server()
    except RedisServerNotFound:
        return
    bin_dir = tempfile.mkdtemp(prefix="redis-lock-shim-")
    os.symlink(binary, os.path.join(bin_dir, "redis-server"))
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    config.add_cleanup(lambda: shutil.rmtree(bin_dir, ignore_errors=True))
