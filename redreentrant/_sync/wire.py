"""Lean connections for the sync transport's rounds: a socket and a hiredis reader.

Why hand-written: a redis-py connection sends and reads each reply through several
layers of Python (health and host checks, the parser's buffer handling), and its socket
time-out makes every send and every read wait in a ``poll`` first. The transport's
rounds need far less of a connection: send packed commands, read the next reply (or
find one is there, without waiting), close. Here the socket blocks, with the time-out
set in the kernel where it can be (Linux: ``SO_RCVTIMEO``/``SO_SNDTIMEO``, so a read
is one system call), and hiredis parses the bytes.

Used only where nothing else is needed (see :func:`wire_pool` and
:mod:`redreentrant._core.wire`): a master the manager made itself from a plain
``redis://`` URL (host, port, and optionally db, user name and password), with hiredis
installed. Every other master, and everything besides the rounds (pub/sub, the
application's own commands), uses the client's own redis-py connections.
"""

from __future__ import annotations

import contextlib
import math
import select
import socket
import struct
import sys
from collections.abc import Iterable
from typing import Any

import redis
import redis.asyncio.connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core.packing import wire_packer
from .._core.wire import Replies, WireOptions, wire_options

#: redis-py's parser base, whose ``parse_error`` maps error replies to redis-py's
#: exception classes (NoScriptError, ReadOnlyError, ...): both kinds of connection
#: raise alike. Taken from ``redis.asyncio.connection``, whose public name it is from
#: redis-py 5.0 on (``redis.connection`` has it only in later releases).
_BASE_PARSER: Any = redis.asyncio.connection.BaseParser  # type: ignore[attr-defined]

#: the kernel bounds a blocking socket's sends and reads (struct timeval of two longs)
KERNEL_TIMEOUTS = sys.platform == "linux"

_BUFFER = 65536


def _parse_error(text: str) -> ResponseError:
    error: ResponseError = _BASE_PARSER.parse_error(text)
    return error


class WireConnection:
    """One connection to a master, with the part of a redis-py connection's interface
    the transport uses (sends, ``read_response``, ``can_read``, ``encoder``,
    ``socket_timeout``, ``disconnect``). Used by one thread at a time."""

    def __init__(self, sock: socket.socket, options: WireOptions, encoder: Any, name: str):
        self._sock: socket.socket | None = sock
        self.encoder = encoder
        self.socket_timeout = options.socket_timeout
        self._name = name
        self._pack = wire_packer(encoder.encoding, encoder.encoding_errors)
        self._replies = Replies(
            encoder.encoding if encoder.decode_responses else None,
            encoder.encoding_errors,
            _parse_error,
            InvalidResponse,
            RedisConnectionError,
        )
        self._buffer = bytearray(_BUFFER)

    def pack_command(self, *args: object) -> list[bytes]:
        return self.pack_commands([args])

    def pack_commands(self, commands: Iterable[tuple[object, ...]]) -> list[bytes]:
        assert self._pack is not None  # wire_pool checked it
        return self._pack(list(commands))

    def send_packed_command(self, command: list[bytes], check_health: bool = False) -> None:
        sock = self._sock  # self._socket(), without a call on the hot path
        if sock is None:
            raise RedisConnectionError(f"{self._name}: connection closed")
        try:
            for part in command:
                sock.sendall(part)
        except (BlockingIOError, TimeoutError):
            self.disconnect()
            raise RedisTimeoutError(f"{self._name}: timed out writing to the socket") from None
        except OSError as error:
            self.disconnect()
            raise RedisConnectionError(f"{self._name}: {error}") from error

    def send_command(self, *args: object, check_health: bool = False) -> None:
        self.send_packed_command(self.pack_commands([args]))

    def _socket(self) -> socket.socket:
        if self._sock is None:
            raise RedisConnectionError(f"{self._name}: connection closed")
        return self._sock

    def _fill(self) -> None:
        """Read once from the socket (blocking, within the socket's time-out) and
        parse what came."""
        sock = self._sock  # self._socket(), without a call on the hot path
        if sock is None:
            raise RedisConnectionError(f"{self._name}: connection closed")
        try:
            n = sock.recv_into(self._buffer)
        except (BlockingIOError, TimeoutError):
            # Nothing consumed: the reply is still owed, the connection stays usable.
            raise RedisTimeoutError(f"{self._name}: no reply in time") from None
        except OSError as error:
            self.disconnect()
            raise RedisConnectionError(f"{self._name}: {error}") from error
        if not n:
            self.disconnect()
            raise RedisConnectionError(f"{self._name}: connection closed by the server")
        try:
            self._replies.feed(self._buffer, n)
        except InvalidResponse:
            self.disconnect()
            raise

    def read_response(self, disable_decoding: bool = False, **_: object) -> Any:
        """The next reply (an error reply raised as redis-py raises it); blocks within
        the socket's time-out (``redis.TimeoutError``: the reply is still owed)."""
        while not self._replies.queue:
            self._fill()
        return self._replies.take()

    def can_read(self, timeout: float | None = 0) -> bool:
        """Whether a reply, or part of one, has come (waiting up to ``timeout``)."""
        if self._replies.queue:
            return True
        if not _readable(self._socket(), timeout):
            return False
        self._fill()
        return True

    def fileno(self) -> int:
        """The socket's descriptor (-1 once closed)."""
        return -1 if self._sock is None else self._sock.fileno()

    def disconnect(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()


def _readable(sock: socket.socket, timeout: float | None) -> bool:
    """Whether ``sock`` has bytes to read within ``timeout`` seconds (None: no
    limit). ``poll`` where there is one: ``select`` refuses descriptors above 1023."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(None if timeout is None else max(0, math.ceil(timeout * 1000))))
    ready, _, _ = select.select([sock], [], [], timeout)
    return bool(ready)


def _set_timeouts(sock: socket.socket, seconds: float | None) -> None:
    if seconds is not None and KERNEL_TIMEOUTS:
        sock.settimeout(None)  # blocking: no poll before each call
        whole = int(seconds)
        # A zero timeval would mean no time-out at all: at least a microsecond.
        micros = max(int((seconds - whole) * 1_000_000), 0 if whole else 1)
        timeval = struct.pack("@ll", whole, micros)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
    else:
        sock.settimeout(seconds)


class WirePool:
    """Makes a master's wire connections (the transport keeps them: ``release`` closes
    one)."""

    def __init__(self, options: WireOptions, encoder: Any, name: str) -> None:
        self._options = options
        self._encoder = encoder
        self._name = name

    def get_connection(self) -> WireConnection:
        """A new connection, authenticated and on its database."""
        options = self._options
        try:
            sock = socket.create_connection(
                (options.host, options.port), timeout=options.connect_timeout
            )
        except (BlockingIOError, TimeoutError):
            raise RedisTimeoutError(f"{self._name}: timed out connecting") from None
        except OSError as error:
            raise RedisConnectionError(f"{self._name}: {error}") from error
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            handshake = options.handshake()
            # The handshake within the connect time-out, then the socket's own.
            _set_timeouts(sock, options.connect_timeout if handshake else options.socket_timeout)
        except OSError as error:
            sock.close()
            raise RedisConnectionError(f"{self._name}: {error}") from error
        conn = WireConnection(sock, options, self._encoder, self._name)
        if handshake:
            try:
                conn.send_packed_command(conn.pack_commands(handshake))
                for _ in handshake:
                    conn.read_response()
                _set_timeouts(sock, options.socket_timeout)
            except BaseException:
                conn.disconnect()
                raise
        return conn

    def release(self, connection: WireConnection) -> None:
        connection.disconnect()


def wire_pool(client: object, name: str) -> WirePool | None:
    """Wire connections for ``client``'s master, or None where its own connections
    must serve (see the module docstring): not a plain TCP ``redis.Redis`` client, an
    option a wire connection does not carry out, an encoding hiredis does not pack, or
    no hiredis."""
    if type(client) is not redis.Redis:
        return None
    pool: Any = client.connection_pool
    if pool.connection_class is not redis.Connection:
        return None
    options = wire_options(pool.connection_kwargs)
    if options is None:
        return None
    encoder = pool.get_encoder()
    if wire_packer(encoder.encoding, encoder.encoding_errors) is None:
        return None
    return WirePool(options, encoder, name)
