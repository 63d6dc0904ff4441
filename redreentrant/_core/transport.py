"""What the sync and asyncio transports share (no I/O): their tables, and what they
are built from.

A transport carries out the steps of the fan-out rounds
(:class:`~.fanout.FanoutProtocol`). :class:`FanoutTransport` builds what both flavours
keep the same way: the protocol, the pool each endpoint's connections come from
(:class:`Pools`), and the client library's error classes; a flavour names its own
pieces as class attributes (its node clients, its wire connections, redis-py's or
``redis.asyncio``'s classes) and adds the I/O: connecting, sending, reading until a
deadline, closing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar

from .cluster import Address, Endpoints
from .fanout import NOT_SENT, FanoutProtocol
from .masters import master_name, with_valkey
from .packing import wire_packer


def packing(conn: Any) -> tuple[object, Callable[[list[tuple[object, ...]]], Any]]:
    """How ``conn`` packs commands: what the bytes depend on (its class and encoding),
    and the packer (hiredis's directly where it can be: the client's own packing, in
    Python or around hiredis, costs more than the packing)."""
    enc = conn.encoder
    how = (type(conn), enc.encoding, enc.encoding_errors)
    return how, wire_packer(enc.encoding, enc.encoding_errors) or conn.pack_commands


def send_failed(
    failures: list[object] | None, count: int, k: int, error: BaseException
) -> list[object]:
    """A transport's record of its ``count`` sends (see :data:`~.fanout.SEND`) once
    send ``k`` failed with ``error``: an interruption leaves the rest not sent."""
    failures = failures or [None] * count
    failures[k] = error
    if not isinstance(error, Exception):
        failures[k + 1 :] = [NOT_SENT] * (count - k - 1)
    return failures


class FanoutTransport:
    """The tables of a transport running script calls on N members at once: clients,
    or Redis Clusters whose nodes' clients come from ``nodes`` (by default a flavour's
    ``node_clients(members, timeout)``). ``wired``: the members whose rounds may run
    on wire connections (a flavour's ``wire_pool``, which may decline) rather than on
    their clients' own: the clients made from URLs."""

    #: the flavour's pieces: its class of node clients (made with the members and the
    #: master timeout), and its ``wire_pool(client, name)`` (a staticmethod)
    node_clients: ClassVar[Any]
    wire_pool: ClassVar[Any]
    #: the client library's time-out and error-reply classes (valkey-py's twins are
    #: added when it is loaded)
    timeout_error: ClassVar[type[Exception]]
    reply_error: ClassVar[type[Exception]]
    #: a lock for tables that several threads may grow at once
    guard: ClassVar[Callable[[], AbstractContextManager[object]]] = nullcontext

    def __init__(
        self,
        members: Sequence[Any],
        timeout: float,
        probe_interval: float = 1.0,
        nodes: Any = None,
        wired: Collection[int] = (),
    ) -> None:
        cls = type(self)
        self.timeout = timeout
        self.protocol = FanoutProtocol(
            members, timeout, probe_interval, packing, cls.timeout_error, cls.guard
        )
        nodes = nodes or cls.node_clients(members, timeout)
        self.pools = Pools(
            self.protocol.ends,
            wired,
            cls.wire_pool,
            lambda i, node: nodes.client(i, node).connection_pool,
            cls.guard,
        )
        self.timeouts = with_valkey(cls.timeout_error, "valkey.exceptions", "TimeoutError")
        self.error_replies = with_valkey(cls.reply_error, "valkey.exceptions", "ResponseError")


class Pools:
    """Per endpoint of a transport (see :class:`~.cluster.Endpoints`), the pool its
    rounds' connections come from and go back to: wire connections (``wire_pool``,
    which may decline) for the ``wired`` members, else the client's own pool; a
    cluster member has none of its own, and its nodes' pools (``node_pool(member,
    node)``) are added as they are first connected to."""

    def __init__(
        self,
        ends: Endpoints,
        wired: Collection[int],
        wire_pool: Callable[[Any, str], Any],
        node_pool: Callable[[int, Address], Any],
        guard: Callable[[], AbstractContextManager[object]] = nullcontext,
    ) -> None:
        self._ends = ends
        self._node_pool = node_pool
        self._guard = guard()
        self._pools: list[Any] = []
        for i, member in enumerate(ends.members):
            pool = None
            if ends.cluster(i) is None:
                mine = wire_pool(member, master_name(member)) if i in wired else None
                pool = mine or member.connection_pool  # type: ignore[attr-defined]
            self._pools.append(pool)
        self._getters = [None if p is None else connection_getter(p) for p in self._pools]

    def pool(self, i: int) -> Any:
        if i >= len(self._pools):
            self._grow(i)
        return self._pools[i]

    def getter(self, i: int) -> Callable[[], Any]:
        """What makes a new connection of endpoint ``i``."""
        if i >= len(self._getters):
            self._grow(i)
        getter = self._getters[i]
        assert getter is not None, "a cluster member is reached through its nodes"
        return getter

    def _grow(self, i: int) -> None:
        with self._guard:
            while len(self._getters) <= i:
                member, node = self._ends.table[len(self._getters)]
                assert node is not None
                pool = self._node_pool(member, node)
                self._pools.append(pool)
                self._getters.append(connection_getter(pool))  # last: in use once there


def connection_getter(pool: Any) -> Callable[[], Any]:
    """``pool.get_connection`` across redis-py versions (5.0 needs a command name,
    later versions warn when given one)."""
    params = inspect.signature(pool.get_connection).parameters
    first = next(iter(params.values()), None)
    if first is not None and first.default is inspect.Parameter.empty:
        return lambda: pool.get_connection("EVALSHA")
    return pool.get_connection  # type: ignore[no-any-return]
