"""``N`` independent local masters for Redlock tests: :class:`LocalEnsemble` (see
:mod:`redreentrant.testing`), and the directory of a group of servers (an ensemble, a
cluster), which the safety nets remove until the group does."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import cleanup, reaper
from .binary import find_redis_server
from .detached import DIRECTORY_PREFIX, describe
from .loopback import client, free_ports, remember_from_the_start
from .server import START_TIMEOUT, STOP_TIMEOUT, LocalServer, answering, start_all, stop_all

__all__ = ["LocalEnsemble", "make_directory", "remove_directory"]

_COMMAND_TIMEOUT = 5.0  # seconds for flushall() and keys() on one server


def make_directory(
    owner: object, stop: Callable[[], None], binary: str | None, base_dir: str | None
) -> tuple[str, str]:
    """(the server binary, a fresh directory) for a group of servers: ``stop`` runs at
    exit, and the reaper removes the directory after a hard kill, until
    :func:`remove_directory`."""
    resolved = find_redis_server(binary)
    directory = os.path.abspath(tempfile.mkdtemp(prefix=DIRECTORY_PREFIX, dir=base_dir))
    cleanup.track(owner, stop)
    reaper.watch_dir(directory, resolved)
    return resolved, directory


def remove_directory(owner: object, directory: str) -> None:
    """Remove a group's directory, and take it and ``owner`` off the safety nets."""
    shutil.rmtree(directory, ignore_errors=True)
    reaper.forget_dir(directory)
    cleanup.untrack(owner)


class LocalEnsemble:
    """``size`` independent ``redis-server`` masters on ``127.0.0.1``, for Redlock tests.

    Ports are chosen at construction (distinct, free at that moment) so :attr:`urls` is
    known before :meth:`start`. A temp dir (inside ``base_dir`` if given) is created at
    construction, with one subdirectory per server; :meth:`stop` stops every process and
    removes it. After :meth:`stop` the ensemble cannot be started again: make a new one.
    Individual servers can be killed, paused, restarted and started again freely.

    :param size: number of servers, at least 1.
    :param binary: ``redis-server`` to run; default :func:`find_redis_server`.
    :param base_dir: parent directory for the ensemble's temp dir; default the system one.
    :param extra_args: extra ``redis-server`` arguments given to every server.
    :param server_env: the variables added to server ``index``'s environment, by index
        (e.g. each master's own clock: :func:`redreentrant.testing.clocks.clocked_ensemble`).
    """

    def __init__(
        self,
        size: int = 5,
        *,
        binary: str | None = None,
        base_dir: str | None = None,
        extra_args: Sequence[str] = (),
        server_env: Callable[[int], Mapping[str, str]] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self._stopped = False
        resolved, self.directory = make_directory(self, self.stop, binary, base_dir)
        self.servers: list[LocalServer] = [
            LocalServer(
                binary=resolved,
                directory=os.path.join(self.directory, f"server{index}"),
                port=None,
                extra_args=extra_args,
                env=server_env(index) if server_env is not None else None,
            )
            for index in range(size)
        ]
        # Reassign ports from one batch so no two servers of the ensemble share one.
        for server, port in zip(self.servers, free_ports(size), strict=True):
            server.port = port

    @property
    def size(self) -> int:
        """Number of servers."""
        return len(self.servers)

    @property
    def urls(self) -> list[str]:
        """``redis://127.0.0.1:PORT/0`` of every server, in index order."""
        return [server.url for server in self.servers]

    def __len__(self) -> int:
        return len(self.servers)

    def __getitem__(self, index: int) -> LocalServer:
        return self.servers[index]

    def __repr__(self) -> str:
        return f"<LocalEnsemble size={self.size} urls={self.urls}>"

    def start(self, timeout: float = START_TIMEOUT) -> LocalEnsemble:
        """Start every server that is not running and wait until all answer ``PING``.

        All processes are spawned first and then awaited, so startup costs about one
        server's start time, not ``size`` of them. Returns ``self`` for chaining.

        :raises RuntimeError: a server did not come up (all servers are then stopped),
            or the ensemble was already stopped.
        """
        if self._stopped:
            raise RuntimeError("this LocalEnsemble was stopped; create a new one")
        try:
            start_all([server for server in self.servers if not server.running], timeout)
        except BaseException:
            stop_all(self.servers)
            raise
        return self

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop every server (SIGTERM, SIGKILL after ``timeout``) and remove the temp dir.

        Idempotent, and also run at interpreter exit for ensembles not stopped by then.
        """
        stop_all(self.servers, timeout)
        self._stopped = True
        remove_directory(self, self.directory)

    def __enter__(self) -> LocalEnsemble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def detach(self) -> dict[str, Any]:
        """Leave the servers running after this process exits, and describe them.

        For ``redreentrant ensemble up``: the servers are taken off the exit-time
        clean-up and the reaper's list, and forgotten by this object (which can no longer
        be used). The returned description (ports, pids, directories; JSON-ready) is
        what :func:`~redreentrant.testing.detached_status` and
        :func:`~redreentrant.testing.stop_detached` take.
        """
        cleanup.untrack(self)
        servers = [server.detach() for server in self.servers]
        reaper.forget_dir(self.directory)
        self._stopped = True
        return describe(self.directory, self.servers[0].binary, servers)

    def flushall(self) -> None:
        """Empty every running, unpaused server between tests: ``FLUSHALL``, then its
        memory record as at its first start (see :func:`.loopback.remember_from_the_start`),
        so that its votes count at once. (A ``FLUSHALL`` alone is a fault: the server is
        quarantined.)"""
        for server in answering(self.servers):
            with client(server.port, timeout=_COMMAND_TIMEOUT) as connection:
                connection.flushall()
            remember_from_the_start(server.port, _COMMAND_TIMEOUT)

    def keys(self, pattern: str = "*") -> dict[str, list[str]]:
        """Map each running, unpaused server's URL to its keys matching ``pattern``.

        Meant for leak checks in tests (uses ``KEYS``, fine on tiny test datasets).
        Keys are sorted; stopped and paused servers are left out.
        """
        result: dict[str, list[str]] = {}
        for server in answering(self.servers):
            with client(server.port, timeout=_COMMAND_TIMEOUT) as connection:
                result[server.url] = sorted(connection.keys(pattern))
        return result
