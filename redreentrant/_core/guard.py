"""A store guarded by fencing tokens, the resource's side of fencing (no I/O).

What a write sends and how its reply is judged; :class:`redreentrant.FencedStore` and
its asyncio twin carry it out on a Redis client of the caller's.
"""

from __future__ import annotations

from .fencing import check_token
from .scripts import FENCED_WRITE, Script

#: the script of a fenced write (``lua/fenced_write.lua``)
SCRIPT: Script = FENCED_WRITE


def token_key(key: str) -> str:
    """Where the largest accepted token of the value ``key`` is kept, by default. It
    shares ``key``'s hash tag when ``key`` has one (a Redis Cluster needs both keys in
    one slot: give ``key`` a tag, e.g. ``{orders}:total``)."""
    return f"{key}:fencing-token"


def write_args(token: object, value: str | bytes | int | float) -> list[str | bytes | int | float]:
    """The script's arguments for a write of ``value`` with ``token``, whose range is
    checked first (:class:`ValueError`: nothing is sent)."""
    return [check_token(token, "FencedStore.write(token=...)"), value]
