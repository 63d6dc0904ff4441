"""The masters of a manager: clients from URLs, their names, and the check that each
server is given once. No I/O: a client is made, never connected, here (each flavour
passes its client class and URL factory).

A member of the quorum is a plain master (a client), a Redis Cluster
(:class:`~.cluster.ClusterMember`, made from a cluster client or a ``redis+cluster://``
URL), or a Sentinel-managed group's master (a client made by ``Sentinel.master_for``, or
from a ``redis+sentinel://`` URL: see :mod:`.sentinel`)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from .cluster import KEPT_OPTIONS, Address, ClusterMember, is_cluster_url, parse_cluster_url
from .sentinel import is_sentinel_url, sentinel_service, split_masters
from .settings import master_url, master_urls

T = TypeVar("T", bound=type)


def master_name(client: Any) -> str:
    """A readable address of a master, for messages (``host:port/db`` or a socket path;
    ``cluster:host:port`` for a cluster member; ``sentinel:service@host:port`` for a
    Sentinel-managed one)."""
    if isinstance(client, ClusterMember):
        return client.name
    group = sentinel_service(client)
    if group is not None:
        return group.name
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix:{kw['path']}/{kw.get('db', 0)}"
    return f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


def master_identity(client: Any) -> tuple[object, ...]:
    """What makes two clients the same master: the server (host and port, or socket
    path). Two databases of one server are not independent masters: one crash or
    restart would take both votes."""
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return ("unix", kw["path"])
    host = str(kw.get("host", "localhost"))
    if host in ("localhost", "::1"):
        host = "127.0.0.1"
    return (host, int(kw.get("port", 6379)))


def with_valkey(redis_type: T, module: str, name: str) -> tuple[T, ...]:
    """``redis_type`` (of redis-py), and its twin ``name`` in valkey-py's ``module``
    when valkey-py is loaded: valkey-py is a fork of redis-py with the same client,
    pool and connection API, so its clients serve as masters too, and its twin classes
    stand in for redis-py's (typed as such). It stays optional: it is looked up among
    the loaded modules, never imported here (whoever passes a valkey-py client has
    imported it)."""
    twin = getattr(sys.modules.get(module), name, None)
    return (redis_type, cast(T, twin)) if isinstance(twin, type) else (redis_type,)


def no_handshake(connection_class: Any) -> dict[str, Any]:
    """Client options that make connecting send nothing (no HELLO, no CLIENT SETINFO):
    on a frozen master a handshake would block every reconnect for a socket time-out.
    (redis-py 5.0 names the options ``lib_name``/``lib_version``, later ones
    ``driver_info``.)"""
    params = inspect.signature(connection_class.__init__).parameters
    if "driver_info" in params:
        return {"protocol": 2, "driver_info": None}
    return {"protocol": 2, "lib_name": None, "lib_version": None}


def identities(member: Any) -> list[tuple[object, ...]]:
    """The servers a member is known to be (a cluster member: its seed nodes; a
    Sentinel-managed one: its service at each of its sentinels)."""
    if isinstance(member, ClusterMember):
        return list(member.seeds)
    group = sentinel_service(member)
    if group is not None:
        return group.identities()
    return [master_identity(member)]


def cluster_of_client(client: Any) -> ClusterMember:
    """A cluster member described by a cluster client (redis-py's or valkey-py's, sync
    or asyncio): its known nodes as seeds, and the options its node connections keep
    (credentials, TLS, time-outs). Its own connections are not used: the transports
    connect to the nodes themselves, as they do to plain masters."""
    manager = client.nodes_manager
    seeds: list[Address] = [(n.host, int(n.port)) for n in manager.startup_nodes.values()]
    cache = getattr(manager, "nodes_cache", {}) or {}
    seeds += [
        (n.host, int(n.port))
        for n in cache.values()
        if getattr(n, "server_type", None) != "replica"
    ]
    kwargs = dict(getattr(manager, "connection_kwargs", None) or {})
    options = {k: kwargs[k] for k in KEPT_OPTIONS if kwargs.get(k) is not None}
    if not isinstance(options.get("socket_keepalive_options"), dict):
        options.pop("socket_keepalive_options", None)  # a client's "unset" marker
    connection_class = kwargs.get("connection_class")
    if connection_class is not None and "SSL" in getattr(connection_class, "__name__", ""):
        options["ssl"] = True
    return ClusterMember(seeds, options, client)


def connect(
    masters: object,
    client_type: type | tuple[type, ...],
    from_url: Callable[[str], Any],
    cluster_types: tuple[type, ...] = (),
) -> tuple[list[Any], list[Any]]:
    """Members for ``masters``: URLs, ``client_type`` instances (plain masters, and
    Sentinel-managed ones: clients of ``Sentinel.master_for``; one type or a tuple of
    them), or instances of ``cluster_types`` and ``redis+cluster://`` URLs (cluster
    members), checked for duplicates. Returns (all members, the clients made here from
    URLs: ``from_url`` makes a Sentinel-managed client of a ``redis+sentinel://`` URL).

    One string may hold several masters separated by commas: never a silent quorum of
    one master when the list came from an environment variable. A list item holds one
    master: a comma in it is an error, except between the sentinels of a
    ``redis+sentinel://`` URL."""
    if isinstance(masters, str):
        masters = master_urls(masters)
    elif isinstance(masters, (client_type, cluster_types)):
        masters = [masters]
    if not isinstance(masters, Sequence):
        raise TypeError("masters must be redis URLs or clients, or a sequence of them")
    if not masters:
        raise ValueError("at least one master is needed")
    clients: list[Any] = []
    for m in masters:
        if isinstance(m, str):
            if "," in m and (not is_sentinel_url(m) or len(split_masters(m)) > 1):
                raise ValueError(
                    f"master {m!r} holds a comma: give one master per item, or all of"
                    " them as one comma-separated string"
                )
            url = master_url(m)
            if is_cluster_url(url):
                clients.append(ClusterMember(*parse_cluster_url(url)))
            else:
                clients.append(from_url(url))
        elif isinstance(m, client_type):
            group = sentinel_service(m)
            if group is not None and not group.master:
                raise ValueError(
                    f"master {group.name} is a client of the service's replicas"
                    " (Sentinel.slave_for): a member is its master (Sentinel.master_for)"
                )
            clients.append(m)
        elif cluster_types and isinstance(m, cluster_types):
            clients.append(cluster_of_client(m))
        elif isinstance(m, ClusterMember):
            clients.append(m)
        else:
            types = client_type if isinstance(client_type, tuple) else (client_type,)
            kinds = [t.__name__ for t in (*types, *cluster_types)]
            if callable(getattr(m, "master_for", None)):  # a Sentinel: of which service?
                raise TypeError(
                    f"a Sentinel is not a master: it names no service; pass"
                    f" sentinel.master_for(service_name) or a"
                    f" redis+sentinel://host:port,.../service_name URL, not {m!r}"
                )
            raise TypeError(f"a master is a redis URL or a {' or '.join(kinds)}, not {m!r}")
    own = [
        c
        for c, m in zip(clients, masters, strict=True)
        if isinstance(m, str) and not isinstance(c, ClusterMember)
    ]
    seen: dict[object, int] = {}
    for i, c in enumerate(clients):
        for ident in identities(c):
            if ident in seen:
                other = clients[seen[ident]]
                if ident[0] == "sentinel" and master_name(other) != master_name(c):
                    _, service, (host, port) = cast(tuple[str, str, Address], ident)
                    raise ValueError(
                        f"masters {master_name(other)} and {master_name(c)} (positions"
                        f" {seen[ident]} and {i}) are one Sentinel-managed master (service"
                        f" {service!r} of sentinel {host}:{port}): give each quorum member a"
                        " master of its own"
                    )
                if master_name(other) != master_name(c):
                    raise ValueError(
                        f"masters {master_name(other)} and {master_name(c)} (positions"
                        f" {seen[ident]} and {i}) are one server: they are not independent"
                        " masters (one crash or restart of it would take both votes);"
                        " give each quorum member a server of its own"
                    )
                raise ValueError(
                    f"master {master_name(c)} is given twice (positions {seen[ident]} and {i})"
                )
            seen[ident] = i
    return clients, own
