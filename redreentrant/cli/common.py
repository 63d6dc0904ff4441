"""What every command of the ``redreentrant`` CLI shares: exit statuses, user-facing
errors, argument types, the masters (``--masters`` or ``$REDREENTRANT_MASTERS``) and a
manager on them, lock names and their holders, tables, and terminating signals."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any, NoReturn, TypeVar

from redreentrant import LockManager, OwnerInfo, QuorumUnavailableError
from redreentrant.checks import master_urls, validate_name

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "MASTERS_ENV",
    "PROG",
    "SIDE",
    "Add",
    "CliError",
    "Interrupted",
    "Parser",
    "UsageError",
    "first_line",
    "lock_name",
    "masters",
    "masters_option",
    "number",
    "open_manager",
    "owner_json",
    "positive_int",
    "quorum_message",
    "raise_interrupted",
    "require_masters",
    "signals",
    "table",
    "until_ctrl_c",
    "warn",
]

PROG = "redreentrant"
MASTERS_ENV = "REDREENTRANT_MASTERS"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


# -- errors and argument parsing ------------------------------------------------------


class CliError(Exception):
    """A user-facing failure: printed as one ``redreentrant: ...`` line, exit ``code``."""

    code = EXIT_FAILED


class UsageError(CliError):
    """Bad arguments or missing configuration: exit 2."""

    code = EXIT_USAGE


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage dump) and exit 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


#: what a command's ``register(add)`` takes: a subparsers action's ``add_parser``, which
#: gives the new parser the options every command has (:func:`masters_option`)
Add = Callable[..., argparse.ArgumentParser]


def masters_option() -> Parser:
    """A parent parser of the option every command has: ``--masters``."""
    parser = Parser(add_help=False)
    # SUPPRESS: a subcommand's --masters must not overwrite one given before the
    # subcommand with its default (argparse copies every sub-namespace attribute).
    parser.add_argument(
        "--masters",
        metavar="URL,...",
        default=argparse.SUPPRESS,
        help=f"comma-separated redis URLs of the masters (default: ${MASTERS_ENV}); "
        "a bare host:port means redis://host:port/0",
    )
    return parser


N = TypeVar("N", int, float)


def number(
    convert: Callable[[str], N], what: str, ok: Callable[[N], bool], bounds: str
) -> Callable[[str], N]:
    """An argument type: the text as ``convert`` reads it (else "not ``what``"), a value
    that must be ``ok`` (else ``bounds``, the error message)."""

    def parse(text: str) -> N:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(bounds)
        return value

    return parse


#: an argument type: a whole number, at least 1
positive_int = number(int, "an integer", lambda value: value >= 1, "must be at least 1")


def first_line(text: str) -> str:
    """The first non-blank line of ``text`` (error messages shown on one line)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else text.strip()


def warn(message: str) -> None:
    """``message`` on stderr, as ``redreentrant: message``."""
    print(f"{PROG}: {message}", file=sys.stderr)


# -- masters, managers and names --------------------------------------------------------


def masters(args: argparse.Namespace) -> list[str] | None:
    """The masters given by --masters or $REDREENTRANT_MASTERS, or None if neither.

    Parsed by the library's own parser: a malformed entry is a usage error here, not a
    failure to resolve a host name later."""
    raw: str | None = getattr(args, "masters", None)
    source = "--masters"
    if raw is None:
        raw = os.environ.get(MASTERS_ENV)
        source = f"${MASTERS_ENV}"
    if raw is None or not raw.strip():
        return None
    try:
        return master_urls(raw)
    except ValueError as error:
        raise UsageError(f"bad masters in {source}: {error}") from None


def require_masters(args: argparse.Namespace) -> list[str]:
    """:func:`masters`, or a usage error that says how to give them."""
    urls = masters(args)
    if urls is None:
        raise UsageError(
            f"no masters: give --masters URL,URL,... or set {MASTERS_ENV} "
            f"('{PROG} ensemble up' starts local masters and prints that line)"
        )
    return urls


def open_manager(urls: Sequence[str], **options: Any) -> LockManager:
    """A :class:`~redreentrant.LockManager` on ``urls``; bad settings are usage errors."""
    try:
        return LockManager(list(urls), **options)
    except (ValueError, TypeError) as error:
        what = "bad masters or settings" if options else "bad masters"
        raise UsageError(f"{what} ({', '.join(urls)}): {error}") from None


def lock_name(text: str) -> str:
    """``text`` as a lock name; an empty or malformed one is a usage error."""
    try:
        return validate_name(text)
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from None


def quorum_message(error: QuorumUnavailableError) -> str:
    """One line on masters too few to answer: how many failed, and the first's error."""
    first = next(iter(error.errors.items()), None)
    detail = ""
    if first is not None:
        master, cause = first
        more = len(error.errors) - 1
        detail = f" ({master}: {first_line(str(cause) or type(cause).__name__)}"
        detail += f"; and {more} more)" if more else ")"
    return (
        f"masters unavailable: {len(error.errors)} failed to answer, a quorum of "
        f"{error.needed} is out of reach{detail}"
    )


# -- holders and tables -----------------------------------------------------------------

#: how a read/write lock's view names each side of a hold: ``"<owner id> (read)"``
SIDE = re.compile(r" \((read|write|upgradeable)\)$")


def owner_json(info: OwnerInfo | None) -> dict[str, object] | None:
    """What an owner id says of its owner, for JSON (None: an id that says nothing)."""
    if info is None:
        return None
    return {key: getattr(info, key) for key in ("host", "pid", "kind", "token", "name")}


def table(rows: list[list[str]]) -> str:
    """``rows`` (the header first) as plain text: left-aligned columns, two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


# -- signals --------------------------------------------------------------------------


class Interrupted(BaseException):
    """A terminating signal arrived (raised from its handler, in the main thread)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


Handler = Callable[[int, FrameType | None], Any]


@contextlib.contextmanager
def signals(handler: Handler, *signums: int) -> Iterator[None]:
    """Install ``handler`` for ``signums`` for the duration of the block.

    A signal ignored on entry stays ignored: under ``nohup`` a hang-up must neither
    stop us nor be forwarded, and a child then inherits the ignored disposition too."""
    previous: dict[int, Any] = {}
    try:
        for signum in signums:
            if signal.getsignal(signum) == signal.SIG_IGN:
                continue
            previous[signum] = signal.signal(signum, handler)
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def raise_interrupted(signum: int, frame: FrameType | None) -> None:
    """A signal handler that raises :class:`Interrupted`: the block unwinds, as on Ctrl-C."""
    raise Interrupted(signum)


@contextlib.contextmanager
def until_ctrl_c() -> Iterator[None]:
    """A block that Ctrl-C ends quietly (the command exits 0). SIGTERM and SIGHUP unwind
    it as well (a terminal is left tidy), as :class:`Interrupted` (exit 128+N)."""
    with (
        signals(raise_interrupted, signal.SIGTERM, signal.SIGHUP),
        contextlib.suppress(KeyboardInterrupt),
    ):
        yield
