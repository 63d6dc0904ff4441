"""Commands as bytes on the wire (no I/O): the EVALSHA of a call, the scripts a
connection is sent with their first call, and the packing of commands, in C where it
can be.

Packed calls are not kept across rounds: every try's call carries a tag of its own (see
:func:`~.kinds.hold_value`), so a call is never sent twice as it is.
"""

from __future__ import annotations

import codecs
import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

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
    return [("SCRIPT", "LOAD", script.source) for script in scripts if script.command is None]


def evalsha_args(call: Call) -> tuple[object, ...]:
    """The EVALSHA command for a call (a plain command's own, see
    :func:`~.scripts.command`)."""
    if call.script.command is not None:
        return (call.script.command, *call.args)
    return ("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)


#: how many templates a :class:`Templates` keeps (then it starts afresh)
TEMPLATES_KEPT = 256

#: what a template is packed with in the place of each argument of a try (at most two:
#: a hold and a place), and their bulk strings: never another argument's
_MARKS = ("\x00", "\x01")
_MARK_BULKS = (b"$1\r\n\x00\r\n", b"$1\r\n\x01\r\n")


class Templates:
    """The packed bytes of calls sent again but for the arguments of one try (its
    hold, ``"<count>:<tag>"``, and a proposed place, which differ from one try to the
    next: see :attr:`~.effects.Call.varies`): kept as the bytes around those, so that
    a call that repeats (the same owner taking the same lock again) costs the packing of
    one or two short strings, not of every argument. Bounded: emptied when full.

    Hand-written because no packer keeps templates; it holds only for packers that make
    bytes of the Redis protocol (the others pack every call)."""

    def __init__(self, size: int = TEMPLATES_KEPT) -> None:
        self.size = size
        #: per call less its per-try arguments: the bytes around those (empty: not bytes)
        self._parts: dict[tuple[object, ...], list[bytes]] = {}

    def packed(self, how: object, call: Call, pack: Callable[[list[tuple[object, ...]]], T]) -> T:
        """``call`` (whose ``varies`` is set) packed by ``pack`` (``how``: what the
        packing depends on)."""
        args = call.args
        varies = call.varies
        # Every argument is a str or an int, never a bool or a float, in every call the
        # kinds make: equal keys are the same bytes. The per-try arguments are ASCII.
        if len(varies) == 1:  # the usual call: a hold
            k = varies[0]
            key: tuple[object, ...] = (how, call.script.sha, call.keys, args[:k], args[k + 1 :])
            parts = self._parts.get(key)
            if parts:  # known, and made of bytes
                value = args[k].encode()  # type: ignore[union-attr]  # a hold: a str
                one: T = [b"%b$%d\r\n%b\r\n%b" % (parts[0], len(value), value, parts[1])]  # type: ignore[assignment]
                return one
        else:  # a hold and a place
            k, m = varies
            key = (how, call.script.sha, call.keys, args[:k], args[k + 1 : m], args[m + 1 :])
            parts = self._parts.get(key)
        if parts is None:
            parts = self._template(call, pack)
            if len(self._parts) >= self.size:
                self._parts.clear()  # one call, safe while other threads look up
            self._parts[key] = parts
        if not parts:  # not bytes of the Redis protocol: packed each time
            return pack([evalsha_args(call)])
        values = [str(args[k]).encode() for k in varies]
        if len(values) == 1:
            first: T = [b"%b$%d\r\n%b\r\n%b" % (parts[0], len(values[0]), values[0], parts[1])]  # type: ignore[assignment]
            return first
        hold, place = values
        both: T = [  # type: ignore[assignment]
            b"%b$%d\r\n%b\r\n%b$%d\r\n%b\r\n%b"
            % (parts[0], len(hold), hold, parts[1], len(place), place, parts[2])
        ]
        return both

    @staticmethod
    def _template(call: Call, pack: Callable[[list[tuple[object, ...]]], object]) -> list[bytes]:
        marked = list(call.args)
        for n, k in enumerate(call.varies):
            marked[k] = _MARKS[n]
        packed = pack([evalsha_args(call._replace(args=tuple(marked)))])
        if not isinstance(packed, list) or not all(isinstance(p, bytes) for p in packed):
            return []
        rest = b"".join(packed)
        parts = []
        for n in range(len(call.varies)):
            if rest.count(_MARK_BULKS[n]) != 1:
                return []
            head, _, rest = rest.partition(_MARK_BULKS[n])
            parts.append(head)
        return [*parts, rest]


def pack_calls(
    calls: Sequence[Call], how: object, pack: Callable[[list[tuple[object, ...]]], T]
) -> T:
    """``calls`` packed by ``pack`` (``how``: what the packing depends on): their EVALSHA
    commands, pipelined."""
    return pack([evalsha_args(c) for c in calls])
