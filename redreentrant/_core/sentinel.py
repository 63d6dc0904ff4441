"""Quorum members that are Sentinel-managed groups: their URL, the splitting of a
comma-separated list of masters that holds one, and what tells a client of one apart
(no I/O).

A Sentinel-managed group (a master, its replicas and the sentinels that watch them) is
one vote in the quorum, like a plain master. Its client is a redis-py client of the
group's master made by ``Sentinel.master_for``: its pool's connections ask the sentinels
for the master's address whenever they connect, and drop themselves when the master they
reached answers ``READONLY`` (it was demoted), so the transports take its connections
from its own pool, as they do for any client passed in, and every new connection (a
round's, a probe's, the wake-up subscriber's) follows the group's current master.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

from .cluster import Address, normal_host, url_option

#: URL schemes of a Sentinel-managed member (see :func:`parse_sentinel_url`)
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")

#: the port of a sentinel whose address names none
SENTINEL_PORT = 26379

#: what Sentinel accepts as the name of a service
_SERVICE = re.compile(r"[A-Za-z0-9._-]+")
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::([0-9]{1,5}))?")

_EXPECTED = "expected redis+sentinel://host:port[,host:port...]/service[/db]"


@dataclass(frozen=True)
class SentinelURL:
    """A Sentinel-managed member's URL, parsed: the sentinels, the service they know its
    master by, the database, and the options of the connections (``username``,
    ``password`` of the master; ``ssl`` and the TLS options, for the sentinels too)."""

    sentinels: tuple[Address, ...]
    service: str
    db: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def tls(self) -> dict[str, Any]:
        """The options that the connections to the sentinels take too."""
        return {k: v for k, v in self.options.items() if k.startswith("ssl")}


def is_sentinel_url(text: str) -> bool:
    return text.strip().split("://", 1)[0].lower() in SENTINEL_SCHEMES


def parse_sentinel_url(url: str) -> SentinelURL:
    """A Sentinel-managed member's URL, checked.

    ``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]``,
    or ``rediss+sentinel://`` for TLS (to the sentinels and to the master): the hosts
    are the sentinels (port 26379 when none is given), ``service`` the name they monitor
    the master under (letters, digits, ``.``, ``_`` and ``-``), ``db`` the database
    (default 0). The user name and password are the master's (and its replicas'); the
    sentinels are asked without them. The query may carry the TLS options of a cluster
    URL: ``ssl_cert_reqs``, ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
    ``ssl_check_hostname``. Anything else is a ValueError naming the URL."""
    text = url.strip()
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in SENTINEL_SCHEMES:
        raise ValueError(f"malformed sentinel URL {url!r}: {_EXPECTED}")
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    options: dict[str, Any] = {}
    if at:
        user, _, password = userinfo.partition(":")
        if user:
            options["username"] = unquote(user)
        if password:
            options["password"] = unquote(password)
    sentinels = tuple(dict.fromkeys(_sentinel_address(url, h) for h in hosts.split(",")))
    service, _, db_text = path.partition("/")
    service = unquote(service)
    if not slash or not service:
        raise ValueError(f"sentinel URL {url!r} names no service: {_EXPECTED}")
    if not _SERVICE.fullmatch(service):
        raise ValueError(
            f"sentinel URL {url!r}: malformed service name {service!r} (letters, digits,"
            " '.', '_' and '-')"
        )
    db_text = db_text.rstrip("/")
    if db_text and not db_text.isdigit():
        raise ValueError(f"sentinel URL {url!r}: malformed database {db_text!r}: {_EXPECTED}")
    for key, value in parse_qsl(query, keep_blank_values=True):
        if not url_option(options, key, value):
            raise ValueError(f"sentinel URL {url!r}: unknown option {key!r}")
    if scheme.lower() == "rediss+sentinel":
        options["ssl"] = True
    return SentinelURL(sentinels, service, int(db_text or 0), options)


def _sentinel_address(url: str, text: str) -> Address:
    match = _HOST.fullmatch(text.strip())
    port = int(match.group(2) or SENTINEL_PORT) if match else 0
    if match is None or not 0 < port < 65536:
        raise ValueError(
            f"sentinel URL {url!r}: malformed sentinel address {text!r}: expected host:port"
        )
    host = match.group(1)
    return normal_host(host[1:-1] if host.startswith("[") else host), port


def split_masters(text: str) -> list[str]:
    """Masters written as one string, split at their commas, but for the commas between
    the sentinels of a sentinel URL: ``"redis+sentinel://a:1,b:2/locks,redis://c:3/0"``
    is two masters. A sentinel URL's hosts end at the ``/`` before its service; until
    then, what follows a comma is one more of its hosts unless it holds ``://``."""
    parts: list[str] = []
    hosts_go_on = False
    for part in text.split(","):
        if hosts_go_on and "://" not in part:
            parts[-1] += "," + part
        else:
            parts.append(part)
        last = parts[-1].strip()
        hosts_go_on = is_sentinel_url(last) and "/" not in last.split("://", 1)[1]
    return parts


@dataclass(frozen=True)
class SentinelService:
    """What tells a Sentinel-managed master apart: its service and its sentinels
    (sorted: a client reorders them as they answer)."""

    service: str
    sentinels: tuple[Address, ...]
    #: a client of the master (``master_for``), not of the replicas (``slave_for``)
    master: bool = True

    @property
    def name(self) -> str:
        """``sentinel:SERVICE@HOST:PORT``, of its first sentinel (in sorted order)."""
        if not self.sentinels:
            return f"sentinel:{self.service}"
        host, port = self.sentinels[0]
        return f"sentinel:{self.service}@{host}:{port}"

    def identities(self) -> list[tuple[object, ...]]:
        """One per sentinel: two clients that share a sentinel and a service are one
        master."""
        return [("sentinel", self.service, address) for address in self.sentinels]


def sentinel_service(client: Any) -> SentinelService | None:
    """The service and sentinels of a client made by redis-py's (or valkey-py's)
    ``Sentinel.master_for`` or ``slave_for``, sync or asyncio (its pool knows its
    service and its ``Sentinel``); None for any other client."""
    pool = getattr(client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    manager = getattr(pool, "sentinel_manager", None)
    if not isinstance(service, str) or manager is None:
        return None
    addresses: list[Address] = []
    for sentinel in getattr(manager, "sentinels", ()):
        kw = getattr(getattr(sentinel, "connection_pool", None), "connection_kwargs", {})
        host = normal_host(str(kw.get("host", "localhost")))
        addresses.append((host, int(kw.get("port", SENTINEL_PORT))))
    return SentinelService(
        service, tuple(sorted(set(addresses))), bool(getattr(pool, "is_master", True))
    )


def demoted(conn: Any, error: BaseException) -> bool:
    """Whether the error reply ``error``, read on ``conn``, says that the master a
    Sentinel-managed connection reached is a replica now (it was failed over): then
    the connection is dropped, and the next one asks the sentinels where the master
    is. redis-py's Sentinel-managed connections do so themselves for a ``READONLY``
    reply, but not for a script's error that carries one (Redis before 7:
    ``ERR Error running script ... -READONLY You can't write against a read only
    replica.``)."""
    pool = getattr(conn, "connection_pool", None)
    return bool(getattr(pool, "is_master", False)) and "read only replica" in str(error)
