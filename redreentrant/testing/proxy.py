"""A loopback TCP proxy in front of one server, with faults on demand: :class:`TcpProxy`.

Put a master behind a proxy to make it slow, silent or broken without touching the
server process (which :meth:`~redreentrant.testing.LocalServer.pause` does with SIGSTOP)::

    from redreentrant.testing.proxy import TcpProxy

    with TcpProxy(server_port) as proxy:     # binds 127.0.0.1 on a free port
        url = proxy.url                      # "redis://127.0.0.1:PORT/0"
        proxy.delay(0.05)                    # every chunk, both ways, 50 ms late
        proxy.blackhole()                    # connections accepted, bytes read and dropped
        proxy.reset()                        # every connection closed (RST), new ones too
        proxy.pass_through()                 # back to normal

The modes:

``pass``
    Bytes are forwarded both ways as they come (the start mode).
``delay(seconds)``
    Every chunk read from either side is forwarded ``seconds`` after it was read, in
    order (a chunk is never overtaken by a later one, also when the delay changes).
``blackhole``
    New connections are accepted and every byte read from either side is dropped:
    nothing is forwarded and nothing is answered, so a client sees a silent peer (and
    its read time-out). Bytes queued when the mode is set are dropped too. Switching
    back to ``pass`` keeps the connections, but what was dropped stays lost: the stream
    of a client that sent during the blackhole is out of step (clients close a
    connection whose read timed out).
``reset``
    Every open connection is closed with a TCP reset, and new connections are accepted
    and reset at once, until another mode is set.

A mode change returns once the proxy applied it. A connection's upstream side is
opened when the connection is accepted (or, in ``blackhole``, when a byte must first be
forwarded); if the server refuses it, the client's connection is reset. When either
side closes, both are closed (no half-close). Reading from a side pauses while more
than 1 MiB waits to be written to the other.

Hand-written because the tools made for this (Toxiproxy, for one) are separate server
programs to install and drive over HTTP, and the suite must run from a clean clone with
Python packages only; the proxy is small and in-process.

One thread runs a :mod:`selectors` loop for the listening socket and every connection;
mode changes come from other threads through a wake-up socket pair. :meth:`stop` (or
leaving the ``with`` block) closes everything and joins the thread.
"""

from __future__ import annotations

import collections
import contextlib
import selectors
import socket
import struct
import threading
import time

from .loopback import HOST

__all__ = ["MODES", "TcpProxy"]

MODES = ("pass", "delay", "blackhole", "reset")

_CHUNK = 65536
_BUFFER_LIMIT = 1 << 20
_CONNECT_TIMEOUT = 2.0
_APPLY_TIMEOUT = 5.0


def _hard_close(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), not an orderly FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def _nonblocking(sock: socket.socket) -> socket.socket:
    """``sock``, made non-blocking and without Nagle's delay."""
    sock.setblocking(False)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class _Side:
    """One end of a proxied connection and the bytes waiting to be written to it."""

    def __init__(self, sock: socket.socket | None) -> None:
        self.sock = sock
        self.out = bytearray()  # ready to be written to this side
        self.delayed: collections.deque[tuple[float, bytes]] = collections.deque()

    def pending(self) -> int:
        return len(self.out) + sum(len(data) for _, data in self.delayed)


class _Pipe:
    """A client connection and its upstream connection."""

    def __init__(self, client: socket.socket, upstream: socket.socket | None) -> None:
        self.client = _Side(client)
        self.upstream = _Side(upstream)

    def other(self, side: _Side) -> _Side:
        return self.upstream if side is self.client else self.client


class TcpProxy:
    """A TCP proxy on ``127.0.0.1`` in front of ``target_host:target_port``.

    :param target_port: the server's port.
    :param target_host: the server's address (default ``127.0.0.1``).
    :param port: the port to listen on; default a free one (known after :meth:`start`).
    """

    def __init__(self, target_port: int, target_host: str = HOST, *, port: int = 0) -> None:
        self.target = (target_host, target_port)
        self._port = port
        self._mode = "pass"
        self._delay = 0.0
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._selector: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._pipes: dict[socket.socket, tuple[_Pipe, _Side]] = {}
        self._guard = threading.Lock()
        self._applied = threading.Condition(self._guard)
        self._requested = 0  # generation of the last mode change asked for
        self._done = 0  # generation the loop has applied
        self._stopping = False
        self.accepted = 0
        """Connections accepted so far (any mode)."""

    # -- public face -----------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the proxy listens on (after :meth:`start`)."""
        if self._listener is None:
            raise RuntimeError("the proxy is not started")
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        return HOST, self.port

    def url(self, db: int = 0) -> str:
        """``redis://127.0.0.1:PORT/db`` of the proxy."""
        return f"redis://{HOST}:{self.port}/{db}"

    @property
    def mode(self) -> str:
        """``"pass"``, ``"delay"``, ``"blackhole"`` or ``"reset"``."""
        return self._mode

    @property
    def delay_s(self) -> float:
        """The delay of ``delay`` mode, in seconds (0 in the other modes)."""
        return self._delay

    @property
    def connections(self) -> int:
        """Connections open right now."""
        with self._guard:
            return len(self._open_pipes())

    def start(self) -> TcpProxy:
        """Listen and start the loop thread. Returns ``self``."""
        if self._thread is not None:
            raise RuntimeError("the proxy was already started")
        listener = socket.create_server((HOST, self._port), backlog=128)  # SO_REUSEADDR
        listener.setblocking(False)
        self._listener = listener
        self._port = int(listener.getsockname()[1])
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(
            target=self._run, name=f"tcp-proxy-{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close every connection and the listening socket; join the thread. Idempotent."""
        thread = self._thread
        if thread is None or self._stopping:
            return
        with self._guard:
            self._stopping = True
        self._wake()
        thread.join(_APPLY_TIMEOUT)

    def pass_through(self) -> None:
        """Forward both ways, at once."""
        self._set("pass", 0.0)

    def delay(self, seconds: float) -> None:
        """Forward every chunk ``seconds`` after it was read."""
        if not seconds >= 0:
            raise ValueError(f"delay must be >= 0 seconds, not {seconds!r}")
        self._set("delay", float(seconds))

    def blackhole(self) -> None:
        """Accept, read and drop: never forward, never answer."""
        self._set("blackhole", 0.0)

    def reset(self) -> None:
        """Reset every connection, and every new one until another mode is set."""
        self._set("reset", 0.0)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = f"127.0.0.1:{self.port}" if self._listener is not None else "not started"
        return f"<TcpProxy {where} -> {self.target[0]}:{self.target[1]} mode={self._mode}>"

    # -- mode changes ------------------------------------------------------------------

    def _set(self, mode: str, delay: float) -> None:
        if self._thread is None or self._stopping:
            raise RuntimeError("the proxy is not running")
        with self._guard:
            self._mode = mode
            self._delay = delay
            self._requested += 1
            generation = self._requested
        self._wake()
        with self._applied:
            applied = self._applied.wait_for(
                lambda: self._done >= generation or self._stopping, _APPLY_TIMEOUT
            )
        if not applied:
            raise RuntimeError(f"the proxy did not apply mode {mode!r} in time")

    def _open_pipes(self) -> list[_Pipe]:
        """Every open connection, once (its pipe is listed under each of its sockets)."""
        return list({id(pipe): pipe for pipe, _ in self._pipes.values()}.values())

    def _wake(self) -> None:
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")

    # -- the loop (its own thread) -----------------------------------------------------

    def _run(self) -> None:
        selector = self._selector
        assert selector is not None
        try:
            while not self._stopping:
                self._apply()
                timeout = self._next_due()
                for key, events in selector.select(timeout):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._listener:
                        self._accept()
                    elif sock is self._wake_r:
                        with contextlib.suppress(OSError):
                            sock.recv(4096)
                    else:
                        self._serve(sock, events)
                self._release_due()
        finally:
            self._shutdown()

    def _apply(self) -> None:
        with self._guard:
            generation = self._requested
            if generation == self._done:
                return
            mode = self._mode
        if mode == "reset":
            for pipe in self._open_pipes():
                self._close_pipe(pipe, hard=True)
        elif mode == "blackhole":
            for pipe in self._open_pipes():
                for side in (pipe.client, pipe.upstream):
                    side.out.clear()
                    side.delayed.clear()
        for sock in list(self._pipes):
            self._update(sock)
        with self._applied:
            self._done = generation
            self._applied.notify_all()

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # none left to accept (BlockingIOError), or a failure
                return
            self.accepted += 1
            if self._mode == "reset":
                _hard_close(client)
                continue
            upstream = None
            if self._mode != "blackhole":
                upstream = self._connect_upstream()
                if upstream is None:
                    _hard_close(client)
                    continue
            pipe = _Pipe(_nonblocking(client), upstream)
            self._add(pipe, pipe.client)
            if upstream is not None:
                self._add(pipe, pipe.upstream)

    def _connect_upstream(self) -> socket.socket | None:
        try:
            return _nonblocking(socket.create_connection(self.target, timeout=_CONNECT_TIMEOUT))
        except OSError:
            return None

    def _add(self, pipe: _Pipe, side: _Side) -> None:
        assert side.sock is not None and self._selector is not None
        with self._guard:
            self._pipes[side.sock] = (pipe, side)
        self._update(side.sock)

    def _update(self, sock: socket.socket) -> None:
        """Register ``sock`` for what it should wait for now (nothing: unregistered)."""
        entry = self._pipes.get(sock)
        if entry is None or self._selector is None:
            return
        pipe, side = entry
        events = 0
        if self._mode == "blackhole" or pipe.other(side).pending() < _BUFFER_LIMIT:
            events |= selectors.EVENT_READ
        if side.out:
            events |= selectors.EVENT_WRITE
        registered = self._selector.get_map().get(sock)
        current = 0 if registered is None else registered.events
        if events == current:
            return
        if not events:
            self._selector.unregister(sock)
        elif current:
            self._selector.modify(sock, events)
        else:
            self._selector.register(sock, events)

    def _serve(self, sock: socket.socket, events: int) -> None:
        entry = self._pipes.get(sock)
        if entry is None:
            return
        pipe, side = entry
        if events & selectors.EVENT_WRITE and side.out:
            try:
                sent = sock.send(side.out)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._close_pipe(pipe, hard=True)
                return
            del side.out[:sent]
            other = pipe.other(side)
            if other.sock is not None:
                self._update(other.sock)  # it may read again now
        if events & selectors.EVENT_READ:
            try:
                data = sock.recv(_CHUNK)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                self._close_pipe(pipe, hard=True)
                return
            if data == b"":
                self._close_pipe(pipe, hard=False)
                return
            if data:
                self._forward(pipe, pipe.other(side), data)
        if sock in self._pipes:
            self._update(sock)

    def _forward(self, pipe: _Pipe, to: _Side, data: bytes) -> None:
        mode = self._mode
        if mode in ("blackhole", "reset"):
            return
        if to.sock is None:  # the upstream of a connection accepted in a blackhole
            upstream = self._connect_upstream()
            if upstream is None:
                self._close_pipe(pipe, hard=True)
                return
            to.sock = upstream
            self._add(pipe, to)
        if mode == "delay" or to.delayed:
            due = time.monotonic() + self._delay
            if to.delayed:
                due = max(due, to.delayed[-1][0])  # never overtake an earlier chunk
            to.delayed.append((due, data))
        else:
            to.out += data
            self._update(to.sock)

    def _next_due(self) -> float | None:
        """Seconds until the first delayed chunk is due (None: nothing is delayed)."""
        dues = [side.delayed[0][0] for _, side in self._pipes.values() if side.delayed]
        if not dues:
            return None
        return max(0.0, min(dues) - time.monotonic())

    def _release_due(self) -> None:
        now = time.monotonic()
        for sock, (_, side) in list(self._pipes.items()):
            moved = False
            while side.delayed and side.delayed[0][0] <= now:
                side.out += side.delayed.popleft()[1]
                moved = True
            if moved:
                self._update(sock)

    def _close_pipe(self, pipe: _Pipe, hard: bool) -> None:
        for side in (pipe.client, pipe.upstream):
            sock = side.sock
            if sock is None:
                continue
            with self._guard:
                self._pipes.pop(sock, None)
            if self._selector is not None:
                with contextlib.suppress(KeyError, ValueError):  # not registered
                    self._selector.unregister(sock)
            if hard:
                _hard_close(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.close()
            side.sock = None

    def _shutdown(self) -> None:
        for pipe in self._open_pipes():
            self._close_pipe(pipe, hard=False)
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
        if self._selector is not None:
            self._selector.close()
        with self._applied:
            self._stopping = True
            self._applied.notify_all()
