"""Durable grants: a master's vote counts only once its write is safe (no I/O).

A master that answers a try before its replicas have the write, or before it reached
the disk, may lose it: to a failover (the promoted replica lacks it) or to a crash
(``appendfsync everysec`` loses up to a second). With a durability set for a master,
every try (a grant, a re-entry) and every renewal sent to it is followed, in the same
round and on the same connection, by

- ``WAIT N timeout`` (``"replicas:N"``): the master's grant counts only once N replicas
  acknowledged every write before it;
- ``WAITAOF 1 0 timeout`` (``"aof"``, Redis 7.2+ and Valkey 8+): only once the write
  was fsynced to the master's own append-only file (under ``appendfsync everysec``, up
  to a second later: the wait lasts half the master timeout).

A reply that falls short makes the master's answer a failure for that round (a grant
so answered is undone with the others); a server without ``WAITAOF`` refuses the
setting with :class:`DurabilityError`, naming the master. Replicas that acknowledged
every grant also let a promoted replica vote at once (see :mod:`.clockwatch`): it has
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .effects import UNREAD, Call, Reply
from .errors import DurabilityError
from .scripts import command

WAIT = command("WAIT")
WAITAOF = command("WAITAOF")


@dataclass(frozen=True)
class Durability:
    """What a master's writes must reach before its vote counts."""

    #: replicas that must acknowledge (``WAIT``); 0 with ``aof``
    replicas: int = 0
    #: fsynced to the master's append-only file (``WAITAOF``)
    aof: bool = False

    def __str__(self) -> str:
        return "aof" if self.aof else f"replicas:{self.replicas}"

    def call(self, timeout_ms: int) -> Call:
        """The command that waits for it, at most ``timeout_ms``."""
        if self.aof:
            return Call(WAITAOF, (), (1, 0, timeout_ms))
        return Call(WAIT, (), (self.replicas, timeout_ms))

    def shortfall(self, reply: Reply) -> str | None:
        """Why the command's ``reply`` falls short of it; None: it does not."""
        if isinstance(reply, BaseException):
            return f"{type(reply).__name__}: {reply}"
        if self.aof:
            done = reply[0] if isinstance(reply, list) and reply else 0
            return None if done == 1 else "the write was not fsynced to its append-only file"
        acked = reply if type(reply) is int else 0
        if acked >= self.replicas:
            return None
        return f"the write reached {acked} of the {self.replicas} replicas needed in time"


def durable(wait: Call, replies: Sequence[Reply]) -> bool:
    """Whether a master's replies end with a durability command's (``wait``) that says
    its writes are durable: the vote of a round that may end early counts only then."""
    reply = replies[-1]
    if type(reply) is int:  # WAIT's: the replicas that acknowledged
        return reply >= wait.args[0]  # type: ignore[operator]
    return isinstance(reply, list) and bool(reply) and reply[0] == 1  # WAITAOF's local fsync


def durability(value: object) -> Durability | None:
    """A durability as given: ``None``, ``"replicas:N"`` (N >= 1) or ``"aof"``."""
    if value is None:
        return None
    if value == "aof":
        return Durability(aof=True)
    if isinstance(value, str) and value.startswith("replicas:"):
        count = value[len("replicas:") :]
        if count.isdigit() and int(count) >= 1:
            return Durability(replicas=int(count))
    raise ValueError(f'durability must be None, "replicas:N" (N >= 1) or "aof", not {value!r}')


def per_master(value: object, size: int) -> tuple[Durability | None, ...]:
    """Each master's durability: one for all (see :func:`durability`), or a sequence
    of them, one per master in order."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != size:
            raise ValueError(
                f"durability lists {len(value)} settings for {size} masters: give one per"
                " master, or one for all"
            )
        return tuple(durability(v) for v in value)
    return (durability(value),) * size


def judged(
    wanted: Sequence[Durability | None], masters: Sequence[str], replies: list[list[Reply]]
) -> list[list[Reply]]:
    """A round's replies without the durability commands that ended each master's
    calls; where one fell short, every reply of that master is a failure that says
    why. Raises :class:`DurabilityError` when a master has no such command."""
    out = []
    for want, master, rs in zip(wanted, masters, replies, strict=True):
        if want is None:
            out.append(rs)
            continue
        *own, reply = rs
        if reply is UNREAD:
            out.append(own)  # the round was decided without this master
            continue
        # A server's refusal of the command (matched by name: the core imports no client
        # library): none (before Redis 7.2), or no append-only file to wait for.
        if type(reply).__name__ == "ResponseError":
            raise DurabilityError(
                f'{master} cannot honour durability="{want}" (WAITAOF needs Redis 7.2+ or'
                f" Valkey 8+, and appendonly yes): {reply}"
            )
        why = want.shortfall(reply)
        if why is not None and not any(isinstance(r, BaseException) for r in own):
            failure = DurabilityError(f"{master}: not durable ({want}): {why}")
            own = [failure] * len(own)
        out.append(own)
    return out
