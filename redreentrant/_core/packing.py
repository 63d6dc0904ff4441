"""Commands as bytes on the wire (no I/O): the EVALSHA of a call, the scripts a new
connection is sent first, and the packing of commands, in C where it can be, with the
packed bytes of repeated calls kept (:class:`WireCache`).
"""

from __future__ import annotations

import codecs
import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .effects import Call
from .scripts import Script

T = TypeVar("T")


@functools.lru_cache(maxsize=8)
def wire_packer(
    encoding: str, errors: str
) -> Callable[[list[tuple[object, ...]]], list[bytes]] | None:
    """A packer of commands into the Redis protocol in C (hiredis's), for a connection
    that encodes text as hiredis does (UTF-8, strict); None when hiredis is not
    installed or the connection encodes otherwise (its own packer is then used). The
    asyncio client packs in Python, a large share of a round's time."""
    try:
        from hiredis import pack_command
    except ImportError:  # an optional speed-up of redis-py
        return None
    if codecs.lookup(encoding).name != "utf-8" or errors != "strict":
        return None

    def pack(commands: list[tuple[object, ...]]) -> list[bytes]:
        # Our commands hold only str and int arguments, which hiredis packs as is.
        if len(commands) == 1:
            return [pack_command(commands[0])]  # type: ignore[arg-type,unused-ignore]
        return [b"".join(pack_command(c) for c in commands)]  # type: ignore[arg-type,unused-ignore]

    return pack


def load_commands(scripts: Sequence[Script]) -> list[tuple[object, ...]]:
    """``SCRIPT LOAD`` of ``scripts``, sent on a connection ahead of its first call of
    each (see :mod:`.fanout`): its master then knows every script it is sent, so a
    call whose reply a round does not read (an undo, a release decided without it)
    cannot be dropped there as NOSCRIPT."""
    return [("SCRIPT", "LOAD", script.source) for script in scripts]


def evalsha_args(call: Call) -> tuple[object, ...]:
    """The EVALSHA command for a call."""
    return ("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)


#: how many packed calls a :class:`WireCache` keeps (then it starts afresh)
WIRE_CACHE_SIZE = 256

_MISSING = object()


class WireCache:
    """The packed bytes of calls sent before, so that a call repeated as it is (the same
    owner taking the same lock again) is packed once. Bounded: emptied when full.

    An entry is found only by everything its bytes depend on: the packing (``how``),
    and each call's script, keys, arguments and the arguments' types (``1``, ``1.0``
    and ``True`` are equal keys of a dict, but not the same bytes)."""

    def __init__(self, size: int = WIRE_CACHE_SIZE) -> None:
        self.size = size
        self._packed: dict[tuple[object, ...], Any] = {}

    def packed(
        self,
        how: object,
        calls: Sequence[Call],
        pack: Callable[[list[tuple[object, ...]]], T],
    ) -> T:
        if len(calls) == 1:
            c = calls[0]
            key: tuple[object, ...] = (how, c.script.sha, c.keys, c.args, *map(type, c.args))
        else:
            parts: list[object] = [how]
            for c in calls:
                parts += (c.script.sha, c.keys, c.args, *map(type, c.args))
            key = tuple(parts)
        out = self._packed.get(key, _MISSING)
        if out is _MISSING:
            if len(self._packed) >= self.size:
                self._packed.clear()  # one call, safe while other threads look up
            out = self._packed[key] = pack([evalsha_args(c) for c in calls])
        result: T = out  # stored by this method, from ``pack``
        return result


def pack_calls(
    calls: Sequence[Call],
    how: object,
    pack: Callable[[list[tuple[object, ...]]], T],
    wire: WireCache | None,
) -> T:
    """``calls`` packed by ``pack`` (``how``: what the packing depends on), through
    ``wire`` when given (calls that are not kept, such as clean-ups with their unique
    release ids, are packed anew)."""
    if wire is None:
        return pack([evalsha_args(c) for c in calls])
    return wire.packed(how, calls, pack)
