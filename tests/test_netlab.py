"""Real packet faults in a network namespace of the test's own
(:mod:`redreentrant.testing.netlab`): each fault shown to happen, with redis-py clients
made inside the namespace, and the namespace gone afterwards, also after a hard kill.

Root and Linux only (with ``ip``, ``nft`` and ``iptables``): elsewhere these tests skip
with the reason, and under CI=true, where no test may skip, they fail.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import pytest
import redis
from helpers import PY, read_line, require_redis_server, stop, wait_until
from redis.backoff import NoBackoff
from redis.retry import Retry

from redreentrant import LockManager, QuorumUnavailableError
from redreentrant.cli._process import die_with_parent
from redreentrant.testing import NetLab
from redreentrant.testing.netlab import Way

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

#: a TCP retransmission after a heal comes after the RTO's back-off: seconds, not ms
RETRANSMITTED = 10.0


def client(lab: NetLab, master: int, path: int | None = None, timeout: float = 0.5) -> redis.Redis:
    """A client of ``master`` on ``path``'s address that never retries; use it inside
    the lab (it connects where it first runs a command)."""
    return redis.Redis(
        host=lab.address(master, path),
        port=lab.port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


def connection(lab: NetLab, master: int, path: int | None = None) -> redis.Connection:
    """One connection of ``master`` on ``path``'s address, connected (from inside the
    lab): a command on it may be sent, and its reply read later."""
    conn = redis.Connection(
        host=lab.address(master, path),
        port=lab.port,
        socket_timeout=0.5,
        socket_connect_timeout=2.0,
        decode_responses=True,
        retry=Retry(NoBackoff(), 0),
    )
    conn.connect()
    return conn


def round_trip(conn: redis.Connection, limit: float = RETRANSMITTED) -> float:
    start = time.monotonic()
    conn.send_command("PING")
    assert conn.can_read(timeout=limit)
    assert conn.read_response() == "PONG"
    return time.monotonic() - start


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def pids_in(name: str) -> set[int]:
    done = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    return {int(pid) for pid in done.stdout.split()}


def gone(pid: int) -> bool:
    """The process ended (a zombie no one reaped yet counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] == b"Z"
    except OSError:
        return True


@pytest.mark.parametrize("way", ["requests", "both"])
def test_a_request_sent_during_a_cut_runs_after_the_heal(
    make_lab: Callable[..., NetLab], way: Way
) -> None:
    lab = make_lab(1, 1)
    with lab.entered():
        observer = client(lab, 0)  # on the test's path, which stays up
        sender = connection(lab, 0, 0)  # on client 0's path
        lab.cut(0, client=0, way=way)
        sender.send_command("SET", "k", "sent during the cut")
        with pytest.raises(redis.TimeoutError):
            sender.read_response(disconnect_on_error=False)
        assert observer.get("k") is None  # not run: the request is held back
        lab.heal()
        # The connection was never reset: TCP sends the request again, and it runs.
        wait_until(lambda: observer.get("k") is not None, "the SET run", RETRANSMITTED)
        assert observer.get("k") == "sent during the cut"
        assert sender.can_read(timeout=RETRANSMITTED)
        assert sender.read_response() == "OK"  # and its reply comes


def test_a_replies_cut_runs_the_command_but_holds_its_reply(
    make_lab: Callable[..., NetLab],
) -> None:
    lab = make_lab(1, 1)
    with lab.entered():
        observer = client(lab, 0)
        sender = connection(lab, 0, 0)
        lab.cut(0, client=0, way="replies")
        sender.send_command("INCR", "n")
        wait_until(lambda: observer.get("n") == "1", "the INCR run on the master")
        assert not sender.can_read(timeout=0.5)  # its reply does not arrive
        lab.heal()
        assert sender.can_read(timeout=RETRANSMITTED)
        assert sender.read_response() == 1


def test_a_cut_of_one_client_path_leaves_the_other_paths_working(
    make_lab: Callable[..., NetLab],
) -> None:
    lab = make_lab(2, 2)
    with lab.entered():
        cut = client(lab, 0, 0)
        assert cut.ping()
        lab.cut(0, client=0)
        with pytest.raises(redis.TimeoutError):
            cut.ping()
        assert client(lab, 0).ping()  # the same master on the test's path
        assert client(lab, 0, 1).ping()  # and on client 1's
        assert client(lab, 1, 0).ping()  # another master on client 0's path
        with pytest.raises((redis.TimeoutError, redis.ConnectionError)):
            client(lab, 0, 0).ping()  # a new connection on the cut path: no answer


def test_loss_makes_some_round_trips_slow_and_lets_others_through(
    make_lab: Callable[..., NetLab],
) -> None:
    lab = make_lab(1, 0)
    with lab.entered():
        conn = connection(lab, 0)
        lab.loss(0, 30, way="requests")
        # A lost request is sent again by TCP no sooner than its minimal RTO (200 ms);
        # one that gets through is answered at once. Both kinds come, almost surely
        # (no loss in 24 tries: a chance of 0.7^24, 2e-4). The RTO doubles at each
        # resend: only a request lost eight times running waits over 30 s (a chance of
        # 24 * 0.3^8, 2e-3).
        times = [round_trip(conn, limit=30.0) for _ in range(24)]
        assert min(times) < 0.1, times
        assert max(times) >= 0.15, times
        lab.heal()
        assert max(round_trip(conn) for _ in range(5)) < 0.1


def test_delay_and_jitter_slow_each_packet(make_lab: Callable[..., NetLab]) -> None:
    lab = make_lab(2, 0)
    with lab.entered():
        delayed, other = connection(lab, 0), connection(lab, 1)
        lab.delay(0, 100)
        assert round_trip(delayed) >= 0.15  # 100 ms there, 100 ms back
        assert round_trip(other) < 0.1
        lab.delay(0, 50, jitter_ms=40)  # each packet 10 to 90 ms
        times = [round_trip(delayed) for _ in range(8)]
        assert max(times) - min(times) >= 0.02, times
        lab.heal()
        assert round_trip(delayed) < 0.1


def test_the_masters_come_back_inside(make_lab: Callable[..., NetLab]) -> None:
    lab = make_lab(1, 1)
    with lab.entered():
        client(lab, 0).set("k", "v")
    lab.kill(0)
    lab.start(0)
    lab.freeze(0)
    lab.thaw(0)
    lab.restart(0)
    with lab.entered():
        assert client(lab, 0).get("k") is None  # empty after the restart
        assert client(lab, 0, 0).ping()  # on every path


def test_close_removes_the_namespace_and_every_process_in_it(
    make_lab: Callable[..., NetLab],
) -> None:
    lab = make_lab(2, 1)
    lab.delay(0, 10)  # the delayer runs
    sleeper = lab.popen([PY, "-c", "import time; time.sleep(60)"], preexec_fn=die_with_parent())
    inside = pids_in(lab.name)
    assert {sleeper.pid, *(server.pid for server in lab.servers)} < inside  # + the delayer
    lab.close()
    assert lab.name not in namespaces().split()
    assert all(gone(pid) for pid in inside)
    lab.close()  # idempotent


def test_the_reaper_removes_the_namespace_of_a_process_killed_hard(
    make_lab: Callable[..., NetLab],
) -> None:
    make_lab(1, 0).close()  # skips like the others where labs cannot be made
    code = (
        "import sys, time\n"
        "from redreentrant.testing import NetLab\n"
        "lab = NetLab(1, 0, binary=sys.argv[1]).start()\n"
        "lab.delay(0, 10)\n"
        "lab.popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(lab.name, flush=True)\n"
        "time.sleep(60)\n"
    )
    binary = require_redis_server("the network lab tests")
    parent = subprocess.Popen(
        [PY, "-c", code, binary], stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent()
    )
    try:
        name = read_line(parent).strip()
        inside = pids_in(name)
        assert len(inside) >= 3  # the server, the delayer and the sleeper
    finally:
        stop(parent)  # SIGKILL: no exit-time clean-up runs
    wait_until(lambda: name not in namespaces().split(), "the namespace deleted")
    wait_until(lambda: all(gone(pid) for pid in inside), "every process of it ended")


@pytest.mark.redreentrant(masters=3)
def test_the_plugins_fixture(redreentrant_netlab: NetLab) -> None:
    lab = redreentrant_netlab
    assert len(lab.servers) == 3
    with lab.entered(), LockManager(lab.urls(), master_timeout=0.2) as mgr:
        lab.cut(0)  # a minority cut off: still a quorum
        with mgr.lock("netlab"):
            pass
        lab.cut(1, way="replies")  # a majority: no quorum
        with pytest.raises(QuorumUnavailableError):
            mgr.lock("netlab").acquire(blocking=False)
        lab.heal()

        def taken() -> bool:
            # The masters cut off are suspects until a probe hears them again (in the
            # background, within a probe interval): until then a try fails at once.
            try:
                with mgr.lock("netlab"):
                    return True
            except QuorumUnavailableError:
                return False

        wait_until(taken, "the lock taken after the heal", 5.0)
