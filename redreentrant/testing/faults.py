"""Faults on the masters of a :class:`~redreentrant.testing.LocalEnsemble`, by index,
and the way back: :class:`Faults`, :func:`heal` and :func:`lock_keys`.

What the pytest plugin's ``redreentrant_faults`` fixture hands a test, and usable
without pytest::

    from redreentrant.testing import LocalEnsemble
    from redreentrant.testing.faults import Faults

    with LocalEnsemble(3) as ensemble:
        faults = Faults(ensemble)
        faults.kill(0)                  # a minority down: locks still work
        faults.freeze(1)                # and one more silent: no quorum any more
        faults.heal()                   # everything running and answering again

Every fault is undone by :meth:`Faults.heal`. A master that was stopped, killed or
restarted comes back *empty* (the servers persist nothing), as a master without
persistence does after a crash.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from .ensemble import LocalEnsemble
from .loopback import client, remember_from_the_start
from .server import LocalServer, answering, start_all, stop_all

__all__ = ["Faults", "heal", "lock_keys", "remove_keys"]

_COMMAND_TIMEOUT = 5.0  # seconds for one SCAN or UNLINK batch on one server
_SCAN_COUNT = 1000


def heal(ensemble: LocalEnsemble, remember: bool = False) -> None:
    """Bring every master of ``ensemble`` back: resumed if frozen, started if down.

    Masters started here begin empty: quarantined (see docs/safety.md), unless
    ``remember`` (between tests: then every master's memory record is as at its first
    start, see :func:`.loopback.remember_from_the_start`). All that are down are spawned
    first and then awaited, so healing costs about one server's start, not one per
    master."""
    for server in ensemble.servers:
        if server.paused:
            server.resume()
    start_all([server for server in ensemble.servers if not server.running])
    if remember:
        for server in ensemble.servers:
            remember_from_the_start(server.port, _COMMAND_TIMEOUT, server.host)


def lock_keys(ensemble: LocalEnsemble, prefix: str) -> dict[int, set[str]]:
    """The keys starting with ``prefix`` on each running, unfrozen master, by index.

    Uses ``SCAN``, so a server with many other keys is not blocked."""
    found: dict[int, set[str]] = {}
    for server in answering(ensemble.servers):
        with client(server.port, timeout=_COMMAND_TIMEOUT) as connection:
            keys = connection.scan_iter(match=_glob_escape(prefix) + "*", count=_SCAN_COUNT)
            found[ensemble.servers.index(server)] = set(keys)
    return found


def remove_keys(ensemble: LocalEnsemble, keys: dict[int, set[str]]) -> None:
    """``UNLINK`` the given keys (by master index, as :func:`lock_keys` returns them) on
    the running, unfrozen masters; a master that is down has nothing to remove."""
    up = answering(ensemble.servers)
    for index, names in keys.items():
        server = ensemble.servers[index]
        if not names or server not in up:
            continue
        with client(server.port, timeout=_COMMAND_TIMEOUT) as connection:
            batch = sorted(names)
            for start in range(0, len(batch), _SCAN_COUNT):
                connection.unlink(*batch[start : start + _SCAN_COUNT])


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis glob pattern."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)


class Faults:
    """Stop, kill, freeze, thaw and restart the masters of ``ensemble`` by index.

    Each method takes one or more indices (``faults.kill(0, 1)``) and returns once the
    fault is in place. :meth:`heal` undoes them all. The ``redreentrant_faults``
    fixture calls it after the test.

    A stopped, killed or restarted master comes back empty: it forgets every lock it
    held, as a master without persistence does after a crash. Restart a master only
    after the longest lease (``delay=``) when the test must keep the Redlock
    assumptions. Otherwise a lock it held may be granted twice.
    """

    def __init__(self, ensemble: LocalEnsemble) -> None:
        self.ensemble = ensemble
        self._pending: list[threading.Timer] = []
        self._guard = threading.Lock()

    @property
    def size(self) -> int:
        """How many masters the ensemble has."""
        return self.ensemble.size

    @property
    def quorum(self) -> int:
        """How many masters a lock needs: ``size // 2 + 1``."""
        return self.size // 2 + 1

    def _servers(self, indices: Iterable[int]) -> list[LocalServer]:
        chosen = list(indices)
        if not chosen:
            raise TypeError("name at least one master by its index")
        for index in chosen:
            if not isinstance(index, int) or isinstance(index, bool):
                raise TypeError(f"a master's index must be an int, not {index!r}")
            if not 0 <= index < self.size:
                raise IndexError(f"no master {index}: the ensemble has {self.size} (0..)")
        return [self.ensemble.servers[index] for index in chosen]

    def stop(self, *indices: int) -> None:
        """Shut the masters down gracefully (SIGTERM): clients get their connections
        closed and then ``connection refused``."""
        stop_all(self._servers(indices))

    def kill(self, *indices: int) -> None:
        """Crash the masters (SIGKILL): as :meth:`stop`, without a shutdown."""
        for server in self._servers(indices):
            server.kill()

    def start(self, *indices: int) -> None:
        """Start masters that are down (empty); a running one is left as it is."""
        start_all([server for server in self._servers(indices) if not server.running])

    def freeze(self, *indices: int) -> None:
        """Freeze the masters (SIGSTOP): connections are accepted but nothing is
        answered, as in a long pause or a network partition. Clients time out."""
        for server in self._servers(indices):
            if not server.paused:
                server.pause()

    def thaw(self, *indices: int) -> None:
        """Undo :meth:`freeze` (SIGCONT); what was sent meanwhile is then answered."""
        for server in self._servers(indices):
            if server.paused:
                server.resume()

    def restart(self, *indices: int, delay: float = 0.0, wait: bool = True) -> None:
        """Stop the masters and start them again, on the same ports, empty.

        ``delay`` (seconds) keeps them down that long first (a restart "after the
        longest lease" keeps a lock safe). With ``wait=False`` the call returns once
        they are down and they come back by themselves after ``delay``, while the test
        goes on; :meth:`heal` brings them back at once.
        """
        if delay < 0:
            raise ValueError(f"delay must be >= 0, got {delay!r}")
        chosen = list(indices)
        self.stop(*chosen)
        if wait:
            if delay:
                time.sleep(delay)
            self.start(*chosen)
            return
        timer = threading.Timer(delay, self.start, args=chosen)
        timer.daemon = True
        with self._guard:
            self._pending.append(timer)
        timer.start()

    def down(self) -> list[int]:
        """The indices of the masters that do not answer: stopped, killed or frozen."""
        return [
            index
            for index, server in enumerate(self.ensemble.servers)
            if server.paused or not server.running
        ]

    def heal(self) -> None:
        """Undo every fault: delayed restarts happen now, frozen masters are thawed,
        masters that are down are started (empty)."""
        with self._guard:
            pending, self._pending = self._pending, []
        for timer in pending:
            timer.cancel()
            timer.join()  # one that already fired finishes its start first
        heal(self.ensemble)
