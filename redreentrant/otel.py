"""OpenTelemetry for redreentrant: :class:`OpenTelemetryListener`, a
:class:`~redreentrant.LockListener` that makes a span per acquire and metrics of
waits, holds and failures.

It needs only the OpenTelemetry *API* (``pip install 'redreentrant[otel]'``); what is
exported, and where, is the application's SDK configuration. Without an SDK every call
is the API's no-op::

    from redreentrant import LockManager
    from redreentrant.otel import OpenTelemetryListener

    mgr = LockManager(masters, listener=OpenTelemetryListener())

Spans: ``redreentrant.acquire`` for each first acquire, a child of the span current
where ``acquire()`` is called, with the lock's name and kind, the votes and the wait
as attributes, an event per contended round, and an error status when the acquire
failed. Metrics (instrument names below), with the lock kind as attribute: the lock
name is left out of metrics on purpose (one series per name would not scale).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from opentelemetry import metrics, trace
from opentelemetry.trace import Span, Status, StatusCode

from ._core.listeners import LockInfo, LockListener

__all__ = ["OpenTelemetryListener"]

_NAME = "redreentrant"


class OpenTelemetryListener(LockListener):
    """Spans and metrics of one manager's locks (see the module docstring).

    ``tracer_provider`` and ``meter_provider`` default to the global ones.

    Instruments:

    - ``redreentrant.lock.acquires`` (counter): first acquires, by ``outcome``
      (``acquired``, ``timeout``, ``error``);
    - ``redreentrant.lock.wait`` (histogram, s): how long acquires waited;
    - ``redreentrant.lock.held`` (histogram, s): how long locks were held;
    - ``redreentrant.lock.contended`` (counter): rounds that did not win;
    - ``redreentrant.lock.lost`` (counter): holds lost;
    - ``redreentrant.renewal.failures`` (counter): failed renewal calls, by ``master``;
    - ``redreentrant.quorum.unavailable`` (counter): operations that found too few
      masters, by ``operation``.
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        from . import __version__

        self._tracer = trace.get_tracer(_NAME, __version__, tracer_provider)
        meter = metrics.get_meter(_NAME, __version__, meter_provider)
        self._acquires = meter.create_counter(
            "redreentrant.lock.acquires", "{acquire}", "First acquires, by outcome"
        )
        self._wait = meter.create_histogram(
            "redreentrant.lock.wait", "s", "How long acquires waited for the lock"
        )
        self._held = meter.create_histogram(
            "redreentrant.lock.held", "s", "How long locks were held"
        )
        self._contended = meter.create_counter(
            "redreentrant.lock.contended", "{round}", "Acquire rounds that did not win"
        )
        self._lost = meter.create_counter("redreentrant.lock.lost", "{hold}", "Holds lost")
        self._renewal_failures = meter.create_counter(
            "redreentrant.renewal.failures", "{call}", "Renewal calls that failed, by master"
        )
        self._unavailable = meter.create_counter(
            "redreentrant.quorum.unavailable",
            "{operation}",
            "Operations that found too few masters for a quorum",
        )
        # The span of each acquire under way: started and ended by its owner's calls.
        self._spans: dict[LockInfo, Span] = {}
        self._guard = threading.Lock()

    def acquire_started(self, lock: LockInfo) -> None:
        span = self._tracer.start_span(
            "redreentrant.acquire",
            attributes={"redreentrant.lock.name": lock.name, "redreentrant.lock.kind": lock.kind},
        )
        with self._guard:
            self._spans[lock] = span

    def _end(self, lock: LockInfo) -> Span | None:
        with self._guard:
            return self._spans.pop(lock, None)

    def acquired(
        self, lock: LockInfo, wait: float, votes: int, masters: int, token: int | None
    ) -> None:
        kind = {"redreentrant.lock.kind": lock.kind}
        self._acquires.add(1, {**kind, "outcome": "acquired"})
        self._wait.record(wait, kind)
        span = self._end(lock)
        if span is not None:
            span.set_attribute("redreentrant.votes", votes)
            span.set_attribute("redreentrant.masters", masters)
            span.set_attribute("redreentrant.wait_s", wait)
            if token is not None:
                span.set_attribute("redreentrant.fencing_token", token)
            span.end()

    def acquire_failed(self, lock: LockInfo, wait: float, error: BaseException | None) -> None:
        outcome = "timeout" if error is None else "error"
        kind = {"redreentrant.lock.kind": lock.kind}
        self._acquires.add(1, {**kind, "outcome": outcome})
        self._wait.record(wait, kind)
        span = self._end(lock)
        if span is not None:
            span.set_attribute("redreentrant.wait_s", wait)
            if error is None:
                span.set_attribute("redreentrant.acquired", False)
            else:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            span.end()

    def contended(self, lock: LockInfo, granted: int, refused: int, failed: int) -> None:
        self._contended.add(1, {"redreentrant.lock.kind": lock.kind})
        with self._guard:
            span = self._spans.get(lock)
        if span is not None:
            counts = {"granted": granted, "refused": refused, "failed": failed}
            span.add_event("contended", counts)

    def released(self, lock: LockInfo, held: float) -> None:
        self._held.record(held, {"redreentrant.lock.kind": lock.kind})

    def renewal_failed(self, master: str, error: BaseException, locks: int) -> None:
        self._renewal_failures.add(1, {"redreentrant.master": master})

    def lost(self, lock: LockInfo, reason: str) -> None:
        self._lost.add(1, {"redreentrant.lock.kind": lock.kind})

    def quorum_unavailable(self, action: str, errors: Mapping[str, BaseException]) -> None:
        # The action names the lock ("acquire 'x'"): only its verb is an attribute.
        self._unavailable.add(1, {"redreentrant.operation": action.split(" ", 1)[0]})
