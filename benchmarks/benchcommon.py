"""Plumbing shared by the benchmark scripts: servers, key clean-up, options, statistics.

Not a benchmark itself. The scripts import it as a sibling module (``python
benchmarks/bench_x.py`` puts this directory first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import ipaddress
import json
import math
import platform
import secrets
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis

# Lease and blocking timeouts are generous on purpose: nothing here should ever
# expire or time out, so every library is measured on its happy path.
LEASE_S = 30.0
WAIT_S = 30.0
WARMUP_CYCLES = 50
QUORUM_SIZE = 5

BASE_DISTS = ("redis", "hiredis", "redreentrant")

T = TypeVar("T")


def fail_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def host_port_db(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    db = parts.path.strip("/")
    return {"host": parts.hostname, "port": parts.port or 6379, "db": int(db) if db else 0}


def is_loopback(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        return False
    if parts.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return False


def ensure_repo_importable() -> None:
    # Benchmark the working tree, even when run as `python benchmarks/<script>.py`.
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)


def versions(dists: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {"python": platform.python_version()}
    for dist in dists:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    with contextlib.suppress(Exception):
        import redreentrant

        out["redreentrant"] = str(getattr(redreentrant, "__version__", "working tree"))
    return out


def split_urls(masters: str) -> list[str]:
    return [u.strip() for u in masters.split(",") if u.strip()]


@contextlib.contextmanager
def servers(masters: str | None) -> Iterator[list[str]]:
    """The given loopback masters, or a private LocalEnsemble(5) stopped on exit."""
    if masters:
        yield split_urls(masters)
        return
    # Imported late: the ensemble module is only needed when no --masters are given.
    from redreentrant.testing import LocalEnsemble

    with LocalEnsemble(QUORUM_SIZE) as ensemble:
        yield list(ensemble.urls)


@contextlib.contextmanager
def servers_with_handle(
    masters: str | None, size: int = QUORUM_SIZE
) -> Iterator[tuple[list[str], Any]]:
    """Like :func:`servers`, and also the ``LocalEnsemble`` started here (None when
    ``masters`` are given): for workloads that pause (SIGSTOP) one of its servers."""
    if masters:
        yield split_urls(masters), None
        return
    from redreentrant.testing import LocalEnsemble

    with LocalEnsemble(size) as ensemble:
        yield list(ensemble.urls), ensemble


def cleanup(urls: Sequence[str], run_id: str) -> int:
    """Delete every key whose name contains ``run_id`` (all lock names embed it)."""
    deleted = 0
    for url in urls:
        with contextlib.suppress(redis.RedisError), redis.Redis.from_url(url) as client:
            keys = list(client.scan_iter(match=f"*{run_id}*", count=1000))
            if keys:
                deleted += int(client.delete(*keys))
    return deleted


def new_run_id() -> str:
    return f"rrbench-{secrets.token_hex(4)}"


def server_version(url: str) -> str:
    with redis.Redis.from_url(url) as probe:
        return str(probe.info("server").get("redis_version", "?"))


def add_masters_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--masters",
        help="comma-separated redis:// URLs of existing loopback servers "
        "(default: start a private LocalEnsemble of 5 and stop it afterwards)",
    )


def check_masters_arg(p: argparse.ArgumentParser, masters: str | None) -> None:
    if masters is None:
        return
    urls = split_urls(masters)
    if not urls:
        p.error("--masters is empty")
    # The benchmarks write and delete keys: keep them away from anything but loopback.
    bad = [u for u in urls if not is_loopback(u)]
    if bad:
        p.error(f"only loopback redis:// masters are allowed, got: {', '.join(bad)}")


def quorum_urls(urls: Sequence[str]) -> list[str]:
    """The masters for the multi-master scenarios: the first 5, if there are 3 or more."""
    return list(urls[:QUORUM_SIZE]) if len(urls) >= 3 else []


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by linear interpolation; NaN for no samples."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def fmt_ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.2f}"


def ratio_text(num: float | None, den: float | None) -> str:
    return f"{num / den:.2f}x" if num and den else "-"


def run_session(
    args: argparse.Namespace,
    extra_dists: Sequence[str],
    scope: str,
    run_all: Callable[[argparse.Namespace, list[str], str], T],
) -> tuple[T, dict[str, Any]]:
    """The frame every script shares: print versions, start (or use) the servers, run,
    delete the run's keys whatever happens. Returns the results and the run's facts
    (run id, versions, server version, master count) for a JSON dump."""
    ensure_repo_importable()
    run_id = new_run_id()
    dists = versions((*BASE_DISTS, *extra_dists))
    print("versions: " + ", ".join(f"{k} {v}" for k, v in dists.items()))
    with servers(args.masters) as urls:
        redis_version = server_version(urls[0])
        print(
            f"servers: {len(urls)} (redis {redis_version}), duration {args.duration:g}s "
            f"{scope}, run id {run_id}"
        )
        try:
            results = run_all(args, urls, run_id)
        finally:
            deleted = cleanup(urls, run_id)
            print(f"cleanup: deleted {deleted} key(s) matching *{run_id}*", file=sys.stderr)
    facts = {
        "run_id": run_id,
        "versions": dists,
        "redis_server": redis_version,
        "masters": len(urls),
    }
    return results, facts


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {path}")
