"""The Lua scripts in ``lua/``, loaded once and identified by their SHA1.

Each script file starts with a header naming it and giving its version; the test suite
pins every script's text to its version, so an edit without a version bump fails.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

_HEADER = re.compile(r"^--\s*(name|version):\s*(\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Script:
    """One Lua script: its name, version, source text and SHA1 (for EVALSHA)."""

    name: str
    version: int
    source: str
    sha: str


def script_dir() -> Path:
    """Where the ``.lua`` files are: inside the installed package, else the source tree."""
    package = Path(__file__).resolve().parent.parent
    packaged = package / "lua"
    return packaged if packaged.is_dir() else package.parent / "lua"


def parse(source: str, expected_name: str) -> Script:
    """Build a :class:`Script` from its text, checking the header."""
    header = dict(_HEADER.findall(source[:2000]))
    if header.get("name") != expected_name or not header.get("version", "").isdigit():
        raise RuntimeError(f"lua/{expected_name}.lua lacks a '-- name:'/'-- version:' header")
    sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
    return Script(expected_name, int(header["version"]), source, sha)


def load(name: str) -> Script:
    """Read and parse ``lua/<name>.lua``."""
    return parse((script_dir() / f"{name}.lua").read_text(encoding="utf-8"), name)


ACQUIRE = load("acquire")
RELEASE = load("release")
RENEW = load("renew")
PROBE = load("probe")
RWLOCK = load("rwlock")
FAIRLOCK = load("fairlock")
FENCE = load("fence")
EXTEND = load("extend")
FENCED_WRITE = load("fenced_write")
SEMAPHORE = load("semaphore")
MULTILOCK = load("multilock")
MEMORY = load("memory")

#: the scripts the masters run (the fenced write runs on the protected resource)
LOCK_SCRIPTS = (
    ACQUIRE, RELEASE, RENEW, PROBE, RWLOCK, FAIRLOCK, FENCE, EXTEND, SEMAPHORE, MULTILOCK,
)  # fmt: skip
