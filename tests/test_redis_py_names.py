"""What the wire connections (redreentrant._sync.wire, redreentrant._async.wire,
redreentrant._core.wire) take from redis-py beyond its documented API, pinned: a
redis-py release that moves or changes any of it fails here, naming its version and
the name, rather than somewhere in a round. No server, no hiredis: the compatibility
matrix runs this with every redis-py it tests (.ci/matrix)."""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.connection
import redis.exceptions

from redreentrant._async import wire as async_wire
from redreentrant._async.manager import url_client as async_url_client
from redreentrant._core.cluster import Redirect, redirect_of
from redreentrant._core.wire import HANDLED, IGNORED, INTERNAL, wire_options
from redreentrant._sync import wire as sync_wire
from redreentrant._sync.manager import url_client as sync_url_client

URL = "redis://127.0.0.1:1/0"  # nothing is connected to: clients connect lazily


def pinned(condition: object, name: str, what: str) -> None:
    """Fail, naming the redis-py release and the name, unless ``condition``."""
    if not condition:
        pytest.fail(f"redis-py {redis.__version__}: {name} {what}", pytrace=False)


# -- the parser base: error replies into redis-py's exception classes ---------------------

#: error replies, and the class redis-py's own connections raise for each, by name (the
#: transports tell NOSCRIPT by the class's name, a failed handshake by a ConnectionError)
ERRORS = {
    "NOSCRIPT No matching script. Please use EVAL.": "NoScriptError",
    "READONLY You can't write against a read only replica.": "ReadOnlyError",
    "WRONGPASS invalid username-password pair or user is disabled.": "AuthenticationError",
    "NOAUTH Authentication required.": "AuthenticationError",
    "ERR max number of clients reached": "ConnectionError",
    "LOADING Redis is loading the dataset in memory": "BusyLoadingError",
    "WRONGTYPE Operation against a key holding the wrong kind of value": "ResponseError",
}
#: redirects (a plain master that turns out to be a cluster node): a MovedError or
#: AskError in some releases, a plain ResponseError in others; read alike either way
REDIRECTS = {
    "MOVED 3999 127.0.0.1:6381": Redirect(False, 3999, ("127.0.0.1", 6381)),
    "ASK 3999 127.0.0.1:6381": Redirect(True, 3999, ("127.0.0.1", 6381)),
}


def test_the_parser_base_is_where_the_wire_connections_take_it() -> None:
    name = "redis.asyncio.connection.BaseParser"
    base = getattr(redis.asyncio.connection, "BaseParser", None)
    pinned(inspect.isclass(base), name, "is gone (both wire modules take it from there)")
    # The wire modules hold the very class, and call its parse_error on the class.
    for module in (sync_wire, async_wire):
        pinned(module._BASE_PARSER is base, name, f"is not what {module.__name__} holds")
    parse_error = getattr(base, "parse_error", None)
    pinned(callable(parse_error), f"{name}.parse_error", "is gone")
    pinned(
        list(inspect.signature(parse_error).parameters) == ["response"],
        f"{name}.parse_error",
        f"no longer takes the reply's text alone: {inspect.signature(parse_error)}",
    )


@pytest.mark.parametrize("reply", list(ERRORS))
def test_the_parser_base_maps_error_replies_to_redis_pys_exception_classes(reply: str) -> None:
    expected = ERRORS[reply]
    for parse in (sync_wire._parse_error, async_wire._parse_error):
        error = parse(reply)
        pinned(
            type(error).__name__ == expected and isinstance(error, redis.exceptions.RedisError),
            "redis.asyncio.connection.BaseParser.parse_error",
            f"makes {reply.split()[0]!r} a {type(error).__name__}, not a {expected}",
        )
        if expected in ("AuthenticationError", "ConnectionError"):
            pinned(
                isinstance(error, redis.exceptions.ConnectionError),
                "redis.exceptions." + expected,
                "is no longer a ConnectionError: a failed handshake is told by that",
            )


@pytest.mark.parametrize("reply", list(REDIRECTS))
def test_the_parser_base_makes_redirects_errors_the_cluster_routing_reads(reply: str) -> None:
    for parse in (sync_wire._parse_error, async_wire._parse_error):
        error = parse(reply)
        pinned(
            redirect_of(error, ("127.0.0.1", 7000)) == REDIRECTS[reply],
            "redis.asyncio.connection.BaseParser.parse_error",
            f"makes {reply!r} a {type(error).__name__} that reads as no redirect",
        )


# -- what a wire pool reads off a client's connection pool --------------------------------


Client = Callable[[str, float], Any]
CLIENTS: dict[str, tuple[Client, type, type]] = {
    "sync": (sync_url_client, redis.Redis, redis.Connection),
    "asyncio": (async_url_client, redis.asyncio.Redis, redis.asyncio.Connection),
}


@pytest.mark.parametrize("flavour", list(CLIENTS))
def test_a_url_clients_pool_has_the_connection_kwargs_a_wire_connection_stands_in_for(
    flavour: str,
) -> None:
    make, client_class, connection_class = CLIENTS[flavour]
    client = make(URL, 1.0)
    pinned(type(client) is client_class, client_class.__qualname__, "is not what from_url makes")
    pool = client.connection_pool
    pinned(
        getattr(pool, "connection_class", None) is connection_class,
        "ConnectionPool.connection_class",
        f"is not {connection_class.__module__}.{connection_class.__qualname__}",
    )
    kwargs = getattr(pool, "connection_kwargs", None)
    pinned(isinstance(kwargs, dict), "ConnectionPool.connection_kwargs", "is not a dict")
    # Every option the manager's own clients carry must be one a wire connection carries
    # out, leaves aside with its default value, or knows as redis-py's own machinery
    # (such as 'himport_registry'): an unknown one turns wire connections off, silently.
    unknown = sorted(set(kwargs) - HANDLED - set(IGNORED) - INTERNAL)
    pinned(not unknown, "ConnectionPool.connection_kwargs", f"has unknown keys {unknown}")
    pinned(
        wire_options(kwargs) is not None,
        "ConnectionPool.connection_kwargs",
        f"holds values a wire connection does not carry out: {kwargs}",
    )
    wired = (sync_wire if flavour == "sync" else async_wire).wire_pool(client, URL)
    # Without hiredis no client gets wire connections (the matrix's venvs): the rest
    # of what a wire pool reads is pinned all the same.
    encoder = pool.get_encoder()
    for attribute, expected in (
        ("encoding", "utf-8"),
        ("encoding_errors", "strict"),
        ("decode_responses", False),
    ):
        pinned(
            getattr(encoder, attribute, None) == expected,
            f"{type(encoder).__module__}.{type(encoder).__qualname__}.{attribute}",
            f"is not {expected!r} on a URL client's pool (get_encoder())",
        )
    # With hiredis (the main combination), all of it lines up: the client's rounds go
    # over wire connections.
    pinned(
        (wired is not None) == (importlib.util.find_spec("hiredis") is not None),
        f"{client_class.__qualname__} made from a URL",
        "gets no wire connections although hiredis is installed",
    )


# -- the connection interface a wire connection stands in for -----------------------------

#: per flavour: the methods the transports call on a round's connection (a wire one, or
#: the client's own), with the parameters they pass by name
INTERFACE = {
    "sync": {
        "pack_command": [],
        "pack_commands": ["commands"],
        "send_packed_command": ["command", "check_health"],
        "send_command": ["check_health"],
        "read_response": ["disable_decoding", "disconnect_on_error"],
        "can_read": ["timeout"],
        "disconnect": [],
    },
    "asyncio": {
        "pack_commands": ["commands"],
        "send_packed_command": ["command", "check_health"],
        "send_command": ["check_health"],
        "read_response": ["disable_decoding", "timeout", "disconnect_on_error"],
        "disconnect": ["nowait"],
    },
}


@pytest.mark.parametrize("flavour", list(INTERFACE))
def test_redis_pys_connections_have_the_methods_a_wire_connection_stands_in_for(
    flavour: str,
) -> None:
    _, _, connection_class = CLIENTS[flavour]
    wire_class = (sync_wire if flavour == "sync" else async_wire).WireConnection
    for method, parameters in INTERFACE[flavour].items():
        name = f"{connection_class.__module__}.{connection_class.__qualname__}.{method}"
        theirs = getattr(connection_class, method, None)
        pinned(callable(theirs), name, "is gone")
        pinned(callable(getattr(wire_class, method, None)), name, "has no wire twin")
        accepted = inspect.signature(theirs).parameters  # type: ignore[arg-type]
        passed_on = any(p.kind is p.VAR_KEYWORD for p in accepted.values())  # **kwargs
        for parameter in parameters:
            pinned(parameter in accepted or passed_on, name, f"takes no {parameter!r} any more")
            ours = inspect.signature(getattr(wire_class, method)).parameters
            takes = parameter in ours or any(p.kind is p.VAR_KEYWORD for p in ours.values())
            pinned(takes, f"{wire_class.__qualname__}.{method}", f"lacks {parameter!r}")
        is_async = inspect.iscoroutinefunction(theirs)
        pinned(
            is_async == inspect.iscoroutinefunction(getattr(wire_class, method)),
            name,
            f"is {'a coroutine' if is_async else 'plain'}, its wire twin is not",
        )
    # ... and the attributes they read off it (made, never connected)
    connection = connection_class(host="127.0.0.1", port=1, socket_timeout=0.5)
    for attribute in ("encoder", "socket_timeout"):
        pinned(
            hasattr(connection, attribute),
            f"{connection_class.__module__}.{connection_class.__qualname__}.{attribute}",
            "is gone",
        )
