"""Wake-up subscriptions as a state machine (no I/O), driven by both flavours' hubs.

A manager keeps one pub/sub connection per master. This module decides which channels
each of them must hear (the channels local waiters watch, reference-counted, plus the
manager's own "home" channel that keeps a connection from ever having none), what to
(un)subscribe after every change, which masters confirmed a channel, and which release
messages are new: each release is announced once per master under one release id, and
counts once. The sync hub (a thread with a selector) and the asyncio hub (a task per
master) only carry out what it decides, so the two cannot disagree.

The rules that keep the subscriptions right whatever the interleaving:

- the (un)subscribe commands for a master are computed from the state at the moment
  they are sent, by the one place that sends on that master's connection, so a stale
  unsubscribe can never remove a fresh subscription;
- a master that (re)connects subscribes to everything wanted *then*, and any channel
  watched during the connect is sent by the next :meth:`Subscriptions.changes`;
- a channel nobody watches any more is kept until no connected master still has it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

#: how long a master whose pub/sub connection failed is left alone before a retry
RECONNECT_DELAY = 0.5

#: how many recent release ids a channel remembers to drop duplicate wake-ups
RECENT_RELEASES = 32


@dataclass(eq=False)
class Channel:
    """One channel's bookkeeping."""

    #: a release wakes every local waiter (readers), rather than one
    broadcast: bool = False
    refs: int = 0
    #: moves on with every new release: a waiter sleeps until it changes
    generation: int = 0
    confirmed: set[int] = field(default_factory=set)
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT_RELEASES))
    #: the flavour's waiters (a condition, or futures), kept with the channel
    waiters: Any = None

    def accept(self, release_id: str) -> bool:
        """Count a release once, however many masters announce it; True if it is new
        (the generation moved on, and waiters should be woken)."""
        if release_id in self.recent:
            return False
        self.recent.append(release_id)
        self.generation += 1
        return True


def decode_message(message: dict[str, Any]) -> tuple[str, str, str]:
    """A pub/sub message as (type, channel, data) text."""
    out = []
    for part in ("type", "channel", "data"):
        value = message.get(part)
        out.append(value.decode() if isinstance(value, bytes) else str(value))
    return out[0], out[1], out[2]


class Subscriptions:
    """Which channels each of ``size`` masters must hear, and what they said."""

    def __init__(self, size: int, home: str) -> None:
        self.size = size
        self.home = home
        self.channels: dict[str, Channel] = {}
        # What each master's connection was told to hear; None while not connected.
        self._sent: list[set[str] | None] = [None] * size
        #: masters whose connection failed (a waiter does not wait for their word)
        self.failed: set[int] = set()

    # -- the waiters' side --------------------------------------------------------------

    def watch(self, channel: str, broadcast: bool = False) -> Channel:
        """One more waiter wants ``channel``."""
        chan = self.channels.get(channel)
        if chan is None:
            chan = self.channels[channel] = Channel(broadcast=broadcast)
        chan.refs += 1
        return chan

    def unwatch(self, channel: str) -> bool:
        """One waiter less; True when nobody wants ``channel`` any more."""
        chan = self.channels.get(channel)
        if chan is None:
            return False
        chan.refs -= 1
        self._prune()
        return chan.refs <= 0

    def settled(self, chan: Channel) -> bool:
        """Whether every master confirmed ``chan`` or is known to have failed."""
        return all(i in chan.confirmed or i in self.failed for i in range(self.size))

    def waited_on(self, channel: str) -> Channel | None:
        """The channel, if a local waiter watches it."""
        chan = self.channels.get(channel)
        return chan if chan is not None and chan.refs > 0 else None

    # -- the subscriber's side ------------------------------------------------------------

    def wanted(self) -> set[str]:
        return {self.home} | {c for c, chan in self.channels.items() if chan.refs > 0}

    def connected(self, i: int) -> list[str]:
        """Master ``i`` has a new connection: the channels to subscribe it to (home
        first). Its confirmations arrive as messages."""
        wanted = self.wanted()
        self._sent[i] = wanted
        self.failed.discard(i)
        return [self.home, *sorted(wanted - {self.home})]

    def changes(self, i: int) -> tuple[list[str], list[str]]:
        """What to (un)subscribe on master ``i``'s connection now (nothing while it is
        not connected); the state records it as sent."""
        sent = self._sent[i]
        if sent is None:
            return [], []
        wanted = self.wanted()
        add, drop = sorted(wanted - sent), sorted(sent - wanted)
        self._sent[i] = wanted
        for channel in drop:
            chan = self.channels.get(channel)
            if chan is not None:
                chan.confirmed.discard(i)
        self._prune()
        return add, drop

    def live(self, i: int) -> bool:
        return self._sent[i] is not None

    def all_live(self) -> bool:
        return all(sent is not None for sent in self._sent)

    def lost(self, i: int) -> None:
        """Master ``i``'s connection failed: nothing it said counts any more."""
        self._sent[i] = None
        self.failed.add(i)
        for chan in self.channels.values():
            chan.confirmed.discard(i)
        self._prune()

    def on_message(self, i: int, message: dict[str, Any]) -> tuple[Channel | None, bool]:
        """A message from master ``i``: (the channel whose waiters to wake, if a new
        release; whether a subscription was confirmed)."""
        kind, channel, data = decode_message(message)
        chan = self.channels.get(channel)
        if kind == "subscribe" and chan is not None:
            chan.confirmed.add(i)
            self.failed.discard(i)
            return None, True
        if kind == "subscribe" and channel == self.home:
            self.failed.discard(i)
            return None, True
        if kind == "message" and chan is not None and chan.refs > 0 and chan.accept(data):
            return chan, False
        return None, False

    def released_here(self, channel: str, release_id: str) -> Channel | None:
        """A release made in this process: the channel to wake now, if it is new."""
        chan = self.waited_on(channel)
        return chan if chan is not None and chan.accept(release_id) else None

    def _prune(self) -> None:
        for name in [c for c, chan in self.channels.items() if chan.refs <= 0]:
            if not any(sent is not None and name in sent for sent in self._sent):
                del self.channels[name]
