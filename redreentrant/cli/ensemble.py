"""``redreentrant ensemble up|status|down``: local masters for development.

``up`` starts a :class:`redreentrant.testing.LocalEnsemble`, detaches it and records its
description in a state file; ``status`` and ``down`` read that file, in later
processes, through :func:`redreentrant.testing.detached_status` and
:func:`redreentrant.testing.stop_detached`; ``top`` finds the masters there when it is
given none (:func:`local_masters`).

The state file is per user: it names pids that ``down`` signals and a directory it
removes, so nobody else may write it. By default it lives in a directory of the user's
own, ``$XDG_RUNTIME_DIR/redreentrant/`` (when that is a directory of the user's), else
``redreentrant-<uid>`` in the temp directory, made with mode 0700; a directory owned by
someone else, or a symbolic link, is refused, and so is a state file there owned by
someone else.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

from redreentrant.testing import LocalEnsemble, detached_servers, detached_status, stop_detached

from .common import (
    EXIT_FAILED,
    EXIT_OK,
    MASTERS_ENV,
    PROG,
    Add,
    CliError,
    first_line,
    masters_option,
    positive_int,
    warn,
)

__all__ = [
    "STATE_ENV",
    "cmd_ensemble_down",
    "cmd_ensemble_status",
    "cmd_ensemble_up",
    "local_masters",
    "register",
    "state_dir",
]

STATE_ENV = "REDREENTRANT_ENSEMBLE_STATE"
STATE_FILE = "ensemble.json"
HOST = "127.0.0.1"

_STOP_TIMEOUT = 5.0  # seconds between SIGTERM and SIGKILL for ``ensemble down``


_ENSEMBLE_HELP = """\
Local redis-server masters for development, bound to 127.0.0.1 only, without
persistence. 'up' starts them detached (they keep running after the command exits) and
prints the REDREENTRANT_MASTERS=... line to use (the only line on stdout, so
'export "$(redreentrant ensemble up)"' works); 'status' shows each one; 'down' stops
them and removes their directory and the state file.

The state file (pids, ports, directory) is --state FILE, else $REDREENTRANT_ENSEMBLE_STATE,
else ensemble.json in a directory of your own: $XDG_RUNTIME_DIR/redreentrant/, else
redreentrant-<uid> in the temp directory (mode 0700; one owned by someone else is
refused). 'redreentrant top' reads it to find the masters when given none.
"""


def register(add: Add) -> None:
    """Add the ``ensemble`` command with ``add`` (a subparsers action's ``add_parser``)."""
    ensemble = add(
        "ensemble",
        help="start/stop local redis-server masters for development",
        description=_ENSEMBLE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Each action has the options every command has, and --state.
    state = masters_option()
    state.add_argument("--state", metavar="FILE", help="the state file (see above)")
    actions = ensemble.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser(
        "up",
        parents=[state],
        help="start N local masters, detached",
        description="Start N redis-server masters on 127.0.0.1, detached, and print the "
        "REDREENTRANT_MASTERS=... line (stdout). Refused if the state file names "
        "servers that are still up.",
    )
    up.add_argument("--size", type=positive_int, default=5, metavar="N", help="default 5")
    up.add_argument("--port-file", metavar="F", help="also write the ports to F, one a line")
    up.set_defaults(func=cmd_ensemble_up)
    down = actions.add_parser(
        "down",
        parents=[state],
        help="stop them and remove their files",
        description="Stop the servers of the state file (SIGTERM, then SIGKILL after "
        f"{_STOP_TIMEOUT:g} s), remove their directory and the state file. A pid is only "
        "signalled if it is still that redis-server. Exit 0 also when none is up.",
    )
    down.set_defaults(func=cmd_ensemble_down)
    status = actions.add_parser(
        "status",
        parents=[state],
        help="show whether each one is up",
        description="Show each server of the state file as up, down or not answering. "
        "Exit 0 if all are up, 1 otherwise (also when there is no state file).",
    )
    status.set_defaults(func=cmd_ensemble_status)


def state_dir() -> str:
    """The user's own directory for the state file (not made here):
    ``$XDG_RUNTIME_DIR/redreentrant`` when ``$XDG_RUNTIME_DIR`` is a directory owned by
    the user, else ``redreentrant-<uid>`` in the temp directory."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and _owned(runtime, stat.S_ISDIR):
        return os.path.join(runtime, "redreentrant")
    return os.path.join(tempfile.gettempdir(), f"redreentrant-{os.getuid()}")


def _owned(path: str, kind: Callable[[int], bool]) -> bool:
    """Whether ``path`` is, itself (not a link), of ``kind`` (``stat.S_ISDIR``,
    ``stat.S_ISREG``) and owned by the user."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return kind(info.st_mode) and info.st_uid == os.getuid()


def _check_private_dir(path: str, create: bool) -> None:
    """Make sure ``path`` is a directory of the user's that nobody else may write:
    made with mode 0700 when missing (``create``), its mode tightened when it is the
    user's; a symbolic link, or a directory owned by someone else, is an error."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        if create:
            raise
        return
    if not stat.S_ISDIR(info.st_mode):
        raise CliError(f"{path} is not a directory (a state directory must be one of yours)")
    if info.st_uid != os.getuid():
        raise CliError(
            f"{path} is owned by uid {info.st_uid}, not by you: refusing to use it for the "
            f"state file (remove it, or give --state FILE or ${STATE_ENV})"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)


def _state_path(args: argparse.Namespace, create: bool = False) -> tuple[str, bool]:
    """(the state file, whether it is at the default place, the user's
    :func:`state_dir` (made when ``create``), to be checked for ownership)."""
    given = getattr(args, "state", None) or os.environ.get(STATE_ENV)
    if given:
        return os.path.abspath(str(given)), False
    directory = state_dir()
    _check_private_dir(directory, create)
    return os.path.join(directory, STATE_FILE), True


def _recorded(args: argparse.Namespace, create: bool = False) -> tuple[str, dict[str, Any] | None]:
    """(the state file, what it records, or None when there is none)."""
    path, default = _state_path(args, create)
    return path, _load_state(path, default)


def local_masters(args: argparse.Namespace) -> list[str] | None:
    """The URLs of the local ensemble that ``ensemble up`` recorded, or None when there
    is no state file."""
    _, state = _recorded(args)
    return None if state is None else _urls(port for port, _ in detached_servers(state))


def _load_state(path: str, default: bool = False) -> dict[str, Any] | None:
    """The state file at ``path``, or None if there is none. At a default place it must
    be a regular file of the user's: pids and a directory from it get signalled and
    removed."""
    if default and os.path.lexists(path) and not _owned(path, stat.S_ISREG):
        raise CliError(f"the state file {path} is not a regular file of yours: refusing to use it")
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise CliError(f"cannot read the state file {path}: {error}") from None
    if not isinstance(state, dict) or not isinstance(state.get("servers"), list):
        raise CliError(f"{path} is not a redreentrant ensemble state file")
    try:
        detached_servers(state)  # a corrupt file is a clear error, not a traceback
    except ValueError:
        raise CliError("the state file is corrupt: remove it and stop servers by hand") from None
    return state


def _write_state(path: str, state: dict[str, Any]) -> None:
    # Written aside and renamed: a reader never sees half a file.
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=2)
        f.write("\n")
    os.replace(partial, path)


def _urls(ports: Iterable[int]) -> list[str]:
    return [f"redis://{HOST}:{port}/0" for port in ports]


def _masters_line(ports: Iterable[int]) -> str:
    return f"{MASTERS_ENV}=" + ",".join(_urls(ports))


def cmd_ensemble_up(args: argparse.Namespace) -> int:
    """``ensemble up``: start detached local masters and record them in a state file."""
    path, old = _recorded(args, create=True)
    if old is not None:
        if any(word != "down" for _, _, word in detached_status(old)):
            raise CliError(
                f"an ensemble is already up (state file {path}): see "
                f"'{PROG} ensemble status', stop it with '{PROG} ensemble down'"
            )
        stop_detached(old)  # nothing is up: this only removes its directory
        os.unlink(path)
        warn(f"removed the stale state file {path} (no server was up)")
    ensemble = LocalEnsemble(args.size)
    try:
        ensemble.start()
    except RuntimeError as error:  # a server did not come up; says why
        ensemble.stop()
        raise CliError(f"cannot start the local masters: {first_line(str(error))}") from None
    try:
        _write_state(path, ensemble.detach())
    except BaseException:
        stop_detached(_load_state(path) or {"servers": []})
        raise
    ports = [server.port for server in ensemble.servers]
    if args.port_file:
        with open(args.port_file, "w", encoding="utf-8") as f:
            f.writelines(f"{port}\n" for port in ports)
    warn(
        f"started {len(ports)} redis-server masters on {HOST} (state file {path}); stop "
        f"them with '{PROG} ensemble down'"
    )
    print(_masters_line(ports))
    return EXIT_OK


def cmd_ensemble_status(args: argparse.Namespace) -> int:
    """``ensemble status``: each recorded server up, down or not answering."""
    path, state = _recorded(args)
    if state is None:
        print(f"no ensemble: no state file {path}")
        return EXIT_FAILED
    rows = detached_status(state)
    print(f"ensemble of {len(rows)} (state file {path}, directory {state.get('dir')})")
    for port, pid, word in rows:
        print(f"  {HOST}:{port}  pid {pid:<8} {word}")
    print(_masters_line(port for port, _, _ in rows))
    return EXIT_OK if all(word == "up" for _, _, word in rows) else EXIT_FAILED


def cmd_ensemble_down(args: argparse.Namespace) -> int:
    """``ensemble down``: stop the recorded servers, remove their files."""
    path, state = _recorded(args)
    if state is None:
        print(f"no ensemble to stop: no state file {path}")
        return EXIT_OK
    stopped = stop_detached(state)
    os.unlink(path)
    print(f"stopped {stopped} redis-server(s); removed {state.get('dir')} and {path}")
    return EXIT_OK
