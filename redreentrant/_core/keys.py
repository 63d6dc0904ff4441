"""Key and channel names on every master.

All keys of a lock share the hash tag ``{name}``, so they live in one slot of a Redis
Cluster. The prefix carries the key-schema version: a release with an incompatible
layout changes it, so two versions never read each other's keys.

A hash tag ends at the first ``}``: a name holding one would give an empty or partial
tag and spread one lock's keys over several slots. Such a name is escaped (``%`` as
``%25``, ``}`` as ``%7D``) and its keys carry a ``!`` right after the tag, so they can
never equal the keys of another name; a name without ``}`` keeps its keys as they are.
Any non-empty string is a usable name (braces, newlines and NUL included), as long as
it can be encoded as UTF-8.
"""

from __future__ import annotations

import functools

SCHEMA = "v1"
PREFIX = f"redreentrant:{SCHEMA}:"
#: the start of every manager's home channel (see :func:`home_channel`)
HOME_PREFIX = f"{PREFIX}hub:"
#: a master's memory record, a hash: when its current memory began (``began``, server
#: ms), under which replication id, and whether with a failover; kept by the try
#: scripts (see the stamp in ``lua/acquire.lua``, which names it too)
MEMORY_KEY = f"{PREFIX}memory"


def validate_name(name: object) -> str:
    """Return ``name`` if it is a usable lock name, else raise TypeError/ValueError."""
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("lock name must not be empty")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"lock name {name!r} cannot be encoded as UTF-8 ({error.reason} at position"
            f" {error.start})"
        ) from None
    return name


# The key and channel names of a lock are asked for several times per round: made once
# for the names in recent use (bounded).
@functools.lru_cache(maxsize=4096)
def tag(name: str) -> str:
    """The start of every key of lock ``name``: the prefix and its hash tag."""
    if "}" not in name:
        return f"{PREFIX}{{{name}}}"
    escaped = name.replace("%", "%25").replace("}", "%7D")
    return f"{PREFIX}{{{escaped}}}!"


#: the hash holding ``owner -> hold`` for the plain lock ``name``: its tag itself
lock_key = tag


@functools.lru_cache(maxsize=4096)
def aux_key(name: str, part: str) -> str:
    """An auxiliary key of lock ``name`` (same hash slot as its lock key)."""
    return f"{tag(name)}:{part}"


def waiters_key(name: str) -> str:
    """The zset of the plain lock's registered waiters: owner -> end of registration."""
    return aux_key(name, "waiters")


def reserved_key(name: str) -> str:
    """The plain lock's reservation: the owner id of the waiter a release woke (and
    only it may take the lock), for a few milliseconds."""
    return aux_key(name, "reserved")


@functools.lru_cache(maxsize=4096)
def plain_keys(name: str) -> tuple[str, str, str]:
    """The plain lock's keys, as its scripts take them: the lock, its waiters and its
    reservation."""
    return tag(name), waiters_key(name), reserved_key(name)


@functools.lru_cache(maxsize=4096)
def wake_channel(name: str) -> str:
    """The plain lock's wake channel: it names the lock in the wake-ups the masters send
    a waiter's manager (nothing is published on it)."""
    return f"{tag(name)}:wake"


def home_channel(manager_id: str) -> str:
    """The channel a manager's pub/sub connections always hear: a release wakes a
    registered waiter there. Its owner id is ``<manager id>:<token>``, so the scripts
    find the channel from the owner id alone."""
    return f"{HOME_PREFIX}{manager_id}"


#: characters of a name glob that the masters' MATCH is not given: a glob of these would
#: not match the escaped form of a name holding "}" (see tag), or is read differently
#: by Redis and by fnmatch
_LOCAL_ONLY = frozenset("[]\\}%?")


def scan_pattern(name_glob: str) -> str:
    """A ``SCAN MATCH`` pattern for the keys of the names matching ``name_glob`` (an
    fnmatch glob): it may let keys of other names through (match their names again),
    but never leaves out a key of a matching name."""
    inner = "*" if any(c in _LOCAL_ONLY for c in name_glob) else name_glob
    return f"{PREFIX}{{{inner}}}*"


def name_of(key: str) -> str:
    """The lock name inside a key made by :func:`lock_key` or :func:`aux_key`."""
    if not key.startswith(PREFIX + "{"):
        raise ValueError(f"not a redreentrant key: {key!r}")
    body = key[len(PREFIX) + 1 :]
    end = body.find("}")
    if end < 0:
        raise ValueError(f"not a redreentrant key: {key!r}")
    if body[end + 1 : end + 2] == "!":
        return body[:end].replace("%7D", "}").replace("%25", "%")
    return body[:end]


def _crc16_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        table.append(crc & 0xFFFF)
    return table


_CRC16 = _crc16_table()


def key_slot(key: str | bytes) -> int:
    """The Redis Cluster hash slot of ``key``: CRC16 (XMODEM) of its hash tag (the text
    between the first ``{`` and the next ``}``, if not empty), else of the whole key,
    modulo 16384, as the Cluster specification defines it. Written here so that the core
    needs no client library (redis-py and valkey-py clients alike are driven over it)."""
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[(crc >> 8) ^ byte]
    return crc % 16384
