"""The transports' wire connections (redreentrant._sync.wire, redreentrant._async.wire)
against real masters: which masters use them, replies and error replies as redis-py's
connections give them, time-outs and cancellations that lose no reply, a connection the
server closes, and the handshake (user, password, database) under a whole manager."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import socket
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

import redreentrant
from redreentrant._async.manager import url_client
from redreentrant._async.wire import WireConnection, WirePool, wire_pool
from redreentrant._core.keys import lock_key
from redreentrant._sync import wire as sync_wire
from redreentrant._sync.manager import url_client as sync_url_client
from redreentrant.asyncio import LockManager, QuorumUnavailableError
from redreentrant.testing import LocalEnsemble

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("hiredis") is None,
    reason="wire connections need hiredis (the matrix's venvs test the fallback)",
)


#: commands whose replies (and error replies) both kinds of connection must give alike
COMMANDS: list[tuple[object, ...]] = [
    ("SET", "wire:s", "v"),
    ("GET", "wire:s"),
    ("GET", "wire:none"),
    ("RPUSH", "wire:l", "a", "b"),
    ("LRANGE", "wire:l", 0, -1),
    ("EVAL", "return {1, 'x', {2}}", 0),
    ("EVALSHA", "0" * 40, 0),  # NOSCRIPT: redis-py's NoScriptError
    ("HGET", "wire:l", "f"),  # WRONGTYPE: a ResponseError naming it
    ("NOSUCHCOMMAND",),
]


def pool_of(url: str) -> WirePool:
    pool = wire_pool(url_client(url, 1.0), url)
    assert pool is not None
    return pool


async def connect(url: str) -> WireConnection:
    return await pool_of(url).get_connection()


def test_plain_url_clients_get_wire_connections_and_other_clients_do_not(
    urls: list[str],
) -> None:
    url = urls[0]
    host_port = url.removeprefix("redis://").split("/")[0]
    assert isinstance(wire_pool(url_client(url, 1.0), url), WirePool)
    assert isinstance(wire_pool(url_client(f"redis://u:pw@{host_port}/3", 1.0), url), WirePool)
    # What a wire connection does not carry out keeps the client's own connections:
    # TLS, a unix socket, options beyond host/port/db/user/password, a socket time-out,
    # RESP3, an encoding hiredis does not pack, another kind of client.
    refused = [
        url_client(f"rediss://{host_port}", 1.0),
        url_client("unix:///tmp/none.sock", 1.0),
        redis.asyncio.Redis.from_url(url, socket_keepalive=True, socket_timeout=None),
        redis.asyncio.Redis.from_url(url),  # redis.asyncio's default socket time-out
        redis.asyncio.Redis.from_url(url, protocol=3, socket_timeout=None),
        redis.asyncio.Redis.from_url(url, encoding="latin-1", socket_timeout=None),
        redis.Redis.from_url(url),
        object(),
    ]
    for client in refused:
        assert wire_pool(client, url) is None, client


def test_replies_and_error_replies_match_redis_asyncio(urls: list[str]) -> None:
    """The transport judges replies and errors alike on both kinds of connection."""

    async def replies_of(conn: object, send: object) -> list[object]:
        out: list[object] = []
        for command in COMMANDS:
            await send(*command)  # type: ignore[operator]
            try:
                out.append(await conn.read_response())  # type: ignore[attr-defined]
            except ResponseError as error:
                out.append((type(error), str(error)))
        return out

    async def main() -> None:
        wire = await connect(urls[0])
        client = url_client(urls[0], 1.0)
        theirs = await client.connection_pool.get_connection()
        try:
            ours = await replies_of(wire, wire.send_command)
            await client.delete("wire:s", "wire:l")
            expected = await replies_of(theirs, theirs.send_command)
        finally:
            await client.connection_pool.release(theirs)
            await client.delete("wire:s", "wire:l")
            await client.aclose()
            await wire.disconnect()
        assert ours == expected
        assert ours[6][0] is NoScriptError  # type: ignore[index]
        assert "WRONGTYPE" in ours[7][1]  # type: ignore[index]

    asyncio.run(main())


def test_a_read_that_times_out_or_is_cancelled_leaves_its_reply_owed(urls: list[str]) -> None:
    """As redis.asyncio: a time-out returns None and a cancelled read consumes
    nothing; the reply is read later, in order."""
    key = f"wire:{uuid.uuid4().hex}"

    async def main() -> None:
        wire = await connect(urls[0])
        pusher = url_client(urls[0], 1.0)
        try:
            await wire.send_command("BLPOP", key, 10)
            await wire.send_command("PING")
            assert await wire.read_response(timeout=0.05) is None
            reading = asyncio.ensure_future(wire.read_response())
            await asyncio.sleep(0.05)
            reading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reading
            await pusher.rpush(key, "v")
            assert await wire.read_response(timeout=5.0) == [key.encode(), b"v"]
            assert await wire.read_response(timeout=5.0) == b"PONG"
        finally:
            await pusher.delete(key)
            await pusher.aclose()
            await wire.disconnect()

    asyncio.run(main())


def test_a_reply_that_comes_in_parts_is_read_whole(urls: list[str]) -> None:
    """A reply may reach the client in several TCP segments (a master writes an
    array's header apart from its items): a read waits for the whole of it."""

    async def main() -> None:
        wire = await connect(urls[0])
        protocol = wire._protocol
        try:
            reading = asyncio.ensure_future(wire.read_response(timeout=math.inf))
            await asyncio.sleep(0)
            protocol.data_received(b"*2\r\n")
            await asyncio.sleep(0.01)
            assert not reading.done()
            protocol.data_received(b":1\r\n:2\r\n")
            assert await reading == [1, 2]
        finally:
            await wire.disconnect()

    asyncio.run(main())


def test_a_connection_the_server_closes_fails_its_reads_and_sends(urls: list[str]) -> None:
    async def main() -> None:
        wire = await connect(urls[0])
        admin = url_client(urls[0], 1.0)
        try:
            await wire.send_command("CLIENT", "ID")
            client_id = await wire.read_response(timeout=5.0)
            await wire.send_command("BLPOP", f"wire:{uuid.uuid4().hex}", 10)
            reading = asyncio.ensure_future(wire.read_response())
            await asyncio.sleep(0.05)
            assert await admin.client_kill_filter(_id=client_id) == 1
            with pytest.raises(RedisConnectionError):
                await asyncio.wait_for(reading, 5.0)
            with pytest.raises(RedisConnectionError):
                await wire.send_command("PING")
        finally:
            await admin.aclose()
            await wire.disconnect()

    asyncio.run(main())


@pytest.fixture
def acl_user(ensemble: LocalEnsemble) -> Iterator[tuple[str, str]]:
    """A user with a password on every master (removed afterwards)."""
    user, password = f"wire{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    for url in ensemble.urls:
        with redis.Redis.from_url(url) as r:
            r.acl_setuser(user, enabled=True, passwords=[f"+{password}"], keys=["*"],
                          channels=["*"], commands=["+@all"])  # fmt: skip
    yield user, password
    for url in ensemble.urls:
        with redis.Redis.from_url(url) as r:
            r.acl_deluser(user)


class UserDbMasters:
    """Three masters reached as a user with a password, on database 3."""

    def __init__(self, ensemble: LocalEnsemble, user: str, password: str) -> None:
        self.hosts = [u.removeprefix("redis://").split("/")[0] for u in ensemble.urls[:3]]
        self.name = f"wire-{uuid.uuid4().hex}"
        self.good = [f"redis://{user}:{password}@{h}/3" for h in self.hosts]
        self.bad = [f"redis://{user}:wrong@{h}/3" for h in self.hosts]

    def keys_in_db(self, db: int) -> list[int]:
        """On each master, whether the lock's key is in database ``db``."""
        counts = []
        for host in self.hosts:
            with redis.Redis.from_url(f"redis://{host}/{db}") as r:
                counts.append(int(r.exists(lock_key(self.name))))
        return counts


@pytest.fixture
def user_db(ensemble: LocalEnsemble, acl_user: tuple[str, str]) -> UserDbMasters:
    return UserDbMasters(ensemble, *acl_user)


def test_a_manager_of_urls_with_user_password_and_db_locks_there(user_db: UserDbMasters) -> None:
    m = user_db

    async def main() -> None:
        async with LockManager(m.good, lease=5.0) as mgr:
            async with mgr.lock(m.name):
                assert m.keys_in_db(3) == [1, 1, 1]
                assert m.keys_in_db(0) == [0, 0, 0]
            assert m.keys_in_db(3) == [0, 0, 0]
        async with LockManager(m.bad, lease=5.0, master_timeout=0.5) as mgr:
            with pytest.raises(QuorumUnavailableError, match=r"(?i)password|auth"):
                await mgr.lock(m.name).acquire()
        assert m.keys_in_db(3) == [0, 0, 0]

    asyncio.run(main())


# -- sync ---------------------------------------------------------------------------------


def sync_connect(url: str, timeout: float = 1.0) -> sync_wire.WireConnection:
    pool = sync_wire.wire_pool(sync_url_client(url, timeout), url)
    assert pool is not None
    return pool.get_connection()


def test_plain_sync_url_clients_get_wire_connections_and_other_clients_do_not(
    urls: list[str],
) -> None:
    url = urls[0]
    host_port = url.removeprefix("redis://").split("/")[0]
    assert isinstance(sync_wire.wire_pool(sync_url_client(url, 1.0), url), sync_wire.WirePool)
    refused = [
        sync_url_client(f"rediss://{host_port}", 1.0),
        sync_url_client("unix:///tmp/none.sock", 1.0),
        redis.Redis.from_url(url, socket_keepalive=True),
        redis.Redis.from_url(url, protocol=3),
        redis.Redis.from_url(url, encoding="latin-1"),
        url_client(url, 1.0),  # an asyncio client
    ]
    for client in refused:
        assert sync_wire.wire_pool(client, url) is None, client


def test_sync_replies_and_error_replies_match_redis_py(urls: list[str]) -> None:

    def replies_of(conn: object) -> list[object]:
        out: list[object] = []
        for command in COMMANDS:
            conn.send_command(*command)  # type: ignore[attr-defined]
            try:
                out.append(conn.read_response())  # type: ignore[attr-defined]
            except ResponseError as error:
                out.append((type(error), str(error)))
        return out

    wire = sync_connect(urls[0])
    client = sync_url_client(urls[0], 1.0)
    theirs = client.connection_pool.get_connection()
    try:
        ours = replies_of(wire)
        client.delete("wire:s", "wire:l")
        expected = replies_of(theirs)
    finally:
        client.connection_pool.release(theirs)
        client.delete("wire:s", "wire:l")
        client.close()
        wire.disconnect()
    assert ours == expected
    assert ours[6][0] is NoScriptError  # type: ignore[index]


def test_a_sync_read_that_times_out_leaves_its_reply_owed(urls: list[str]) -> None:
    """The socket's time-out (set in the kernel on Linux) bounds a read, which then
    consumed nothing: the reply is read later, in order, on the same connection."""
    key = f"wire:{uuid.uuid4().hex}"
    wire = sync_connect(urls[0], timeout=0.1)
    pusher = redis.Redis.from_url(urls[0])
    try:
        wire.send_command("BLPOP", key, 10)
        wire.send_command("PING")
        with pytest.raises(redis.TimeoutError):
            wire.read_response()
        assert not wire.can_read(timeout=0.05)
        pusher.rpush(key, "v")
        assert wire.can_read(timeout=5.0)
        assert wire.read_response() == [key.encode(), b"v"]
        assert wire.read_response() == b"PONG"
    finally:
        pusher.delete(key)
        pusher.close()
        wire.disconnect()


def test_a_sync_connection_the_server_closes_fails_its_reads_and_sends(urls: list[str]) -> None:
    wire = sync_connect(urls[0], timeout=5.0)
    admin = redis.Redis.from_url(urls[0])
    try:
        wire.send_command("CLIENT", "ID")
        client_id = wire.read_response()
        assert admin.client_kill_filter(_id=client_id) == 1
        with pytest.raises(RedisConnectionError):
            wire.send_command("PING")
            wire.read_response()
        with pytest.raises(RedisConnectionError):
            wire.send_command("PING")
    finally:
        admin.close()
        wire.disconnect()


def test_a_sync_manager_of_urls_with_user_password_and_db_locks_there(
    user_db: UserDbMasters,
) -> None:
    m = user_db
    with redreentrant.LockManager(m.good, lease=5.0) as mgr, mgr.lock(m.name):
        assert m.keys_in_db(3) == [1, 1, 1]
        assert m.keys_in_db(0) == [0, 0, 0]
    assert m.keys_in_db(3) == [0, 0, 0]
    refused = pytest.raises(redreentrant.QuorumUnavailableError, match=r"(?i)password|auth")
    with redreentrant.LockManager(m.bad, lease=5.0, master_timeout=0.5) as mgr, refused:
        mgr.lock(m.name).acquire()
    assert m.keys_in_db(3) == [0, 0, 0]


def test_a_sync_wire_connection_waits_for_replies_on_descriptors_above_1023(
    urls: list[str],
) -> None:
    """A process with many files open (select() refuses descriptors above 1023)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 2048), hard))
    spare = [socket.socket() for _ in range(1100)]
    try:
        wire = sync_connect(urls[0], timeout=5.0)
        try:
            assert wire.fileno() > 1023
            assert not wire.can_read(timeout=0.01)
            wire.send_command("PING")
            assert wire.can_read(timeout=5.0)
            assert wire.read_response() == b"PONG"
        finally:
            wire.disconnect()
    finally:
        for s in spare:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
