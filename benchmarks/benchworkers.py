"""Workers that contend for one lock: in threads of this process, or in worker processes.

Used by ``bench_all.py`` for the contended and hand-off workloads. Worker processes are
started once with the ``spawn`` method (:class:`ProcessPool`) and reused for every
case; each opens its own backend (one manager per process) per case. Every worker runs
:func:`worker_loop` in the same time window: the start and end are ``time.monotonic()``
instants, which all processes of one host share on Linux.

Not a benchmark itself.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import queue
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from benchcommon import ensure_repo_importable, fail_text
from benchlibs import Backend, LibSpec, LockOps, open_sync

START_MARGIN_S = 0.15  # from "everyone is ready" to the window's start
STALL_S = 20.0  # a worker still busy this long after the window's end has stalled
SETUP_TIMEOUT_S = 60.0  # for workers to open their backends (the first time: imports)


def warm_up(backend: Backend, name: str) -> None:
    """One acquire and release of a lock of the worker's own, before the window: every
    library's connections are open (and its scripts loaded) by the time it starts, so
    the window measures the contention, not the set-up, for every library alike."""
    ops = backend.new_lock(name)
    if not ops.acquire():
        raise RuntimeError("the warm-up acquire of an uncontended lock returned False")
    ops.release()


@dataclass(frozen=True)
class LoopParams:
    """What each worker does: acquire ``name``; if ``counter_key``, a non-atomic
    GET + SET of value + 1 on ``counter_url`` (through a plain client); sleep ``hold_s``;
    release; sleep ``think_s``; again until the window ends (the last operation is
    finished). ``record`` keeps (acquired, release called) instants of every hold."""

    name: str
    counter_url: str
    counter_key: str | None
    hold_s: float = 0.0
    think_s: float = 0.0
    record: bool = False


@dataclass
class WorkerResult:
    in_window: int = 0  # holds released by the end of the window
    total: int = 0  # every hold, the ones finished after the window included
    errors: list[str] = field(default_factory=list)
    events: list[tuple[float, float]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def worker_loop(
    ops: LockOps,
    counter: redis.Redis | None,
    params: LoopParams,
    start_at: float,
    end_at: float,
) -> WorkerResult:
    res = WorkerResult()
    delay = start_at - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    key = params.counter_key
    record = params.record
    try:
        while time.monotonic() < end_at:
            if not ops.acquire():
                res.errors.append("acquire timed out")
                break
            t_acquired = time.monotonic()
            try:
                if counter is not None and key is not None:
                    # Deliberately non-atomic: only the lock keeps this correct.
                    value = counter.get(key)
                    counter.set(key, int(value or 0) + 1)
                if params.hold_s:
                    time.sleep(params.hold_s)
            finally:
                t_release = time.monotonic()
                ops.release()
            res.total += 1
            if t_release <= end_at:
                res.in_window += 1
            if record:
                res.events.append((t_acquired, t_release))
            if params.think_s:
                time.sleep(params.think_s)
    except Exception as exc:
        res.errors.append(fail_text(exc))
    return res


def _backend_info(backend: Backend | None) -> dict[str, Any]:
    if backend is None:
        return {}
    out: dict[str, Any] = {}
    for k, v in backend.info.items():
        out[k] = v[0] if isinstance(v, list) else v
    return out


# --------------------------------------------------------------------------- threads


def run_threads(
    spec: LibSpec,
    urls: Sequence[str],
    params: LoopParams,
    n: int,
    duration: float,
    per_worker_backend: bool = False,
) -> tuple[list[WorkerResult], float, float]:
    """``n`` threads of this process; one shared backend (one manager), or one each."""
    shared = None if per_worker_backend else open_sync(spec, urls)
    counter = redis.Redis.from_url(params.counter_url)
    results: list[WorkerResult] = [WorkerResult() for _ in range(n)]
    ready = threading.Barrier(n + 1)
    go = threading.Event()
    window = [0.0, 0.0]

    def worker(i: int) -> None:
        backend = shared
        ops: LockOps | None = None
        try:
            if backend is None:
                backend = open_sync(spec, urls)
            warm_up(backend, f"{params.name}:warm:{i}")
            ops = backend.new_lock(params.name)  # made by the thread that will own it
        except Exception as exc:
            results[i].errors.append(fail_text(exc))
        with contextlib.suppress(threading.BrokenBarrierError):
            ready.wait(SETUP_TIMEOUT_S)
        go.wait()
        if ops is not None:
            results[i] = worker_loop(ops, counter, params, window[0], window[1])
        if per_worker_backend and backend is not None:
            results[i].info = _backend_info(backend)
            with contextlib.suppress(Exception):
                backend.close()

    threads = [
        threading.Thread(target=worker, args=(i,), daemon=True, name=f"bench-worker-{i}")
        for i in range(n)
    ]
    try:
        for t in threads:
            t.start()
        with contextlib.suppress(threading.BrokenBarrierError):
            ready.wait(SETUP_TIMEOUT_S)
        window[0] = time.monotonic() + START_MARGIN_S
        window[1] = window[0] + duration
        go.set()
        limit = window[1] + STALL_S
        for t in threads:
            t.join(max(0.0, limit - time.monotonic()))
        stalled = [i for i, t in enumerate(threads) if t.is_alive()]
        for i in stalled:
            results[i].errors.append(f"stalled: still busy {STALL_S:g}s after the window")
        if shared is not None:
            info = _backend_info(shared)
            for r in results:
                r.info = dict(info)
    finally:
        go.set()
        if shared is not None:
            with contextlib.suppress(Exception):
                shared.close()
        counter.close()
    return results, window[0], window[1]


# --------------------------------------------------------------------------- processes


def process_main(
    index: int, tasks: multiprocessing.Queue[Any], results: multiprocessing.Queue[Any]
) -> None:
    """A worker process: for each task, open the backend, report ready, wait for "go",
    run the loop, report the result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us; Ctrl-C is its
    ensure_repo_importable()
    while True:
        msg = tasks.get()
        if msg is None:
            return
        run_no, spec, urls, params = msg
        backend: Backend | None = None
        ops: LockOps | None = None
        counter: redis.Redis | None = None
        setup_error: str | None = None
        try:
            backend = open_sync(spec, urls)
            warm_up(backend, f"{params.name}:warm:{index}")
            ops = backend.new_lock(params.name)
            counter = redis.Redis.from_url(params.counter_url)
            counter.ping()
        except Exception as exc:
            setup_error = fail_text(exc)
        results.put(("ready", run_no, index, setup_error))
        go = tasks.get()
        if go is None:
            return
        _, go_run, start_at, end_at = go
        if ops is not None and go_run == run_no and start_at is not None:
            res = worker_loop(ops, counter, params, start_at, end_at)
        else:
            res = WorkerResult(errors=[setup_error] if setup_error else [])
        res.info = _backend_info(backend)
        if backend is not None:
            with contextlib.suppress(Exception):
                backend.close()
        if counter is not None:
            counter.close()
        results.put(("done", run_no, index, res))


class ProcessPool:
    """``n`` spawned worker processes, reused for every case; see :func:`process_main`."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._ctx = multiprocessing.get_context("spawn")
        self._run_no = 0
        self._procs: list[Any] = []
        self._tasks: list[Any] = []
        self._results: Any = None
        self._start()

    def _start(self) -> None:
        ensure_repo_importable()  # the children get this process's sys.path
        self._results = self._ctx.Queue()
        self._tasks = [self._ctx.Queue() for _ in range(self.n)]
        self._procs = [
            self._ctx.Process(
                target=process_main,
                args=(i, self._tasks[i], self._results),
                daemon=True,
                name=f"bench-proc-{i}",
            )
            for i in range(self.n)
        ]
        for p in self._procs:
            p.start()

    def _collect(self, kind: str, n: int, deadline: float) -> dict[int, Any]:
        got: dict[int, Any] = {}
        while len(got) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                msg_kind, run_no, index, payload = self._results.get(timeout=min(left, 1.0))
            except queue.Empty:
                if not all(p.is_alive() for p in self._procs):
                    break
                continue
            if msg_kind == kind and run_no == self._run_no:
                got[index] = payload
        return got

    def run(
        self,
        spec: LibSpec,
        urls: Sequence[str],
        params: LoopParams,
        duration: float,
        count: int | None = None,
    ) -> tuple[list[WorkerResult], float, float]:
        """Run the loop in ``count`` (default all) of the processes at once."""
        n = self.n if count is None else min(count, self.n)
        self._run_no += 1
        tasks = self._tasks[:n]
        for q in tasks:
            q.put((self._run_no, spec, list(urls), params))
        ready = self._collect("ready", n, time.monotonic() + SETUP_TIMEOUT_S)
        results = [WorkerResult() for _ in range(n)]
        if len(ready) < n:
            self._restart()
            for r in results:
                r.errors.append("worker process did not get ready")
            return results, 0.0, 0.0
        start_at = time.monotonic() + START_MARGIN_S
        end_at = start_at + duration
        for q in tasks:
            q.put(("go", self._run_no, start_at, end_at))
        done = self._collect("done", n, end_at + STALL_S)
        for i in range(n):
            if i in done:
                results[i] = done[i]
            else:
                results[i].errors.append(f"stalled: still busy {STALL_S:g}s after the window")
        if len(done) < n:
            self._restart()  # a stalled worker would answer the next case's messages
        return results, start_at, end_at

    def _restart(self) -> None:
        self._stop()
        self._start()

    def _stop(self) -> None:
        for q in self._tasks:
            with contextlib.suppress(Exception):
                q.put(None)
        deadline = time.monotonic() + 2.0
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(2.0)
            if p.is_alive():
                p.kill()

    def close(self) -> None:
        self._stop()

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- analysis


@dataclass
class Handoffs:
    latencies: list[float]  # seconds, from release() called to another's acquire() back
    regrabs: int  # the releaser took the lock straight back
    overlaps: int  # a hold began before the previous one ended: exclusion broken


def handoffs(results: Sequence[WorkerResult], start_at: float, end_at: float) -> Handoffs:
    """Hand-offs between holds inside the window, in the order of acquisition."""
    events = sorted(
        (acq, rel, worker)
        for worker, r in enumerate(results)
        for acq, rel in r.events
        if start_at <= acq and rel <= end_at
    )
    out = Handoffs([], 0, 0)
    for (_, prev_rel, prev_w), (acq, _, w) in itertools.pairwise(events):
        if acq < prev_rel:
            out.overlaps += 1
        elif w == prev_w:
            out.regrabs += 1
        else:
            out.latencies.append(acq - prev_rel)
    return out
