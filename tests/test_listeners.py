"""Listeners: every event a manager reports, sync and asyncio; a listener that raises
changes nothing; the OpenTelemetry adapter's spans and metrics; logging conventions."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest
import redis

import redreentrant
import redreentrant.asyncio as aio
from redreentrant import LockInfo, LockListener, LockManager, QuorumUnavailableError
from redreentrant._core.keys import lock_key
from redreentrant.testing import LocalEnsemble

pytestmark = pytest.mark.integration


class Recorder(LockListener):
    """Records every call as (event, lock name or master, details)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.changed = threading.Condition()

    def _add(self, event: str, who: str, **details: Any) -> None:
        with self.changed:
            self.calls.append((event, who, details))
            self.changed.notify_all()

    def events(self, name: str | None = None) -> list[str]:
        return [e for e, who, _ in self.calls if name is None or who == name]

    def wait_for(self, event: str, timeout: float = 5.0) -> dict[str, Any]:
        with self.changed:
            self.changed.wait_for(lambda: any(e == event for e, _, _ in self.calls), timeout)
        return next(d for e, _, d in self.calls if e == event)

    def acquire_started(self, lock: LockInfo) -> None:
        self._add("acquire_started", lock.name, kind=lock.kind, owner=lock.owner)

    def acquired(
        self, lock: LockInfo, wait: float, votes: int, masters: int, token: int | None
    ) -> None:
        self._add("acquired", lock.name, wait=wait, votes=votes, masters=masters, token=token)

    def acquire_failed(self, lock: LockInfo, wait: float, error: BaseException | None) -> None:
        self._add("acquire_failed", lock.name, wait=wait, error=error)

    def contended(self, lock: LockInfo, granted: int, refused: int, failed: int) -> None:
        self._add("contended", lock.name, granted=granted, refused=refused, failed=failed)

    def released(self, lock: LockInfo, held: float) -> None:
        self._add("released", lock.name, held=held)

    def renewal_failed(self, master: str, error: BaseException, locks: int) -> None:
        self._add("renewal_failed", master, error=error, locks=locks)

    def lost(self, lock: LockInfo, reason: str) -> None:
        self._add("lost", lock.name, reason=reason)

    def quorum_unavailable(self, action: str, errors: Mapping[str, BaseException]) -> None:
        self._add("quorum_unavailable", action, errors=dict(errors))


def test_an_acquire_and_release_are_told_with_wait_votes_and_hold_time(urls: list[str]) -> None:
    rec = Recorder()
    with LockManager(urls, listener=rec, fencing=True) as mgr:
        lock = mgr.lock("told")
        with lock, lock:  # a re-entry is not an acquire
            time.sleep(0.05)
        assert rec.events("told") == ["acquire_started", "acquired", "released"]
        started, acquired, released = (d for _, _, d in rec.calls)
        assert started["kind"] == "lock" and started["owner"] == mgr.owner_id()
        assert 3 <= acquired["votes"] <= 5 and acquired["masters"] == 5
        assert isinstance(acquired["token"], int) and 0 <= acquired["wait"] < 1
        assert released["held"] >= 0.05
    for url in urls:
        redis.Redis.from_url(url).delete("redreentrant:v1:{told}:fence")


def test_every_kind_is_told_by_its_label(urls: list[str]) -> None:
    rec = Recorder()
    with LockManager(urls, listener=rec) as mgr:
        with mgr.semaphore("sem", permits=2):
            pass
        with mgr.multi_lock(["b", "a"]) as many:
            pass
        rw = mgr.rw_lock("rw")
        with rw.upgradeable:
            assert rw.upgradeable.upgrade()
            rw.upgradeable.downgrade()
    kinds = [(who, d["kind"]) for e, who, d in rec.calls if e == "acquire_started"]
    assert kinds == [
        ("sem", "semaphore"),
        (json.dumps(list(many.names)), "multi"),
        ("rw", "rw:upgradeable"),
        ("rw", "rw:write"),  # the upgrade
    ]


def test_contention_and_a_timed_out_acquire_are_told(urls: list[str]) -> None:
    rec = Recorder()
    with LockManager(urls) as holder, LockManager(urls, listener=rec) as waiter:
        with holder.lock("busy"):
            assert not waiter.lock("busy").acquire(timeout=0.2)
        events = rec.events("busy")
        assert events[0] == "acquire_started" and events[-1] == "acquire_failed"
        assert "contended" in events
        contended = rec.wait_for("contended")
        assert contended["refused"] == 5 and contended["granted"] == 0
        failed = rec.wait_for("acquire_failed")
        assert failed["error"] is None and failed["wait"] >= 0.2


def test_a_loss_and_failed_renewals_are_told(ensemble: LocalEnsemble) -> None:
    rec = Recorder()
    with LockManager(ensemble.urls, lease=1.5, listener=rec) as mgr:
        lock = mgr.lock("fragile")
        lock.acquire()
        ensemble[4].pause()  # renewals fail there: told per master
        try:
            failed = rec.wait_for("renewal_failed")
        finally:
            ensemble[4].resume()
        assert failed["locks"] == 1 and isinstance(failed["error"], Exception)
        masters = {who for e, who, _ in rec.calls if e == "renewal_failed"}
        assert masters == {mgr.masters[4]}
        for url in ensemble.urls:
            redis.Redis.from_url(url).delete(lock_key("fragile"))
        lost = rec.wait_for("lost")
        assert "deleted" in lost["reason"]
        with pytest.raises(redreentrant.LockLostError):
            lock.release()
        assert "released" not in rec.events("fragile")


def test_quorum_unavailable_is_told(ensemble: LocalEnsemble) -> None:
    rec = Recorder()
    with LockManager(ensemble.urls, listener=rec) as mgr:
        for server in ensemble.servers[:3]:
            server.stop()
        with pytest.raises(QuorumUnavailableError):
            mgr.lock("down").acquire()
    told = rec.wait_for("quorum_unavailable")
    assert len(told["errors"]) == 3
    failed = rec.wait_for("acquire_failed")
    assert isinstance(failed["error"], QuorumUnavailableError)


def test_a_listener_that_raises_changes_nothing(
    urls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(LockListener):
        def acquired(self, *args: object) -> None:
            raise RuntimeError("listener bug")

        def released(self, *args: object) -> None:
            raise RuntimeError("listener bug")

    with LockManager(urls, listener=Broken()) as mgr, caplog.at_level(logging.ERROR):
        lock = mgr.lock("robust")
        with lock:
            assert lock.is_owned()
        assert not lock.locked()
    assert sum("a lock listener raised" in r.message for r in caplog.records) == 2


def test_a_listener_must_be_a_lock_listener(urls: list[str]) -> None:
    with pytest.raises(TypeError, match="LockListener"):
        LockManager(urls, listener=object())  # type: ignore[arg-type]


def test_asyncio_listeners(urls: list[str]) -> None:
    rec = Recorder()

    async def main() -> None:
        async with aio.LockManager(urls, listener=rec) as mgr, mgr.lock("a-told"):
            pass

    asyncio.run(main())
    assert rec.events("a-told") == ["acquire_started", "acquired", "released"]


# -- OpenTelemetry -------------------------------------------------------------------------


def test_the_opentelemetry_listener_makes_spans_and_metrics(urls: list[str]) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from redreentrant.otel import OpenTelemetryListener

    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    listener = OpenTelemetryListener(tracer_provider, MeterProvider(metric_readers=[reader]))
    tracer = tracer_provider.get_tracer("app")
    with LockManager(urls, listener=listener) as mgr, LockManager(urls) as other:
        with tracer.start_as_current_span("job"), mgr.lock("traced"):
            pass
        with other.lock("traced"):
            assert not mgr.lock("traced").acquire(timeout=0.1)
    finished = {s.name: s for s in spans.get_finished_spans()}
    acquire = [s for s in spans.get_finished_spans() if s.name == "redreentrant.acquire"]
    assert len(acquire) == 2
    ok, timed_out = acquire
    assert ok.parent is not None and ok.parent.span_id == finished["job"].context.span_id
    assert ok.attributes is not None and ok.attributes["redreentrant.lock.name"] == "traced"
    assert ok.attributes["redreentrant.votes"] >= 3  # the round may end once 3 granted
    assert (
        timed_out.attributes is not None and timed_out.attributes["redreentrant.acquired"] is False
    )
    assert any(e.name == "contended" for e in timed_out.events)
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points[metric.name] = list(metric.data.data_points)
    outcomes = {p.attributes["outcome"]: p.value for p in points["redreentrant.lock.acquires"]}
    assert outcomes == {"acquired": 1, "timeout": 1}
    assert points["redreentrant.lock.held"][0].count == 1
    assert points["redreentrant.lock.wait"][0].count == 2
    assert points["redreentrant.lock.contended"][0].value >= 1


# -- logging -------------------------------------------------------------------------------


def test_the_library_logs_through_module_loggers_and_configures_no_handler() -> None:
    handlers = logging.getLogger("redreentrant").handlers
    assert [type(h) for h in handlers] == [logging.NullHandler]
    from redreentrant._core import listeners, manager, watchdog

    for module in (listeners, manager, watchdog):
        assert module.log.name == module.__name__
