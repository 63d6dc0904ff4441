"""The ``redreentrant`` command: its parser, the dispatch to one module per command,
exit statuses (see :mod:`redreentrant.cli`), and how the library's log lines are shown.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import signal
import sys
from collections.abc import Sequence

from redreentrant import LockError, QuorumUnavailableError, __version__
from redreentrant.testing import RedisServerNotFound

from . import demo, elect, ensemble, fence, inspect, leader, run, top, unlock
from .common import (
    EXIT_FAILED,
    EXIT_OK,
    PROG,
    CliError,
    Interrupted,
    Parser,
    first_line,
    masters_option,
    quorum_message,
    warn,
)

__all__ = ["build_parser", "main", "setup_logging"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``redreentrant`` command."""
    common = [masters_option()]
    parser = Parser(
        prog=PROG,
        parents=common,
        description="Reentrant distributed locks on a Redlock quorum of Redis masters.",
        epilog="Exit status: 0 ok; 1 lock not obtained, masters unavailable (N with "
        "'run -E N' and 'elect -E N'), or a check failed; 2 usage error; 3 'leader': "
        "nobody leads. 'run' and 'elect' pass their command's status through.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (demo, run, elect, leader, inspect, top, unlock, fence, ensemble):
        command.register(functools.partial(commands.add_parser, parents=common))
    return parser


class _OneLineFormatter(logging.Formatter):
    """The library's warnings as single lines: a CLI prints no tracebacks."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            text += f": {type(error).__name__}: {first_line(str(error))}"
        return first_line(text)


def setup_logging() -> None:
    """Show the library's log lines (``redreentrant`` logger) on stderr, one line each."""
    logger = logging.getLogger("redreentrant")
    if not any(isinstance(h.formatter, _OneLineFormatter) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_OneLineFormatter())
        logger.addHandler(handler)
        logger.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``redreentrant`` command; return its exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        arguments, command = run.split_command(arguments)
        args = build_parser().parse_args(arguments)
        args.command_argv = command
        setup_logging()
        status: int = args.func(args)
        return status
    except SystemExit as exit_:  # --help and --version
        return exit_.code if isinstance(exit_.code, int) else EXIT_OK
    except CliError as error:
        _complain(str(error))
        return error.code
    except QuorumUnavailableError as error:
        _complain(quorum_message(error))
        return EXIT_FAILED
    except (LockError, RedisServerNotFound) as error:
        _complain(str(error))
        return EXIT_FAILED
    except KeyboardInterrupt:
        _complain("interrupted")
        return 128 + signal.SIGINT
    except Interrupted as interrupted:
        _complain(f"interrupted ({interrupted})")
        return 128 + interrupted.signum
    except BrokenPipeError:
        # The reader went away (e.g. '| head'): nothing more to say, and nowhere to.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - stops the flush at exit
        return EXIT_FAILED
    except OSError as error:  # e.g. a state file or directory we may not write
        _complain(str(error))
        return EXIT_FAILED


def _complain(message: str) -> None:
    warn(first_line(message))
