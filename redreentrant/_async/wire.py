"""Lean connections for the asyncio transport's rounds, on an asyncio protocol.

Why hand-written: a ``redis.asyncio`` connection reads each reply through a
``StreamReader`` and five coroutine layers, and sends through ``drain``; measured on one
and on five masters, that costs the asyncio client about as much CPU per round as
everything else in an acquire, and on five masters it made the asyncio flavour a sixth
slower than the sync one. The transport's rounds need far less of a connection: send
packed commands, read the next reply (bounded by a time-out, or cancelled without
consuming anything), close. Here the protocol parses replies with hiredis as they come
(``data_received``), and a read waits on one future only when no reply is there yet.

Used only where nothing else is needed (see :func:`wire_pool` and
:mod:`redreentrant._core.wire`): a master the manager made itself from a plain
``redis://`` URL (host, port, and optionally db, user name and password), with hiredis
installed. Every other master, and everything besides the
rounds (pub/sub, the application's own commands), uses the client's own
``redis.asyncio`` connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterable
from typing import Any

import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core.packing import wire_packer
from .._core.wire import Replies, WireOptions, wire_options

_NOTHING = object()


#: redis-py's parser base, whose ``parse_error`` maps error replies to redis-py's
#: exception classes (NoScriptError, ReadOnlyError, ...): both kinds of connection
#: raise alike (a public name of that module since redis-py 5.0, not re-exported)
_BASE_PARSER: Any = redis.asyncio.connection.BaseParser  # type: ignore[attr-defined]


def _parse_error(text: str) -> ResponseError:
    error: ResponseError = _BASE_PARSER.parse_error(text)
    return error


class _Protocol(asyncio.Protocol):
    """Parses replies as they come; wakes the read waiting for one."""

    def __init__(self, encoding: str | None, errors: str) -> None:
        self.replies = Replies(
            encoding, errors, _parse_error, InvalidResponse, RedisConnectionError
        )
        self.transport: asyncio.Transport | None = None
        #: why the connection is unusable (closed, broken, lost), once it is
        self.broken: Exception | None = None
        self._waiter: asyncio.Future[object] | None = None
        #: the transport's buffer is above its high-water mark: sends wait
        self.paused = False
        self._resumed: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.replies.feed(data)
        except InvalidResponse as error:
            self._fail(error)
            return
        if self.replies.queue:  # a whole reply: not the first part of one
            self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RedisConnectionError(f"connection lost: {exc or 'closed by the server'}"))

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        resumed, self._resumed = self._resumed, None
        if resumed is not None and not resumed.done():
            resumed.set_result(None)

    def _fail(self, error: Exception) -> None:
        if self.broken is None:
            self.broken = error
        if self.transport is not None:
            self.transport.abort()
        self._wake()
        self.resume_writing()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait_reply(self, timeout: float | None) -> bool:
        """Wait until a reply (or the end of the connection) is there: False when
        ``timeout`` seconds passed first. A cancelled wait consumes nothing."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        return waiter.result() is None

    async def writable(self) -> None:
        """Wait while the transport's buffer is above its high-water mark."""
        while self.paused and self.broken is None:
            loop = asyncio.get_running_loop()
            self._resumed = loop.create_future()
            await self._resumed


def _expire(waiter: asyncio.Future[object]) -> None:
    if not waiter.done():
        waiter.set_result(_NOTHING)


class WireConnection:
    """One connection to a master, with the part of a ``redis.asyncio`` connection's
    interface the transport uses (sends, reads, ``encoder``, ``disconnect``)."""

    def __init__(self, protocol: _Protocol, encoder: Any, name: str) -> None:
        self._protocol = protocol
        self.encoder = encoder
        self._name = name
        self.socket_timeout = None
        self._pack = wire_packer(encoder.encoding, encoder.encoding_errors)

    def pack_commands(self, commands: Iterable[tuple[object, ...]]) -> list[bytes]:
        assert self._pack is not None  # wire_pool checked it
        return self._pack(list(commands))

    async def send_packed_command(self, command: list[bytes], check_health: bool = False) -> None:
        protocol = self._protocol
        transport = protocol.transport
        if protocol.broken is not None or transport is None or transport.is_closing():
            raise RedisConnectionError(f"{self._name}: {protocol.broken or 'connection closed'}")
        transport.writelines(command)
        if protocol.paused:
            await protocol.writable()

    async def send_command(self, *args: object, check_health: bool = False) -> None:
        await self.send_packed_command(self.pack_commands([args]))

    async def read_response(
        self,
        disable_decoding: bool = False,
        timeout: float | None = None,
        *,
        disconnect_on_error: bool = True,
    ) -> Any:
        """The next reply (an error reply raised as redis-py raises it); None when
        ``timeout`` (seconds; ``None`` or ``math.inf``: no limit) passed first, as
        ``redis.asyncio`` does, the reply still owed. A cancelled read consumes
        nothing."""
        protocol = self._protocol
        replies = protocol.replies
        if not replies.queue:
            if protocol.broken is None:
                limit = None if timeout is None or timeout == math.inf else timeout
                if not await protocol.wait_reply(limit):
                    return None
            if not replies.queue:
                assert protocol.broken is not None
                if disconnect_on_error:
                    self.close()
                raise RedisConnectionError(f"{self._name}: {protocol.broken}")
        return replies.take()

    def close(self) -> None:
        protocol = self._protocol
        if protocol.broken is None:
            protocol.broken = RedisConnectionError("connection closed")
        if protocol.transport is not None:
            # A loop closed already has closed the socket with it.
            with contextlib.suppress(RuntimeError):
                protocol.transport.close()

    async def disconnect(self, nowait: bool = False) -> None:
        self.close()


class WirePool:
    """Makes a master's wire connections (the transport keeps them: ``release`` closes
    one)."""

    def __init__(self, options: WireOptions, encoder: Any, name: str) -> None:
        self._options = options
        self._encoder = encoder
        self._name = name

    async def get_connection(self) -> WireConnection:
        """A new connection, authenticated and on its database."""
        loop = asyncio.get_running_loop()
        encoder = self._encoder
        encoding = encoder.encoding if encoder.decode_responses else None

        def protocol() -> _Protocol:
            return _Protocol(encoding, encoder.encoding_errors)

        options = self._options
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(protocol, options.host, options.port),
                options.connect_timeout,
            )
        except (asyncio.TimeoutError, TimeoutError):
            raise RedisTimeoutError(f"{self._name}: timed out connecting") from None
        except OSError as error:
            raise RedisConnectionError(f"{self._name}: {error}") from error
        conn = WireConnection(proto, encoder, self._name)
        handshake = options.handshake()
        if handshake:
            try:
                await conn.send_packed_command(conn.pack_commands(handshake))
                for _ in handshake:
                    reply = await conn.read_response(timeout=options.connect_timeout)
                    if reply is None:
                        raise RedisTimeoutError(f"{self._name}: no answer to the handshake")
            except BaseException:
                conn.close()
                raise
        return conn

    async def release(self, connection: WireConnection) -> None:
        connection.close()


def wire_pool(client: object, name: str) -> WirePool | None:
    """Wire connections for ``client``'s master, or None where its own connections
    must serve (see the module docstring): not a plain TCP ``redis.asyncio`` client,
    an option a wire connection does not carry out, an encoding hiredis does not pack,
    or no hiredis."""
    if type(client) is not redis.asyncio.Redis:
        return None
    pool: Any = client.connection_pool
    if pool.connection_class is not redis.asyncio.Connection:
        return None
    options = wire_options(pool.connection_kwargs)
    # No socket time-out: the transport bounds the reads of a round itself.
    if options is None or options.socket_timeout is not None:
        return None
    encoder = pool.get_encoder()
    if wire_packer(encoder.encoding, encoder.encoding_errors) is None:
        return None
    return WirePool(options, encoder, name)
