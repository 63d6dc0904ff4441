"""One bad master of 5: acquire+release latency, healthy, with one master frozen
(``SIGSTOP``, ``SIGCONT`` afterwards; the embedded ensemble only) and with one
blackholed behind ``redreentrant.testing.proxy.TcpProxy`` (accepts, reads, never
answers). redreentrant at its default ``master_timeout`` against pottery with the same
socket time-outs. Each measurement lasts 3 x ``--duration``; an acquire gives up after
:data:`BAD_OP_WAIT_S` (counted as failed).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchcommon import LEASE_S, POTTERY, RR, Context, LibSpec, log, open_sync, percentile

BAD_INDEX = 4  # which of the 5 masters goes bad
BAD_OP_WAIT_S = 5.0  # acquire time-out in the bad-master workload
FROZEN = "1 frozen (SIGSTOP)"
BLACKHOLED = "1 blackholed (proxy)"


def bad_window(args: argparse.Namespace) -> float:
    return 0.6 if args.quick else max(3.0 * args.duration, 1.0)


def rr_default_master_timeout() -> float:
    from redreentrant._core.settings import default_master_timeout

    return default_master_timeout(LEASE_S)


def measure_bad(
    spec: LibSpec,
    masters: Sequence[str],
    name: str,
    window: float,
    fault: Callable[[], None],
    heal: Callable[[], None],
) -> tuple[list[float], int, dict[str, Any]]:
    """Acquire+release latencies of one lock, for ``window`` seconds after ``fault()``
    (bounded by time: the last operation may end after the window)."""
    backend = open_sync(spec, masters)
    latencies: list[float] = []
    failures = 0
    try:
        ops = backend.new_lock(name)
        for _ in range(20):  # warm-up, healthy: connections open, scripts loaded
            if ops.acquire():
                ops.release()
        fault()
        try:
            end = time.monotonic() + window
            while time.monotonic() < end:
                t0 = time.perf_counter()
                try:
                    if ops.acquire():
                        ops.release()
                    else:
                        failures += 1
                except Exception:
                    failures += 1
                latencies.append(time.perf_counter() - t0)
        finally:
            heal()
    finally:
        backend.close()
    return latencies, failures, dict(backend.info)


def run(ctx: Context) -> None:
    from redreentrant.testing.proxy import TcpProxy

    if len(ctx.urls) < 5:
        log("badmaster: needs 5 masters; skipped")
        ctx.results.facts["badmaster"] = "skipped: needs 5 masters"
        return
    masters = ctx.urls[:5]
    timeout = rr_default_master_timeout()
    ctx.results.facts["badmaster_rr_master_timeout_s"] = timeout
    ctx.results.facts["badmaster_pottery_socket_timeout_s"] = timeout
    # A blocking acquire gives up after BAD_OP_WAIT_S (a failed op): one op must not
    # outlast the run.
    specs = [
        LibSpec(RR, RR, {"wait": BAD_OP_WAIT_S}),
        LibSpec(POTTERY, POTTERY, {"socket_timeout": timeout, "wait": BAD_OP_WAIT_S}),
    ]
    ensemble = ctx.ensemble
    bad_url = masters[BAD_INDEX]
    bad_port = int(bad_url.rsplit(":", 1)[1].split("/")[0])
    window = bad_window(ctx.args)

    with TcpProxy(bad_port) as proxy:
        proxied = [*masters[:BAD_INDEX], proxy.url(), *masters[BAD_INDEX + 1 :]]

        def nothing() -> None:
            pass

        def freeze() -> None:
            ensemble[BAD_INDEX].pause()

        def thaw() -> None:
            if ensemble[BAD_INDEX].paused:
                ensemble[BAD_INDEX].resume()

        conditions: list[tuple[str, Sequence[str], Callable[[], None], Callable[[], None]]] = [
            ("healthy", masters, nothing, nothing)
        ]
        if ensemble is not None:
            conditions.append((FROZEN, masters, freeze, thaw))
        else:
            ctx.results.facts["badmaster_frozen"] = "skipped: --masters given (no process to stop)"
        conditions.append((BLACKHOLED, proxied, proxy.blackhole, proxy.pass_through))

        for rnd in range(ctx.args.rounds):
            log(f"badmaster: round {rnd + 1}/{ctx.args.rounds}")
            for cond, urls, fault, heal in conditions:
                for spec in specs:
                    row = ctx.results.row("badmaster", cond, spec.label)
                    if row.error:
                        continue
                    tag = cond.replace(" ", "_").replace("(", "").replace(")", "")
                    name = f"{ctx.run_id}:b:{rnd}:{tag}:{spec.key.split()[0]}"
                    try:
                        lat, failures, info = measure_bad(spec, urls, name, window, fault, heal)
                    except Exception as exc:
                        row.fail(exc)
                        continue
                    p50, p99 = percentile(lat, 0.5) * 1000, percentile(lat, 0.99) * 1000
                    row.add("p50 ms", p50)
                    row.add("p99 ms", p99)
                    row.add("ops", len(lat))
                    row.add("failed", failures)
                    if "master_timeout" in info:
                        row.note(f"master_timeout {info['master_timeout']:g}s (default)")
                    if info.get("socket_timeout"):
                        row.note(f"socket timeouts {info['socket_timeout']:g}s")
                    log(
                        f"  {cond:22} {spec.label:16} p50 {p50:8.2f} ms p99 {p99:8.2f} ms, "
                        f"{len(lat)} ops, {failures} failed"
                    )
