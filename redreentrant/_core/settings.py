"""A manager's settings, checked once, and the arguments of an acquire (no I/O).

Every check raises ``ValueError`` (or ``TypeError`` for a value that is not a number)
naming the offending argument, before anything is sent to a master.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .cluster import CLUSTER_SCHEMES, parse_cluster_url
from .durability import durability as check_durability
from .listeners import LockListener
from .quorum import drift_allowance
from .sentinel import SENTINEL_SCHEMES, parse_sentinel_url, split_masters

#: the longest lease accepted (ten years): longer ones overflow Redis' expiry times
MAX_LEASE = 10 * 365 * 86400.0


def number(argument: str, value: object) -> float:
    """``value`` as a float, or a TypeError/ValueError that names ``argument``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{argument} must be a number, not {type(value).__name__}")
    if math.isnan(value):
        raise ValueError(f"{argument} must not be NaN")
    return float(value)


def check_lease(argument: str, value: object) -> float:
    """A lease in seconds: > 0 and at most :data:`MAX_LEASE`."""
    lease = number(argument, value)
    if not 0 < lease <= MAX_LEASE:
        raise ValueError(
            f"{argument} must be > 0 and at most {MAX_LEASE:.0f} seconds (ten years), not {value!r}"
        )
    return lease


def default_master_timeout(lease: float) -> float:
    """How long one master may take to answer: small against the lease."""
    return min(0.25, lease / 10)


#: the longest time between two probes of a master that stopped answering
PROBE_INTERVAL = 1.0


@dataclass(frozen=True)
class Settings:
    """A manager's settings, checked (see ``LockManager`` for their meaning)."""

    lease: float
    drift_factor: float
    master_timeout: float
    retry_jitter: float
    on_lost: Callable[[Any], object] | None
    #: locks hand out fencing tokens unless a lock says otherwise
    fencing: bool = False
    #: how long the watchdog renews a hold before it stops (seconds; None: no cap)
    max_hold: float | None = None
    #: told of the locks' events (None: nobody, and nothing is spent on it)
    listener: LockListener | None = None
    #: how long a master whose memory began lately does not vote (seconds; None: the
    #: longest lease handed out; 0: never quarantined)
    quarantine: float | None = None
    #: what a master's writes must reach before its vote counts: one setting for every
    #: master or one per master (see :mod:`.durability`), checked
    durability: object = None

    @property
    def probe_interval(self) -> float:
        """How often a master that stopped answering is probed: ``min(lease / 3, 1 s)``."""
        return min(self.lease / 3, PROBE_INTERVAL)

    @classmethod
    def check(
        cls,
        lease: object,
        drift_factor: object,
        master_timeout: object,
        retry_jitter: object,
        on_lost: object,
        fencing: object = False,
        max_hold: object = None,
        listener: object = None,
        quarantine: object = None,
        durability: object = None,
    ) -> Settings:
        """The settings, or a ValueError/TypeError naming the first bad one."""
        lease_s = check_lease("lease", lease)
        drift = number("drift_factor", drift_factor)
        if not 0 <= drift < 0.5:
            raise ValueError(f"drift_factor must be in [0, 0.5), not {drift_factor!r}")
        timeout = default_master_timeout(lease_s) if master_timeout is None else master_timeout
        timeout_s = number("master_timeout", timeout)
        if not 0 < timeout_s < lease_s / 3:
            raise ValueError(f"master_timeout must be > 0 and < lease / 3, not {timeout!r}")
        jitter = number("retry_jitter", retry_jitter)
        if not (math.isfinite(jitter) and jitter >= 0):
            raise ValueError(
                f"retry_jitter must be a finite number of seconds >= 0, not {retry_jitter!r}"
            )
        if lease_s <= drift_allowance(lease_s, drift) + timeout_s:
            raise ValueError(
                f"lease {lease!r}s is too short: it must exceed the clock drift allowance"
                f" plus the master timeout ({timeout_s}s)"
            )
        if on_lost is not None and not callable(on_lost):
            raise TypeError("on_lost must be callable")
        cap = None if max_hold is None else check_lease("max_hold", max_hold)
        if listener is not None and not isinstance(listener, LockListener):
            raise TypeError(
                f"listener must be a LockListener (subclass it), not {type(listener).__name__}"
            )
        fences = check_fencing(fencing)
        kept = None
        if quarantine is not None:
            kept = number("quarantine", quarantine)
            if not (math.isfinite(kept) and kept >= 0):
                raise ValueError(
                    f"quarantine must be a finite number of seconds >= 0, not {quarantine!r}"
                )
        if isinstance(durability, Sequence) and not isinstance(durability, str):
            durability = tuple(durability)
            for each in durability:
                check_durability(each)
        else:
            check_durability(durability)
        settings = cls(
            lease_s, drift, timeout_s, jitter, on_lost, fences, cap, listener, kept, durability
        )
        settings.check_quarantine("lease", lease_s)
        return settings

    def check_quarantine(self, what: str, lease: float) -> None:
        """A hold of ``lease`` seconds may stand on a master that is counted in again:
        refused (ValueError naming ``what``) when it is longer than a quarantine set."""
        if self.quarantine and lease > self.quarantine:
            raise ValueError(
                f"{what} {lease:g}s is longer than quarantine={self.quarantine:g}s: a master"
                " that lost its memory would vote again while a hold it forgot may still"
                " stand; raise quarantine or shorten the lease"
            )

    def hold_cap(self, lease: object, max_hold: object) -> float | None:
        """The ``max_hold`` of an acquire (seconds; None: no cap): its own, else the
        manager's; a fixed lease has none (it is not renewed), and refuses one."""
        if max_hold is None:
            return None if lease is not None else self.max_hold
        if lease is not None:
            raise ValueError(
                "max_hold caps the watchdog's renewals, and a fixed lease= is never"
                " renewed: pass one or the other"
            )
        return check_lease("max_hold", max_hold)

    def acquire_lease(self, lease: object) -> float:
        """The lease of an acquire (or an extension): the manager's for ``None``, else
        checked: at least :func:`shortest_lease`. A lease shorter than the master
        timeout is honoured as any other: a grant counts only with validity left, so a
        round that took longer than such a lease (less its drift allowance) fails, and
        its grants are undone."""
        if lease is None:
            return self.lease
        lease_s = check_lease("lease", lease)
        self.check_quarantine("lease", lease_s)
        shortest = shortest_lease(self.drift_factor)
        if lease_s < shortest:
            raise ValueError(
                f"lease {lease!r}s is too short: the shortest lease honoured is"
                f" {shortest * 1000:.1f} ms (a grant is valid for the lease less the clock"
                f" drift allowance, 2 ms plus {self.drift_factor:g} of the lease, less the"
                " time its round took; a shorter lease would leave no time for the round)"
            )
        return lease_s


def shortest_lease(drift_factor: float) -> float:
    """The shortest lease an acquire honours: one whose drift allowance leaves half of
    it for the round."""
    # lease / 2 > 0.002 + drift_factor * lease
    return 0.002 / (0.5 - drift_factor)


#: the most permits a semaphore may have: each acquire names every slot to the masters
MAX_PERMITS = 1024


def check_permits(permits: object) -> int:
    """``permits=`` of a semaphore: an int from 1 to :data:`MAX_PERMITS`."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(f"permits must be an int, not {permits!r}")
    if not 1 <= permits <= MAX_PERMITS:
        raise ValueError(f"permits must be from 1 to {MAX_PERMITS}, not {permits}")
    return permits


def check_fencing(fencing: object) -> bool:
    """``fencing=`` of a manager or a lock: a bool."""
    if not isinstance(fencing, bool):
        raise TypeError(f"fencing must be True or False, not {fencing!r}")
    return fencing


def check_acquire_args(blocking: bool, timeout: float) -> None:
    """``threading.Lock.acquire`` rules for ``blocking`` and ``timeout``."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number, not {type(timeout).__name__}")
    if math.isnan(timeout):
        raise ValueError("timeout must not be NaN")
    if not blocking and timeout != -1:
        raise ValueError("can't specify a timeout for a non-blocking call")
    if timeout < 0 and timeout != -1:
        raise ValueError("timeout value must be a non-negative number, or -1 for no limit")


# -- masters written as text -----------------------------------------------------------

_BARE_MASTER = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:[0-9]{1,5})?$")
_SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES)


def master_url(text: str) -> str:
    """One master as a URL: a ``redis://``, ``rediss://`` or ``unix://`` URL as it is,
    a bare ``host`` or ``host:port`` as ``redis://host:port/0``; a cluster member's
    ``redis+cluster://`` or ``rediss+cluster://`` URL and a Sentinel-managed member's
    ``redis+sentinel://`` or ``rediss+sentinel://`` URL as they are, once checked (see
    :func:`~.cluster.parse_cluster_url` and :func:`~.sentinel.parse_sentinel_url`).
    Anything else (a malformed URL such as ``redis//host:6379``) is a ValueError naming
    it."""
    part = text.strip()
    if "://" in part:
        scheme = part.split("://", 1)[0].lower()
        if scheme in CLUSTER_SCHEMES:
            parse_cluster_url(part)
            return part
        if scheme in SENTINEL_SCHEMES:
            parse_sentinel_url(part)
            return part
        parsed = urlsplit(part)
        if scheme not in _SCHEMES or (scheme != "unix" and not parsed.hostname):
            raise ValueError(f"malformed master URL {text!r}: expected redis://host:port/db")
        return part
    if not _BARE_MASTER.match(part):
        raise ValueError(f"malformed master {text!r}: expected a redis:// URL or host:port")
    return f"redis://{part}/0"


def master_urls(text: str) -> list[str]:
    """Masters written as one string, separated by commas (the command line's form and
    ``$REDREENTRANT_MASTERS``): each a URL or a bare ``host:port`` (see
    :func:`master_url`). The commas between the sentinels of a ``redis+sentinel://``
    URL do not separate masters: ``"redis+sentinel://a:26379,b:26379/locks,c:6379"`` is
    two masters (see :func:`~.sentinel.split_masters`)."""
    urls = [master_url(part) for part in split_masters(text) if part.strip()]
    if not urls:
        raise ValueError(f"no master in {text!r}")
    return urls
