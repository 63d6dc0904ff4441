"""Deprecated: the local ensemble moved to :mod:`redreentrant.testing`.

This module re-exports the same objects from there, and warns (``DeprecationWarning``)
when imported; it will be removed in the next release. Replace::

    from redreentrant.ensemble import LocalEnsemble

with::

    from redreentrant.testing import LocalEnsemble
"""

import warnings

from .testing import (
    LocalEnsemble,
    LocalServer,
    RedisServerNotFound,
    detached_servers,
    detached_status,
    die_with_parent,
    find_redis_server,
    redis_server_version,
    stop_detached,
)
from .testing.loopback import HOST

__all__ = [
    "HOST",
    "LocalEnsemble",
    "LocalServer",
    "RedisServerNotFound",
    "detached_servers",
    "detached_status",
    "die_with_parent",
    "find_redis_server",
    "redis_server_version",
    "stop_detached",
]

warnings.warn(
    "redreentrant.ensemble is deprecated and will be removed in the next release; "
    "import the same names from redreentrant.testing",
    DeprecationWarning,
    stacklevel=2,
)
