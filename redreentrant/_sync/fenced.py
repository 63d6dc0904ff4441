"""The sync :class:`FencedStore`: a value in Redis guarded by fencing tokens."""

from __future__ import annotations

import redis

from .._core.guard import SCRIPT, token_key, write_args
from .._core.replies import accepted


class FencedStore:
    """A value kept in Redis under ``key`` that only the newest lock holder may write.

    Each :meth:`write` carries the writer's fencing token (``lock.token``) and is made
    only if that token is at least the largest token accepted before (atomically, in
    one script): a holder whose lease ran out while it was paused, and whose lock was
    granted to someone else since, has a smaller token, and its late write is refused.

    ``client`` is any ``redis.Redis`` (the resource, not necessarily a lock master).
    The largest accepted token is kept under ``token_key`` (default ``key`` +
    ``":fencing-token"``). Neither key expires.
    """

    def __init__(self, client: redis.Redis, key: str, *, token_key: str | None = None) -> None:
        self.client = client
        self.key = key
        self.token_key = token_key if token_key is not None else _default(key)
        self._script = client.register_script(SCRIPT.source)

    def write(self, token: int, value: str | bytes | int | float) -> bool:
        """Write ``value`` if ``token`` is not smaller than any accepted before; True if
        written, False if refused (nothing changed)."""
        reply = self._script(keys=[self.key, self.token_key], args=write_args(token, value))
        return accepted(reply)

    def read(self) -> bytes | None:
        """The value last written (None if none)."""
        value = self.client.get(self.key)
        return None if value is None else value.encode() if isinstance(value, str) else bytes(value)

    def largest_token(self) -> int | None:
        """The largest token accepted so far (None if no write was made)."""
        value = self.client.get(self.token_key)
        return None if value is None else int(value)


_default = token_key
