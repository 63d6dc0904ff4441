"""Real packet faults between local masters and their clients: :class:`NetLab`.

A lab is a network namespace of its own, made for one test, with ``redis-server``
masters listening on its loopback, and firewall rules on that loopback that cut, lose
or delay packets: no proxy in between, the clients' TCP sees what a real network does
(a cut connection stays established and retransmits; after a heal the retransmitted
request runs). Nothing outside the namespace is touched. Linux and root only, with the
``ip``, ``nft`` and ``iptables`` commands; :func:`available` says why not, elsewhere::

    from redreentrant import LockManager
    from redreentrant.testing import NetLab

    with NetLab(masters=3, clients=1) as lab:
        worker = lab.popen(["python", "worker.py", *lab.urls(client=0)])
        with lab.entered(), LockManager(lab.urls()) as mgr:  # this thread is inside
            lab.cut(0, way="replies")        # master 0 runs requests; no reply comes back
            lab.delay(1, 100, jitter_ms=20)  # each packet to or from master 1: 80-120 ms
            lab.cut(2, client=0)             # the worker loses master 2, the test does not
            ...
            lab.heal()

Addresses: master ``i`` listens on ``127.1.<p>.<i+1>``, one address per *path* ``p``:
path 0 is the test process's (:meth:`NetLab.urls`), path ``j + 1`` client ``j``'s
(``urls(client=j)``), all on one port. A fault hits one master, on every path or on one
client's, in both ways or only its requests (packets to the master) or its replies
(packets from it). Cuts and losses are ``nft`` rules in a table of the lab's, in the
output hook (where a loopback packet passes once); delays are ``iptables`` ``NFQUEUE``
rules and a delayer process (:mod:`redreentrant.testing.nfqueue`), since ``tc netem``
is not in every kernel. The faults are kept here, and every change rewrites the rules.

Network namespaces belong to threads: :meth:`NetLab.entered` moves the calling thread
in and back out, and what it makes inside (sockets, threads, processes) stays inside.
Clients connect (and reconnect) when they need to, so use them inside too.
:meth:`NetLab.close` stops every process of the lab and deletes the namespace, with its
rules; failing that, the exit-time clean-up (:mod:`redreentrant.testing.cleanup`)
does, and after a hard kill the reaper (:mod:`redreentrant.testing.reaper`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

from . import cleanup, nfqueue, reaper
from .binary import find_redis_server
from .server import LocalServer, start_all, stop_all

__all__ = ["NetLab", "Way", "available"]

Way = Literal["both", "requests", "replies"]

_TOOLS = ("ip", "nft", "iptables", "iptables-restore")
_MAX_PATHS = 16  # redis-server binds at most 16 addresses
_TABLE = "inet netlab"
_CHAIN = "faults"
_CLONE_NEWNET = 0x40000000  # <sched.h>
_WAIT = 5.0  # seconds for a process of the lab to end
_names = itertools.count()

_Key = tuple[int, int, str]  # (master, path, "requests" or "replies")


def _tool(name: str) -> str | None:
    # root's tools live in the sbin directories, which a user's PATH may lack
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return shutil.which(name, path=path)


@functools.cache
def available() -> str | None:
    """None where labs can be made, else the reason they cannot (for a test's skip)."""
    if not sys.platform.startswith("linux"):
        return "network labs need Linux (network namespaces, nftables)"
    if os.geteuid() != 0:
        return "network labs need root (to make network namespaces and firewall rules)"
    for name in _TOOLS:
        if _tool(name) is None:
            return f"network labs need the {name!r} command (iproute2, nftables, iptables)"
    probe = f"rr-{os.getpid()}-probe"
    reaper.watch_netns(probe, _tool("ip") or "ip")
    try:
        made = _run(["ip", "netns", "add", probe], check=False)
        if made.returncode != 0:
            return f"cannot make a network namespace: {made.stderr.strip()}"
        _run(["ip", "netns", "del", probe], check=False)
    finally:
        reaper.forget_netns(probe)
    return None


def _run(
    args: Sequence[str], stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    command = [_tool(args[0]) or args[0], *args[1:]]
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stderr.strip()}")
    return done


@functools.cache
def _setns() -> Callable[[int, int], int]:
    setns: Callable[[int, int], int] = ctypes.CDLL(None, use_errno=True).setns
    setns.argtypes = [ctypes.c_int, ctypes.c_int]  # type: ignore[attr-defined]
    setns.restype = ctypes.c_int  # type: ignore[attr-defined]
    return setns


def _enter(fd: int) -> None:
    """Move the calling thread into the network namespace of ``fd``."""
    if _setns()(fd, _CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"setns: {os.strerror(error)}")


class NetLab:
    """A network namespace with ``masters`` redis-servers on its loopback, and faults
    on the packets between them and the test (path 0) or ``clients`` clients.

    :param masters: number of masters, at least 1.
    :param clients: client paths besides the test's own, 0 to 15.
    :param binary: ``redis-server`` to run; default
        :func:`~redreentrant.testing.find_redis_server`.
    :param port: the port every master listens on (the namespace is fresh: any is free).
    :param server_env: the variables added to master ``index``'s environment, by index.
    """

    def __init__(
        self,
        masters: int = 5,
        clients: int = 0,
        *,
        binary: str | None = None,
        port: int = 6379,
        server_env: Callable[[int], Mapping[str, str]] | None = None,
    ) -> None:
        if masters < 1:
            raise ValueError(f"masters must be at least 1, got {masters}")
        if not 0 <= clients < _MAX_PATHS:
            raise ValueError(f"clients must be 0 to {_MAX_PATHS - 1}, got {clients}")
        binary = find_redis_server(binary)
        self.masters = masters
        self.clients = clients
        self.port = port
        self.name = f"rr-{os.getpid()}-{next(_names)}"
        self.servers: list[LocalServer] = []
        self._lock = threading.RLock()
        self._cuts: set[_Key] = set()
        self._losses: dict[_Key, float] = {}
        self._delays: dict[_Key, tuple[float, float]] = {}
        self._delayer: subprocess.Popen[str] | None = None
        self._processes: list[subprocess.Popen[Any]] = []
        self._made = False
        self._closed = False
        cleanup.track(self, self.close)  # before the servers: at exit, it stops them all
        self.servers += [
            LocalServer(
                binary=binary,
                port=port,
                host=self.address(index),
                also_bind=[self.address(index, client) for client in range(clients)],
                env=server_env(index) if server_env is not None else None,
            )
            for index in range(masters)
        ]

    # -- addresses -------------------------------------------------------------------

    def address(self, master: int, client: int | None = None) -> str:
        """The address of ``master`` on the test's path, or on ``client``'s."""
        return f"127.1.{self._path(client)}.{self._master(master) + 1}"

    def urls(self, client: int | None = None) -> list[str]:
        """The masters' URLs on the test's path, or on ``client``'s."""
        return [f"redis://{self.address(i, client)}:{self.port}/0" for i in range(self.masters)]

    # -- life ------------------------------------------------------------------------

    def start(self, master: int | None = None) -> NetLab:
        """Make the namespace and start every master in it; or, given ``master``, start
        that master (again) in it."""
        if master is not None:
            with self.entered():
                self.servers[self._master(master)].start()
            return self
        if self._closed:
            raise RuntimeError(f"{self.name} was closed")
        if self._made:
            return self
        # Before it exists, from outside: the reaper, if it starts now, runs outside.
        reaper.watch_netns(self.name, _tool("ip") or "ip")
        try:
            _run(["ip", "netns", "add", self.name])
            self._made = True
            self._inside(["ip", "link", "set", "lo", "up"])
            self._inside(
                ["nft", "-f", "-"],
                f"add table {_TABLE}\nadd chain {_TABLE} {_CHAIN} "
                "{ type filter hook output priority 0; policy accept; }\n",
            )
            with self.entered():
                start_all(self.servers)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop the delayer, the processes of :meth:`popen` and the masters, and delete
        the namespace with its rules. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            delayer, self._delayer = self._delayer, None
            if delayer is not None:
                self._end(delayer, close_stdin=True)
            for process in self._processes:
                self._end(process)
            stop_all(self.servers)
            for server in self.servers:
                server.close()
            if self._made:
                # Anything else that runs inside (started by a thread that was in it).
                spared = {os.getpid(), reaper.pid()}
                for pid in _run(["ip", "netns", "pids", self.name], check=False).stdout.split():
                    if int(pid) not in spared:
                        with contextlib.suppress(OSError):
                            os.kill(int(pid), signal.SIGKILL)
                _run(["ip", "netns", "del", self.name], check=False)
            reaper.forget_netns(self.name)
            cleanup.untrack(self)

    def __enter__(self) -> NetLab:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Move the calling thread into the namespace, and back on exit. Sockets it
        makes inside, threads it starts and processes it forks stay inside."""
        if not self._made or self._closed:
            raise RuntimeError(f"{self.name} is not running: start() it first")
        back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            target = os.open(f"/var/run/netns/{self.name}", os.O_RDONLY)
            try:
                _enter(target)
            finally:
                os.close(target)
            try:
                yield
            finally:
                _enter(back)
        finally:
            os.close(back)

    def popen(self, args: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start a process inside the namespace (``subprocess.Popen(args,
        **popen_kwargs)``); :meth:`close` kills it, and the reaper after a hard kill."""
        with self._lock, self.entered():
            process: subprocess.Popen[Any] = subprocess.Popen(args, **popen_kwargs)
            self._processes.append(process)
        return process

    # -- masters ---------------------------------------------------------------------

    def kill(self, master: int) -> None:
        """SIGKILL ``master`` (a crash)."""
        self.servers[self._master(master)].kill()

    def freeze(self, master: int) -> None:
        """SIGSTOP ``master``: connections are accepted, nothing is answered."""
        self.servers[self._master(master)].pause()

    def thaw(self, master: int) -> None:
        """SIGCONT a frozen ``master``."""
        self.servers[self._master(master)].resume()

    def restart(self, master: int) -> None:
        """Stop ``master`` and start it again inside, empty."""
        with self.entered():
            self.servers[self._master(master)].restart()

    # -- faults ----------------------------------------------------------------------

    def cut(self, master: int, client: int | None = None, way: Way = "both") -> None:
        """Drop every packet of ``master`` on ``client``'s path (every path if None).
        Connections stay established and retransmit: no reset is sent."""
        with self._lock:
            self._cuts.update(self._keys(master, client, way))
            self._write_nft()

    def loss(
        self, master: int, percent: float, client: int | None = None, way: Way = "both"
    ) -> None:
        """Drop ``percent`` % of the packets of ``master``, at random (0: none)."""
        if not 0 <= percent <= 100:
            raise ValueError(f"percent must be 0 to 100, got {percent}")
        with self._lock:
            for key in self._keys(master, client, way):
                if percent:
                    self._losses[key] = percent
                else:
                    self._losses.pop(key, None)
            self._write_nft()

    def delay(
        self,
        master: int,
        ms: float,
        jitter_ms: float = 0.0,
        client: int | None = None,
        way: Way = "both",
    ) -> None:
        """Hold each packet of ``master`` for ``ms`` ± ``jitter_ms`` milliseconds
        (uniform; packets reorder under jitter). A round trip takes twice ``ms``."""
        if ms < 0 or not 0 <= jitter_ms <= ms:
            raise ValueError(f"need 0 <= jitter_ms <= ms, got ms={ms}, jitter_ms={jitter_ms}")
        with self._lock:
            keys = self._keys(master, client, way)
            for key in keys:  # the delayer first, so no packet passes a rule undelayed
                self._tell_delayer(
                    {"queue": self._queue(key), "delay_ms": ms, "jitter_ms": jitter_ms}
                )
                self._delays[key] = (ms, jitter_ms)
            self._write_iptables()

    def heal(self, master: int | None = None, client: int | None = None) -> None:
        """Undo the faults of ``master`` (every master if None) on ``client``'s path
        (every path if None)."""
        with self._lock:
            masters = range(self.masters) if master is None else [self._master(master)]
            paths = range(self.clients + 1) if client is None else [self._path(client)]

            def hit(key: _Key) -> bool:
                return key[0] in masters and key[1] in paths

            self._cuts = {key for key in self._cuts if not hit(key)}
            self._losses = {key: p for key, p in self._losses.items() if not hit(key)}
            self._write_nft()
            healed = [key for key in self._delays if hit(key)]
            if healed:
                for key in healed:
                    del self._delays[key]
                self._write_iptables()  # the rules first, then the queues' held packets go
                for key in healed:
                    self._tell_delayer({"queue": self._queue(key), "remove": True})

    # -- internals -------------------------------------------------------------------

    def _master(self, master: int) -> int:
        if not 0 <= master < self.masters:
            raise IndexError(f"master {master} of {self.masters}")
        return master

    def _path(self, client: int | None) -> int:
        if client is None:
            return 0
        if not 0 <= client < self.clients:
            raise IndexError(f"client {client} of {self.clients}")
        return client + 1

    def _keys(self, master: int, client: int | None, way: Way) -> list[_Key]:
        if way not in ("both", "requests", "replies"):
            raise ValueError(f"way must be 'both', 'requests' or 'replies', got {way!r}")
        ways = ("requests", "replies") if way == "both" else (way,)
        paths = range(self.clients + 1) if client is None else [self._path(client)]
        return [(self._master(master), path, w) for path in paths for w in ways]

    def _queue(self, key: _Key) -> int:
        master, path, way = key
        return 1 + 2 * (master * (self.clients + 1) + path) + (way == "replies")

    def _match(self, key: _Key, nft: bool) -> str:
        """The match of ``key``'s packets, in nft's or iptables' words."""
        master, path, way = key
        address = f"127.1.{path}.{master + 1}"
        if nft:
            side = "daddr" if way == "requests" else "saddr"
            end = "dport" if way == "requests" else "sport"
            return f"ip {side} {address} tcp {end} {self.port}"
        side, end = ("-d", "--dport") if way == "requests" else ("-s", "--sport")
        return f"{side} {address}/32 -p tcp -m tcp {end} {self.port}"

    def _write_nft(self) -> None:
        lines = [f"flush chain {_TABLE} {_CHAIN}"]
        rule = f"add rule {_TABLE} {_CHAIN}"
        lines += [f"{rule} {self._match(key, True)} drop" for key in sorted(self._cuts)]
        lines += [
            f"{rule} {self._match(key, True)} numgen random mod 10000 < {round(p * 100)} drop"
            for key, p in sorted(self._losses.items())
        ]
        self._inside(["nft", "-f", "-"], "\n".join(lines) + "\n")

    def _write_iptables(self) -> None:
        lines = ["*filter", ":OUTPUT ACCEPT [0:0]"]
        lines += [
            f"-A OUTPUT {self._match(key, False)} -j NFQUEUE --queue-num {self._queue(key)} "
            "--queue-bypass"
            for key in sorted(self._delays)
        ]
        self._inside(["iptables-restore"], "\n".join([*lines, "COMMIT"]) + "\n")

    def _tell_delayer(self, request: dict[str, Any]) -> None:
        if self._delayer is None or self._delayer.poll() is not None:
            with self.entered():
                # By its path, isolated (-I: nothing of the environment or the
                # script's directory on its path): it needs only the standard library.
                self._delayer = subprocess.Popen(
                    [sys.executable, "-I", "-S", nfqueue.__file__],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    start_new_session=True,  # a terminal's Ctrl-C is for the test runner
                )
        delayer = self._delayer
        assert delayer.stdin is not None and delayer.stdout is not None
        try:
            delayer.stdin.write(json.dumps(request) + "\n")
            delayer.stdin.flush()
            answer = json.loads(delayer.stdout.readline() or "{}")
        except (OSError, ValueError) as error:
            answer = {"error": str(error)}
        if "ok" not in answer:
            raise RuntimeError(
                f"the packet delayer of {self.name}: {answer.get('error', 'it exited')}"
            )

    def _inside(self, args: Sequence[str], stdin: str | None = None) -> None:
        """Run a command in the namespace (never outside: ``ip`` fails if it is gone)."""
        if not self._made or self._closed:
            raise RuntimeError(f"{self.name} is not running: start() it first")
        _run(["ip", "netns", "exec", self.name, _tool(args[0]) or args[0], *args[1:]], stdin)

    @staticmethod
    def _end(process: subprocess.Popen[Any], close_stdin: bool = False) -> None:
        """End ``process``: by the end of its input if it stops at that, else SIGKILL."""
        if close_stdin and process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        else:
            with contextlib.suppress(OSError):
                process.kill()
        try:
            process.wait(_WAIT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._made else "not started"
        return f"<NetLab {self.name} masters={self.masters} clients={self.clients} {state}>"
