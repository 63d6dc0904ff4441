"""Key and channel names on every master.

All keys of a lock share the hash tag ``{name}``, so they live in one slot of a Redis
Cluster. The prefix carries the key-schema version: a release with an incompatible
layout changes it, so two versions never read each other's keys.
"""

from __future__ import annotations

SCHEMA = "v1"
PREFIX = f"redreentrant:{SCHEMA}:"


def validate_name(name: object) -> str:
    """Return ``name`` if it is a usable lock name, else raise TypeError/ValueError."""
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("lock name must not be empty")
    return name


def lock_key(name: str) -> str:
    """The hash holding ``owner -> hold count`` for lock ``name``."""
    return f"{PREFIX}{{{name}}}"


def aux_key(name: str, part: str) -> str:
    """An auxiliary key of lock ``name`` (same hash slot as its lock key)."""
    return f"{PREFIX}{{{name}}}:{part}"


def wake_channel(name: str) -> str:
    """The pub/sub channel on which a release of ``name`` is announced."""
    return f"{PREFIX}{{{name}}}:wake"


def name_of(key: str) -> str:
    """The lock name inside a key made by :func:`lock_key` or :func:`aux_key`."""
    if not key.startswith(PREFIX + "{"):
        raise ValueError(f"not a redreentrant key: {key!r}")
    body = key[len(PREFIX) + 1 :]
    end = body.rfind("}")
    return body[:end]
