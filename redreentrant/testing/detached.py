"""Detached ensembles (``redreentrant ensemble up/status/down``): their description,
whether each server is up, and stopping them from another process.

:meth:`redreentrant.testing.LocalEnsemble.detach` leaves its servers running and returns
a JSON-ready description of them, made by :func:`describe`; the functions here take
that description, possibly in a later process. Pids get reused: a pid is only signalled
while it is still the ``redis-server`` of its port.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Sequence
from typing import Any

from .loopback import pid_on
from .server import STOP_TIMEOUT

__all__ = [
    "DIRECTORY_PREFIX",
    "describe",
    "detached_servers",
    "detached_status",
    "stop_detached",
]

DIRECTORY_PREFIX = "redreentrant-ensemble-"
"""How an ensemble's directory is named: the only kind :func:`stop_detached` removes."""

_POLL_INTERVAL = 0.01


def describe(directory: str, binary: str, servers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The description of a detached ensemble in ``directory``: ``servers`` are each
    ``{"port": ..., "pid": ..., "dir": ...}``."""
    return {"version": 1, "dir": directory, "binary": binary, "servers": list(servers)}


def detached_servers(state: dict[str, Any]) -> list[tuple[int, int]]:
    """(port, pid) of every server in a :meth:`LocalEnsemble.detach` description.

    :raises ValueError: ``state`` is not such a description.
    """
    try:
        return [(int(s["port"]), int(s["pid"])) for s in state["servers"]]
    except (KeyError, TypeError, ValueError):
        raise ValueError("not a description of a detached ensemble") from None


def detached_status(state: dict[str, Any]) -> list[tuple[int, int, str]]:
    """(port, pid, ``"up"`` | ``"not answering"`` | ``"down"``) of each detached server."""
    out = []
    for port, pid in detached_servers(state):
        if pid_on(port) == pid:
            word = "up"
        elif _is_our_server(pid, port):
            word = "not answering"
        else:
            word = "down"
        out.append((port, pid, word))
    return out


def stop_detached(state: dict[str, Any], timeout: float = STOP_TIMEOUT) -> int:
    """Stop the servers of a detached ensemble that are still ours (pids get reused:
    a pid is only signalled while it is still that redis-server), remove its directory,
    and return how many were stopped."""
    pids = [pid for port, pid in detached_servers(state) if _is_our_server(pid, port)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # a stopped process would not act on SIGTERM
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(_POLL_INTERVAL)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    directory = state.get("dir")
    # Only a directory an ensemble made: a corrupt description must not delete others.
    if (
        isinstance(directory, str)
        and os.path.basename(directory).startswith(DIRECTORY_PREFIX)
        and os.path.isdir(directory)
    ):
        shutil.rmtree(directory, ignore_errors=True)
    return len(pids)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            # The state follows the parenthesised command name, which may hold spaces.
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _is_our_server(pid: int, port: int) -> bool:
    """Whether ``pid`` is still the redis-server (or valkey-server) started on ``port``."""
    if not _alive(pid):
        return False
    if pid_on(port) == pid:
        return True
    try:  # not answering (e.g. stopped): recognise it by its command line
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ")
    except OSError:
        return False
    # The server's own title, "redis-server 127.0.0.1:PORT" (Valkey's: "valkey-server").
    named = b"redis-server" in cmdline or b"valkey-server" in cmdline
    return named and str(port).encode() in cmdline
