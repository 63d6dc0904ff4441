"""Children that die with their parent: Linux's ``PR_SET_PDEATHSIG`` for a ``Popen``.

For the children that need nothing more than to die (the command of ``redreentrant
run``, the demo's holder process). Local servers need more (their directories removed,
and no dependence on the thread that started them): they have the reaper of
:mod:`redreentrant.testing`.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
from collections.abc import Callable

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up once, before any fork (never in a forked child)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def die_with_parent(signum: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that makes the child get ``signum``
    when this process dies, however it dies (SIGKILL included); None where the platform
    has no such thing (only Linux has ``PR_SET_PDEATHSIG``).

    Call it, and start the child, from a thread that lives as long as the child should:
    Linux sends the signal when the *thread* that forked the child ends. The death
    signal is set in the child between fork and exec; if this process already died
    before that (the child then has another parent), the child kills itself at once.
    The setting survives exec but is cleared by exec of a set-user-ID or set-group-ID
    program, and it covers that one child, not the processes it starts in turn.
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        # In the child, after fork: no imports, no locks; only system calls.
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl: too late for it
            os.kill(os.getpid(), signum)

    return preexec
