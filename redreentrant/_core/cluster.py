"""A quorum member that is a Redis Cluster: its nodes, its slot map, and the routing of
a round's calls to the nodes that own their slots (no I/O).

A cluster member is one vote in the quorum, like a plain master. Every call of a lock
names keys of one hash slot (they share the ``{name}`` tag; a renewal batch is split per
slot for such members, see :func:`~.watchdog.renew_steps`), so each call goes to the node
that owns its slot. A transport runs the routed round as it runs any round, over
*endpoints*: endpoint ``i`` is plain master ``i`` (the same numbers as the members), and
the nodes of cluster members get endpoints of their own as they are first routed to
(:class:`Endpoints`). :func:`route` is the routing as steps the transport carries out:

- the calls go, per member, to the owner of their slot in the member's
  :class:`ClusterMember` slot map (read with ``CLUSTER SLOTS`` when it is empty, and
  again, at most every ``refresh_interval``, after a node failed or said CLUSTERDOWN);
  the calls of one member on one node are pipelined on one connection;
- ``MOVED slot host:port``: the slot has a new owner; the map is updated and the call
  sent there (at most :data:`MAX_REDIRECTS` times in a round);
- ``ASK slot host:port``: the slot is being migrated and the keys are on the target;
  ``ASKING`` and the call (as ``EVAL``: the target may not have the script) go there,
  and the map is left as it is;
- ``TRYAGAIN`` (a multi-key call on a slot being migrated whose keys are split for the
  moment): sent again after a short pause, while the round's time (the master timeout)
  lasts;
- any other failure of a node is that member's failure for the calls routed to it: the
  quorum judges it as it judges a failed master.

A round that may end early (:class:`~.effects.Early`) counts the vote of a cluster
member whose calls all went to one node (the usual case) as soon as that node answered;
a member whose calls were split over nodes is waited for.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from .effects import UNREAD, Call, Early, Fanout, Reply
from .keys import key_slot

#: a node's address
Address = tuple[str, int]

SLOTS = 16384

#: how many redirections (MOVED, ASK) one call follows in a round
MAX_REDIRECTS = 3

#: the first pause before a call refused with TRYAGAIN is sent again (then doubled)
TRYAGAIN_PAUSE = 0.005

#: URL schemes of a cluster member (see :func:`parse_cluster_url`)
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")

#: options of a passed-in cluster client that its node connections keep (the rest, such
#: as its connection class, retries and RESP version, are the transport's own)
KEPT_OPTIONS = (
    "username",
    "password",
    "credential_provider",
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "socket_keepalive_options",
    "ssl_keyfile",
    "ssl_certfile",
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_ca_path",
    "ssl_ca_data",
    "ssl_check_hostname",
    "ssl_password",
    "ssl_min_version",
    "ssl_ciphers",
)

#: query options a cluster URL may carry besides ``node``
_URL_OPTIONS = {
    "ssl_cert_reqs": str,
    "ssl_ca_certs": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_check_hostname": bool,
}


def normal_host(host: str) -> str:
    """One spelling per loopback host, so that one node is not taken for two."""
    return "127.0.0.1" if host in ("localhost", "::1") else host


def parse_address(text: str) -> Address:
    """``host:port`` (``[v6]:port`` too) as an address; a ValueError naming it else."""
    host, sep, port = text.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"malformed node address {text!r}: expected host:port")
    return normal_host(host), int(port)


def is_cluster_url(text: str) -> bool:
    return text.strip().split("://", 1)[0].lower() in CLUSTER_SCHEMES


def parse_cluster_url(url: str) -> tuple[tuple[Address, ...], dict[str, Any]]:
    """A cluster member's URL as (seed nodes, node client options).

    ``redis+cluster://[[user]:password@]host[:port][/0][?node=host:port&...]``, or
    ``rediss+cluster://`` for TLS: the host and every ``node`` are seed nodes (any node
    of the cluster will do; more than one helps when one is down when the member is
    first used). Further query options: ``ssl_cert_reqs``, ``ssl_ca_certs``,
    ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname``. A cluster has database
    0 only."""
    parsed = urlsplit(url.strip())
    scheme = parsed.scheme.lower()
    if scheme not in CLUSTER_SCHEMES or not parsed.hostname:
        raise ValueError(f"malformed cluster URL {url!r}: expected redis+cluster://host:port")
    try:
        port = parsed.port or 6379
    except ValueError:
        raise ValueError(f"malformed cluster URL {url!r}: bad port") from None
    if parsed.path not in ("", "/", "/0"):
        raise ValueError(f"cluster URL {url!r} names a database: a cluster has database 0 only")
    seeds: list[Address] = [(normal_host(parsed.hostname), port)]
    options: dict[str, Any] = {}
    if parsed.username:
        options["username"] = unquote(parsed.username)
    if parsed.password:
        options["password"] = unquote(parsed.password)
    if scheme == "rediss+cluster":
        options["ssl"] = True
    for key, value in parse_qsl(parsed.query, keep_blank_values=True):
        if key == "node":
            seeds.append(parse_address(value))
        elif not url_option(options, key, value):
            raise ValueError(f"cluster URL {url!r}: unknown option {key!r}")
    return tuple(dict.fromkeys(seeds)), options


def url_option(options: dict[str, Any], key: str, value: str) -> bool:
    """Put the TLS option ``key`` of a URL's query (``ssl_cert_reqs``, ``ssl_ca_certs``,
    ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname``) in ``options``; False
    when ``key`` is none of them."""
    if key not in _URL_OPTIONS:
        return False
    if _URL_OPTIONS[key] is bool:
        options[key] = value.lower() in ("1", "true", "yes", "on")
    else:
        options[key] = value
    return True


class ClusterMember:
    """One quorum member that is a Redis Cluster: its nodes and its slot map.

    ``seeds`` are nodes to ask for the slot map; ``options`` are the keyword arguments
    of a client for one node (the flavour adds host, port and what it needs). The slot
    map is shared by every round and may be read while a round updates it: an entry is
    one assignment, and a reload replaces the whole list."""

    def __init__(
        self, seeds: Sequence[Address], options: Mapping[str, Any], client: object = None
    ) -> None:
        if not seeds:
            raise ValueError("a cluster member needs at least one node address")
        self.seeds = tuple(dict.fromkeys((normal_host(h), int(p)) for h, p in seeds))
        self.options = dict(options)
        #: the client it was described by, if one was passed in (never closed here)
        self.client = client
        self._owners: list[Address | None] = [None] * SLOTS
        #: every node known, seeds first (the wake-up hub subscribes on one of them)
        self.nodes: list[Address] = list(self.seeds)
        #: nodes whose last call failed (not a reply): asked for the map last
        self.down: set[Address] = set()
        #: the map needs reading again (a node failed or said CLUSTERDOWN)
        self.stale = True
        self._refreshed_at: float | None = None
        self._pick = 0

    @property
    def name(self) -> str:
        host, port = self.seeds[0]
        return f"cluster:{host}:{port}"

    def __repr__(self) -> str:
        return f"<ClusterMember {self.name} nodes={len(self.nodes)}>"

    def owner(self, slot: int) -> Address | None:
        return self._owners[slot]

    def fallback(self) -> Address:
        """A node for a slot of unknown owner: it redirects to the owner."""
        up = [n for n in self.nodes if n not in self.down]
        return (up or self.nodes)[0]

    def refresh_due(self, now: float, interval: float) -> bool:
        """Whether to read the slot map now: stale (or never read) and not tried within
        ``interval``, so that a member whose nodes do not answer does not hold up every
        round. True takes the turn (another round will not also)."""
        if not self.stale:
            return False
        if self._refreshed_at is not None and now - self._refreshed_at < interval:
            return False
        self._refreshed_at = now
        return True

    def refresh_targets(self) -> list[Address]:
        """The nodes to ask for the map, in order: nodes that answered lately first."""
        return [n for n in self.nodes if n not in self.down] + [
            n for n in self.nodes if n in self.down
        ]

    def load(self, reply: object, replier: Address) -> bool:
        """Read a ``CLUSTER SLOTS`` reply from ``replier``; False if it is not one."""
        if not isinstance(reply, list):
            return False
        owners: list[Address | None] = [None] * SLOTS
        try:
            for entry in reply:
                start, end, primary = int(entry[0]), int(entry[1]), entry[2]
                node = _node_address(primary, replier)
                for slot in range(start, min(end, SLOTS - 1) + 1):
                    owners[slot] = node
                self.know(node)
        except (TypeError, ValueError, IndexError):
            return False
        self._owners = owners
        self.stale = False
        return True

    def moved(self, slot: int, node: Address) -> None:
        """A ``MOVED``: ``node`` owns ``slot`` now."""
        self._owners[slot] = node
        self.know(node)

    def know(self, node: Address) -> None:
        if node not in self.nodes:
            self.nodes.append(node)

    def failed(self, node: Address, down: bool) -> None:
        """A call to ``node`` failed: the map may be out of date (a failover); ``down``
        when the node itself did not answer."""
        self.stale = True
        if down:
            self.down.add(node)

    def answered(self, node: Address) -> None:
        self.down.discard(node)

    def primaries(self) -> list[Address]:
        """The nodes that own slots in the map (the seeds while no map was read)."""
        return sorted({n for n in self._owners if n is not None}) or list(self.seeds)

    def pick(self) -> Address:
        """A node for the wake-up subscription: each (re)connect takes the next one,
        so a node that died is left for another."""
        up = [n for n in self.nodes if n not in self.down] or self.nodes
        self._pick += 1
        return up[self._pick % len(up)]


def connect_timeout(member: ClusterMember, master_timeout: float) -> float:
    """The connect time-out of a node connection: the member's own, at most the master
    timeout (a round waits for its connects before it reads: redis-py's asyncio cluster
    client, for one, defaults to 5 s)."""
    own = member.options.get("socket_connect_timeout")
    return master_timeout if not isinstance(own, (int, float)) else min(own, master_timeout)


def _node_address(entry: object, replier: Address) -> Address:
    if not isinstance(entry, list) or len(entry) < 2:
        raise ValueError(f"odd node entry {entry!r}")
    host = entry[0].decode() if isinstance(entry[0], bytes) else str(entry[0])
    if host in ("", "?"):  # an unknown endpoint: the node that replied
        host = replier[0]
    return normal_host(host), int(entry[1])


# -- replies ----------------------------------------------------------------------------


def _names(error: BaseException) -> set[str]:
    return {c.__name__ for c in type(error).__mro__}


def is_reply_error(reply: Reply) -> bool:
    """An error the server replied (the connection is fine), as opposed to a failed
    connection or a time-out. By class name: the core imports no client library."""
    return isinstance(reply, Exception) and "ResponseError" in _names(reply)


@dataclass(frozen=True)
class Redirect:
    """A ``MOVED`` or ``ASK`` reply."""

    ask: bool
    slot: int
    node: Address


def redirect_of(reply: Reply, replier: Address) -> Redirect | None:
    """The redirection a reply is, if it is one (an empty host: the replier's)."""
    if not isinstance(reply, Exception):
        return None
    text = str(reply).strip()
    names = _names(reply)
    kind = type(reply).__name__
    if kind == "MovedError" or (kind != "AskError" and text.startswith("MOVED ")):
        ask = False
    elif kind == "AskError" or text.startswith("ASK "):
        ask = True
    else:
        return None
    if "ResponseError" not in names:
        return None
    parts = text.split()
    if parts and parts[0] in ("MOVED", "ASK"):
        parts = parts[1:]
    try:
        slot = int(parts[0])
        host, _, port = parts[1].rpartition(":")
        return Redirect(ask, slot, (normal_host(host or replier[0]), int(port)))
    except (IndexError, ValueError):
        return None


def is_try_again(reply: Reply) -> bool:
    return isinstance(reply, Exception) and (
        type(reply).__name__ == "TryAgainError" or str(reply).startswith("TRYAGAIN")
    )


def is_cluster_down(reply: Reply) -> bool:
    return isinstance(reply, Exception) and (
        type(reply).__name__ == "ClusterDownError" or str(reply).startswith("CLUSTERDOWN")
    )


# -- endpoints and routing ----------------------------------------------------------------


class Endpoints:
    """A transport's endpoints: plain master ``i`` is endpoint ``i``, and each node of a
    cluster member gets an endpoint of its own when it is first routed to (endpoint
    ``i`` of a cluster member ``i`` is never used). ``guard()`` makes the lock that
    keeps two threads from numbering one node twice."""

    def __init__(
        self,
        members: Sequence[object],
        refresh_interval: float,
        guard: Callable[[], AbstractContextManager[object]] = nullcontext,
    ) -> None:
        self.members = list(members)
        self.refresh_interval = refresh_interval
        #: what each endpoint is: (member, node address), the address None for a plain one
        self.table: list[tuple[int, Address | None]] = [(i, None) for i in range(len(members))]
        self._index: dict[tuple[int, Address], int] = {}
        self._guard = guard()
        self.clustered = any(isinstance(m, ClusterMember) for m in self.members)

    def cluster(self, i: int) -> ClusterMember | None:
        member = self.members[i]
        return member if isinstance(member, ClusterMember) else None

    def of(self, i: int, node: Address) -> int:
        """The endpoint of member ``i``'s ``node``."""
        key = (i, node)
        found = self._index.get(key)
        if found is not None:
            return found
        with self._guard:
            found = self._index.get(key)
            if found is None:
                found = len(self.table)
                self.table.append(key)
                self._index[key] = found
            return found


@dataclass(frozen=True)
class NodeRound:
    """Effect of :func:`route`: one round over endpoints (``calls[e]`` to endpoint
    ``e``), run as the transport runs any round. Result: the replies per endpoint."""

    calls: tuple[tuple[Call, ...], ...]
    early: Early | None
    #: the endpoints whose replies count as a member's vote for ``early``
    voters: frozenset[int]
    cleanup: bool


@dataclass(frozen=True)
class NodeCommands:
    """Effect of :func:`route`: ``commands`` pipelined to one endpoint, replies read
    within the master timeout. Result: the replies (an exception for each one lost)."""

    endpoint: int
    commands: tuple[tuple[object, ...], ...]


@dataclass(frozen=True)
class Backoff:
    """Effect of :func:`route`: sleep ``seconds`` (before a ``TRYAGAIN`` is retried)."""

    seconds: float


RouteEffect = NodeRound | NodeCommands | Backoff


def _slot(call: Call) -> int:
    return key_slot(call.keys[0]) if call.keys else 0


def route(
    fanout: Fanout, ends: Endpoints, clock: Callable[[], float], timeout: float
) -> Generator[RouteEffect, Any, list[list[Reply]]]:
    """Carry out ``fanout`` (calls per member) over endpoints; returns the replies per
    member, one per call, as a round over plain masters would.

    A call over several locks (:class:`~.effects.Groups`) whose locks' slots differ is
    made, on a cluster member, as one call per slot, in one fixed order (by slot, then
    by the locks' order in the call); its reply is its parts' replies merged (a part
    that failed, or was not read, is the call's reply). Such a member votes only once
    every part answered."""
    split, plans = _split(fanout, ends)
    replies = yield from _route(split, ends, clock, timeout, frozenset(plans))
    for i, plan in plans.items():
        merged: list[Reply] = [UNREAD] * len(fanout.calls[i])
        parts: dict[int, list[tuple[list[int], Reply]]] = {}
        for (j, groups), reply in zip(plan, replies[i], strict=True):
            if groups is None:
                merged[j] = reply
            else:
                parts.setdefault(j, []).append((groups, reply))
        for j, pieces in parts.items():
            odd = next((r for _, r in pieces if r is UNREAD or isinstance(r, Exception)), None)
            call_groups = fanout.calls[i][j].groups
            assert call_groups is not None
            merged[j] = odd if odd is not None else call_groups.merge(pieces)
        replies[i] = merged
    return replies


def _split(
    fanout: Fanout, ends: Endpoints
) -> tuple[Fanout, dict[int, list[tuple[int, list[int] | None]]]]:
    """``fanout`` with the cluster members' calls over several slots made one call per
    slot, and, per member split, where each of its calls comes from: (the call's place,
    the indices of its groups; None: the call as it was)."""
    calls = list(fanout.calls)
    plans: dict[int, list[tuple[int, list[int] | None]]] = {}
    for i, mine in enumerate(fanout.calls):
        if ends.cluster(i) is None or not any(c.groups is not None for c in mine):
            continue
        made: list[Call] = []
        plan: list[tuple[int, list[int] | None]] = []
        for j, call in enumerate(mine):
            pieces = _pieces(call)
            if len(pieces) == 1:
                made.append(call)
                plan.append((j, None))
                continue
            for groups, part in pieces:
                made.append(part)
                plan.append((j, groups))
        if any(groups is not None for _, groups in plan):
            calls[i] = tuple(made)
            plans[i] = plan
    return fanout._replace(calls=tuple(calls)), plans


def _pieces(call: Call) -> list[tuple[list[int], Call]]:
    """A call over several locks as one call per slot, by slot (a call without groups,
    or of one slot, as it is)."""
    g = call.groups
    if g is None:
        return [([], call)]
    by_slot: dict[int, list[int]] = {}
    for k in range(len(call.keys) // g.keys):
        by_slot.setdefault(key_slot(call.keys[k * g.keys]), []).append(k)
    if len(by_slot) == 1:
        return [([], call)]
    shared = call.args[: g.shared]
    out = []
    for slot in sorted(by_slot):
        idx = by_slot[slot]
        keys = tuple(key for k in idx for key in call.keys[k * g.keys : (k + 1) * g.keys])
        args = shared + tuple(
            a for k in idx for a in call.args[g.shared + k * g.args : g.shared + (k + 1) * g.args]
        )
        out.append((idx, Call(call.script, keys, args)))
    return out


def _route(
    fanout: Fanout,
    ends: Endpoints,
    clock: Callable[[], float],
    timeout: float,
    split: frozenset[int],
) -> Generator[RouteEffect, Any, list[list[Reply]]]:
    started = clock()
    results: list[list[Reply]] = [[UNREAD] * len(calls) for calls in fanout.calls]
    for i, calls in enumerate(fanout.calls):
        member = ends.cluster(i)
        if calls and member is not None and member.refresh_due(started, ends.refresh_interval):
            yield from _refresh(i, member, ends)
    # Per endpoint: its calls and where each reply goes (member, call number).
    per_end: dict[int, list[tuple[Call, int, int]]] = {}
    for i, calls in enumerate(fanout.calls):
        member = ends.cluster(i)
        for j, call in enumerate(calls):
            if member is None:
                end = i
            else:
                end = ends.of(i, member.owner(_slot(call)) or member.fallback())
            per_end.setdefault(end, []).append((call, i, j))
    # A member whose calls all go to one endpoint votes there (not one whose calls
    # were split: its parts' replies are merged first).
    whole = {
        end: items[0][1]
        for end, items in per_end.items()
        if len(items) == len(fanout.calls[items[0][1]]) and items[0][1] not in split
    }
    size = max(per_end, default=-1) + 1
    round_calls: list[tuple[Call, ...]] = [()] * size
    for end, items in per_end.items():
        i = items[0][1]
        # The member's own tuple where it is whole: packed once for all its endpoints.
        round_calls[end] = fanout.calls[i] if end in whole else tuple(c for c, _, _ in items)
    replies = yield NodeRound(tuple(round_calls), fanout.early, frozenset(whole), fanout.cleanup)
    pending: list[tuple[Call, int, int, int]] = []  # call, member, number, endpoint
    for end, items in per_end.items():
        for (call, i, j), reply in zip(items, replies[end], strict=True):
            results[i][j] = reply
            pending.append((call, i, j, end))
    # Redirections and TRYAGAIN, for the cluster members' calls.
    pause = TRYAGAIN_PAUSE
    for hop in range(MAX_REDIRECTS + 1):
        follow = hop < MAX_REDIRECTS
        moved: dict[int, list[tuple[Call, int, int]]] = {}
        asked: dict[int, list[tuple[Call, int, int]]] = {}
        again: list[tuple[Call, int, int, int]] = []
        for call, i, j, end in pending:
            member = ends.cluster(i)
            if member is None:
                continue
            node = ends.table[end][1]
            assert node is not None
            reply = results[i][j]
            if reply is UNREAD:
                continue
            if not isinstance(reply, Exception):
                member.answered(node)
                continue
            redirect = redirect_of(reply, node)
            if redirect is not None:
                member.answered(node)
                if not follow:
                    member.stale = True
                elif redirect.ask:
                    asked.setdefault(ends.of(i, redirect.node), []).append((call, i, j))
                else:
                    member.moved(redirect.slot, redirect.node)
                    moved.setdefault(ends.of(i, redirect.node), []).append((call, i, j))
            elif is_try_again(reply) and follow:
                again.append((call, i, j, end))
            elif is_cluster_down(reply) or not is_reply_error(reply):
                member.failed(node, down=not is_reply_error(reply))
        if again and clock() + pause < started + timeout:
            yield Backoff(pause)
            pause *= 2
            for call, i, j, _ in again:
                # From the map again: an ASK target refuses a call without ASKING.
                member = ends.cluster(i)
                assert member is not None
                node = member.owner(_slot(call)) or member.fallback()
                moved.setdefault(ends.of(i, node), []).append((call, i, j))
        pending = []
        if moved:
            size = max(moved) + 1
            again_calls: list[tuple[Call, ...]] = [()] * size
            for end, items in moved.items():
                again_calls[end] = tuple(c for c, _, _ in items)
            replies = yield NodeRound(tuple(again_calls), None, frozenset(), fanout.cleanup)
            for end, items in moved.items():
                for (call, i, j), reply in zip(items, replies[end], strict=True):
                    results[i][j] = reply
                    pending.append((call, i, j, end))
        for end, items in asked.items():
            commands: list[tuple[object, ...]] = []
            for call, _, _ in items:
                commands.append(("ASKING",))
                commands.append(
                    ("EVAL", call.script.source, len(call.keys), *call.keys, *call.args)
                )
            out = yield NodeCommands(end, tuple(commands))
            for n, (call, i, j) in enumerate(items):
                asking, reply = out[2 * n], out[2 * n + 1]
                results[i][j] = asking if isinstance(asking, Exception) else reply
                pending.append((call, i, j, end))
        if not pending:
            break
    return results


def _refresh(i: int, member: ClusterMember, ends: Endpoints) -> Generator[RouteEffect, Any, None]:
    """Read member ``i``'s slot map from the first of (at most two of) its nodes that
    answers."""
    for node in member.refresh_targets()[:2]:
        out = yield NodeCommands(ends.of(i, node), (("CLUSTER", "SLOTS"),))
        if member.load(out[0], node):
            member.answered(node)
            return
        if isinstance(out[0], Exception) and not is_reply_error(out[0]):
            member.down.add(node)
