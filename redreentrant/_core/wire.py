"""What the transports' wire connections carry out (``_sync/wire.py``,
``_async/wire.py``): which clients' options they stand in for, and the commands that
set up a new connection. No I/O here.

A wire connection stands in for a redis-py connection only for a master the manager
made itself from a plain ``redis://`` URL: host and port, and optionally a database, a
user name and a password; nothing else (no TLS, no unix socket, no RESP3, no other
option), so that it does exactly what the client's own connection would.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: the options a wire connection carries out
HANDLED = frozenset(
    {"host", "port", "db", "username", "password", "socket_timeout", "socket_connect_timeout"}
)
#: options it may leave aside, with the one value each may have: what they ask for is
#: what it does anyway (protocol 2, no handshake)
IGNORED: dict[str, object] = {
    "protocol": 2,
    "driver_info": None,
    "lib_name": None,
    "lib_version": None,
}
#: redis-py's own machinery, which asks nothing of the connection
INTERNAL = frozenset({"himport_registry"})


@dataclass(frozen=True)
class WireOptions:
    """Where and how a wire connection connects."""

    host: str
    port: int
    db: int = 0
    username: str | None = None
    password: str | None = None
    #: seconds for connecting (and the handshake); None: no limit
    connect_timeout: float | None = None
    #: seconds a send or a read may block; None: no limit
    socket_timeout: float | None = None

    def handshake(self) -> list[tuple[object, ...]]:
        """The commands a new connection sends first (``AUTH``, ``SELECT``), each
        answered ``OK``."""
        commands: list[tuple[object, ...]] = []
        if self.password is not None:
            user = () if self.username is None else (self.username,)
            commands.append(("AUTH", *user, self.password))
        if self.db:
            commands.append(("SELECT", self.db))
        return commands


def wire_options(kwargs: Mapping[str, object]) -> WireOptions | None:
    """The options of a connection made with redis-py's ``kwargs``, or None when a
    wire connection cannot stand in for it."""
    for key, value in kwargs.items():
        if key in HANDLED or key in INTERNAL:
            continue
        if key not in IGNORED or value != IGNORED[key]:
            return None
    host, port = kwargs.get("host"), kwargs.get("port")
    if not isinstance(host, str) or not isinstance(port, (int, str)):
        return None

    def seconds(key: str) -> float | None:
        value = kwargs.get(key)
        return None if value is None else float(value)  # type: ignore[arg-type]

    username, password = kwargs.get("username"), kwargs.get("password")
    return WireOptions(
        host,
        int(port),
        int(kwargs.get("db") or 0),  # type: ignore[call-overload]
        None if username is None else str(username),
        None if password is None else str(password),
        seconds("socket_connect_timeout"),
        seconds("socket_timeout"),
    )


class Replies:
    """The replies of one wire connection, parsed with hiredis as its bytes come, in
    order; error replies made into redis-py's exception classes (``reply_error``),
    and raised, when taken, as redis-py's parser raises them."""

    def __init__(
        self,
        encoding: str | None,
        errors: str,
        reply_error: Callable[[str], Exception],
        protocol_error: type[Exception],
        connection_error: type[Exception],
    ) -> None:
        import hiredis  # wire connections are made only where it is installed

        options: dict[str, Any] = {"protocolError": protocol_error, "replyError": reply_error}
        if encoding is not None:
            options.update(encoding=encoding, errors=errors)
        self._reader: Any = hiredis.Reader(**options)
        self._connection_error = connection_error
        self.queue: collections.deque[object] = collections.deque()

    def feed(self, data: bytes | bytearray, length: int | None = None) -> None:
        """Parse ``data`` (its first ``length`` bytes); raises ``protocol_error`` when
        they break the protocol."""
        reader = self._reader
        if length is None:
            reader.feed(data)
        else:
            reader.feed(data, 0, length)
        reply = reader.gets()
        while reply is not False:
            self.queue.append(reply)
            reply = reader.gets()

    def take(self) -> object:
        """The next reply (there is one): error replies are raised, and so is one that
        redis-py maps to a connection error (a wrong password), also at the head of
        an array."""
        reply = self.queue.popleft()
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, list) and reply and isinstance(reply[0], self._connection_error):
            raise reply[0]
        return reply
