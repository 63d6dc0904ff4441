"""Wake-ups as a state machine (no I/O), driven by both flavours' hubs.

A manager keeps one pub/sub connection per master, always subscribed to the manager's
own "home" channel. A local waiter (an owner) waits on a *channel* that names the lock
it waits for, in one of two ways:

- a **subscribed** channel is subscribed on every master too (while someone here waits
  on it): a release message on it wakes one local waiter, or every one of them on a
  ``broadcast`` channel (readers);
- a **targeted** channel is subscribed nowhere: its waiters are registered on the
  masters, and a release wakes one of them by name, with a message on that waiter's
  home channel (``<release id>\\n<owner>\\n<channel>``). No (un)subscribe per lock.

This module decides which channels each master must hear, what to (un)subscribe after
every change, which masters confirmed a channel (or the home channel), which release
messages are new (a release is announced once per master under one release id, and
counts once), and which local waiters a message, a local release or a relay wakes:
each waiter counts its own wake-ups, and sleeps until that count moves. The sync hub (a
thread with a selector) and the asyncio hub (tasks) only carry out what it decides, so
the two cannot disagree.

The rules that keep the subscriptions right whatever the interleaving:

- the (un)subscribe commands for a master are computed from the state at the moment
  they are sent, by the one place that sends on that master's connection, so a stale
  unsubscribe can never remove a fresh subscription;
- a master that (re)connects subscribes to everything wanted *then*, and any channel
  watched during the connect is sent by the next :meth:`Subscriptions.changes`;
- a channel nobody watches any more is kept until no connected master still has it;
- a targeted wake-up counts once per waiter woken, not once per release: masters that
  disagree on whom a release wakes each took their waiter's place, and each is told;
- a targeted wake-up names its owner, who waits for one thing at a time: it wakes the
  owner's wait whichever of the owner's targeted channels it names (a multi-lock's
  waiter is registered under each of its names);
- a targeted wake-up that comes before its waiter watches (its try registered it a
  moment before), by a master's message or by this manager's own release, is kept for
  it, and a watch made while some master did not yet confirm the home channel counts
  as woken (a wake-up may have been missed): either way the waiter tries again at once
  instead of sleeping;
- when a master's connection comes back, every targeted waiter counts as woken: while
  it was down, that master passed wake-ups over them (nobody heard), taking their
  registrations, so they try again, and register again.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .effects import Handover, Notify
from .keys import home_channel
from .owner import manager_of

#: how long a master whose pub/sub connection failed is left alone before a retry
RECONNECT_DELAY = 0.5

#: how many recent (channel, release id) pairs are remembered to drop duplicate wake-ups
RECENT_RELEASES = 256

#: how many targeted wake-ups for owners not (yet) watching are kept for them
UNCLAIMED = 32


@dataclass(eq=False)
class Waiter:
    """One local waiter (an owner) on one channel."""

    owner: str
    #: wake-ups given to this waiter since it began to watch: it sleeps until this moves
    wakes: int = 0
    refs: int = 0
    #: the flavour's means of waking it while it sleeps (a condition, or a future)
    signal: Any = None
    #: the lock, handed over to it with its last wake-up (taken by its acquire)
    handover: Handover | None = None
    #: a log channel's messages since it last took them: (master, data)
    messages: list[tuple[int, str]] = field(default_factory=list)


@dataclass(eq=False)
class Channel:
    """One channel's bookkeeping."""

    #: a release wakes every local waiter (readers), rather than one
    broadcast: bool = False
    #: subscribed nowhere: the masters wake its waiters by name on the home channel
    targeted: bool = False
    #: every message, from every master, is kept for each waiter (see
    #: :meth:`Subscriptions.take_messages`) and wakes them all
    log: bool = False
    #: the local waiters by owner, the next one to wake first
    waiters: dict[str, Waiter] = field(default_factory=dict)
    #: masters that confirmed the subscription (subscribed channels)
    confirmed: set[int] = field(default_factory=set)


def decode_message(message: dict[str, Any]) -> tuple[str, str, str]:
    """A pub/sub message as (type, channel, data) text."""
    out = []
    for part in ("type", "channel", "data"):
        value = message.get(part)
        out.append(value.decode() if isinstance(value, bytes) else str(value))
    return out[0], out[1], out[2]


def _wake_id(release_id: str, owner: str) -> str:
    """One targeted wake-up: masters that disagree on whom a release wakes each take
    their waiter's place, and every such waiter is told."""
    return f"{release_id}\n{owner}"


def parse_wake(data: str) -> tuple[str, str, str] | None:
    """A targeted wake-up's payload as (release id, owner, channel); None if malformed.
    The channel comes last: a lock name may hold a newline, ids do not."""
    parts = data.split("\n", 2)
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


class Subscriptions:
    """Which channels each of ``size`` masters must hear, what they said, and whom it
    wakes."""

    def __init__(self, size: int, home: str) -> None:
        self.size = size
        self.home = home
        self.channels: dict[str, Channel] = {}
        # What each master's connection was told to hear; None while not connected.
        self._sent: list[set[str] | None] = [None] * size
        #: masters whose connection failed (a waiter does not wait for their word)
        self.failed: set[int] = set()
        #: masters whose connection confirmed the home channel
        self.home_confirmed: set[int] = set()
        # Masters whose connection confirmed the home channel, then failed.
        self._rejoining: set[int] = set()
        self._recent: deque[tuple[str, str]] = deque()
        self._recent_set: set[tuple[str, str]] = set()
        # Targeted wake-ups for owners not watching yet (a try registered them a moment
        # before). Never with a hand-over: the watch that claims one may belong to a
        # later acquire (the one it was meant for may have ended, its hold given back
        # or taken by a try of its own), so its try finds out whether it holds the lock.
        self._unclaimed: OrderedDict[tuple[str, str], bool] = OrderedDict()
        # The targeted channel each waiting owner watches.
        self._targeted_of: dict[str, str] = {}

    # -- the waiters' side --------------------------------------------------------------

    def watch(
        self,
        channel: str,
        owner: str,
        broadcast: bool = False,
        targeted: bool = False,
        log: bool = False,
    ) -> int:
        """``owner`` begins to wait on ``channel``; returns its generation (0 for a
        fresh watch, whose count of wake-ups may already be 1, see the module's rules).
        A ``log`` channel keeps its messages for its waiters (an election's changes)."""
        chan = self.channels.get(channel)
        if chan is None:
            chan = self.channels[channel] = Channel(broadcast or log, targeted, log=log)
        waiter = chan.waiters.get(owner)
        if waiter is None:
            waiter = chan.waiters[owner] = Waiter(owner)
            unclaimed = False
            if chan.targeted:
                self._targeted_of[owner] = channel
                unclaimed = self._claim(channel, owner)
            if chan.targeted and (unclaimed or not self.settled(chan)):
                waiter.wakes = 1
            start = 0
        else:
            start = waiter.wakes
        waiter.refs += 1
        return start

    def unwatch(self, channel: str, owner: str) -> bool:
        """One wait less; True when a subscription nobody wants may be dropped."""
        chan = self.channels.get(channel)
        if chan is None:
            return False
        waiter = chan.waiters.get(owner)
        if waiter is not None:
            waiter.refs -= 1
            if waiter.refs <= 0:
                del chan.waiters[owner]
                if self._targeted_of.get(owner) == channel:
                    del self._targeted_of[owner]
        self._prune()
        return not chan.targeted and not chan.waiters

    def waiter(self, channel: str, owner: str) -> Waiter:
        """A watching owner's waiter (KeyError if it does not watch ``channel``)."""
        return self.channels[channel].waiters[owner]

    def settled(self, chan: Channel) -> bool:
        """Whether every master confirmed what ``chan``'s wake-ups come through (the
        channel, or for a targeted one the home channel), or is known to have failed."""
        confirmed = self.home_confirmed if chan.targeted else chan.confirmed
        return all(i in confirmed or i in self.failed for i in range(self.size))

    def waited_on(self, channel: str) -> Channel | None:
        """The channel, if a local waiter watches it."""
        chan = self.channels.get(channel)
        return chan if chan is not None and chan.waiters else None

    def notified(self, notice: Notify) -> list[Waiter]:
        """A release made in this process freed a lock (the :class:`Notify` effect):
        the local waiters to wake now, on each of its channels (see
        :meth:`released_here`)."""
        handovers = dict(notice.handovers) if notice.handovers else None
        out: list[Waiter] = []
        for channel in notice.channels:
            out += self.released_here(
                channel, notice.release_id, notice.woken, handovers, notice.everyone
            )
        return out

    def released_here(
        self,
        channel: str,
        release_id: str,
        woken: Sequence[str] = (),
        handovers: Mapping[str, Handover] | None = None,
        everyone: bool = False,
    ) -> list[Waiter]:
        """A release made in this process freed a lock: the local waiters to wake now.

        On a targeted channel that is each of ``woken`` (the waiters the masters chose:
        several when the masters disagree) that waits here, and nobody if they all wait
        elsewhere; when the masters chose nobody, one local waiter, as on a subscribed
        channel. A waiter woken here
        gets its entry of ``handovers`` (the lock, handed over to it: the masters send
        no message then); one of ours that does not watch yet gets a wake-up kept for
        its watch (its try then finds the lock its own). ``everyone``
        (some masters' replies were lost, so a hand-over made there is not known here):
        every local waiter, so that the one that may have been handed the lock finds
        it with its next try."""
        chan = self.channels.get(channel)
        if not (chan is not None and chan.waiters) and not handovers and not woken:
            return []
        if not woken and not self._accept(channel, release_id):
            return []
        handovers = handovers or {}
        # Each of ours the masters woke is the only waiter woken where it was, and must
        # be told, once (masters may disagree on whom a release wakes).
        told = [
            owner
            for owner in woken
            if ((chan is not None and owner in chan.waiters) or self._ours(owner))
            and self._accept(channel, _wake_id(release_id, owner))
        ]
        if chan is not None and everyone:
            return self._wake(chan, list(chan.waiters))
        if woken and (chan is None or chan.targeted):
            out: list[Waiter] = []
            for owner in told:
                if chan is not None and owner in chan.waiters:
                    chan.waiters[owner].handover = handovers.get(owner)
                    out += self._wake(chan, [owner])
                elif (watched := self._targeted_of.get(owner)) is not None:
                    out += self._wake(self.channels[watched], [owner])  # another name
                else:
                    # Its try's watch is still to come: keep the wake-up for the watch.
                    self._keep_unclaimed(channel, owner)
            return out
        if chan is None:
            return []
        return self._wake(chan, self._next(chan))

    def take_messages(self, channel: str, owner: str) -> list[tuple[int, str]]:
        """The messages of a log channel that came since ``owner`` last took them, in
        order: (master, data)."""
        chan = self.channels.get(channel)
        waiter = chan.waiters.get(owner) if chan is not None else None
        if waiter is None:
            return []
        messages, waiter.messages = waiter.messages, []
        return messages

    def take_handover(self, channel: str, owner: str) -> Handover | None:
        """The lock, if it was handed over to ``owner`` with its last wake-up on
        ``channel`` (taken: None the next time)."""
        chan = self.channels.get(channel)
        waiter = chan.waiters.get(owner) if chan is not None else None
        if waiter is None:
            return None
        handover, waiter.handover = waiter.handover, None
        return handover

    def relay(self, channel: str, owner: str) -> list[Waiter]:
        """``owner`` was woken but gives up: the other local waiter to wake instead."""
        chan = self.waited_on(channel)
        if chan is None:
            return []
        return self._wake(chan, [o for o in chan.waiters if o != owner][:1])

    # -- the subscriber's side ------------------------------------------------------------

    def wanted(self) -> set[str]:
        subscribed = {c for c, chan in self.channels.items() if chan.waiters and not chan.targeted}
        return {self.home} | subscribed

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
        if i in self.home_confirmed:
            self._rejoining.add(i)
        self.home_confirmed.discard(i)
        for chan in self.channels.values():
            chan.confirmed.discard(i)
        self._prune()

    def on_message(self, i: int, message: dict[str, Any]) -> tuple[list[Waiter], bool]:
        """A message from master ``i``: (the waiters it wakes; whether a subscription
        was confirmed)."""
        kind, channel, data = decode_message(message)
        if kind == "subscribe":
            chan = self.channels.get(channel)
            if channel == self.home:
                self.home_confirmed.add(i)
                self.failed.discard(i)
                if i in self._rejoining:
                    self._rejoining.discard(i)
                    targeted = [c for c in self.channels.values() if c.targeted]
                    return [w for c in targeted for w in self._wake(c, list(c.waiters))], True
                return [], True
            if chan is not None:
                chan.confirmed.add(i)
            else:
                return [], False
            self.failed.discard(i)
            return [], True
        if kind != "message":
            return [], False
        if channel == self.home:
            return self._targeted(data), False
        chan = self.channels.get(channel)
        if chan is not None and chan.log:
            for waiter in chan.waiters.values():
                waiter.messages.append((i, data))
            return self._wake(chan, list(chan.waiters)), False
        if chan is None or chan.targeted or not chan.waiters or not self._accept(channel, data):
            return [], False
        return self._wake(chan, self._next(chan)), False

    # -- inside ------------------------------------------------------------------------

    def _targeted(self, data: str) -> list[Waiter]:
        wake = parse_wake(data)
        if wake is None:
            return []
        release_id, owner, channel = wake
        if not self._accept(channel, _wake_id(release_id, owner)):
            return []  # another master's word on this wake-up already counted
        chan = self.channels.get(channel)
        if chan is None or owner not in chan.waiters:
            watched = self._targeted_of.get(owner)  # the owner waits for another name
            if watched is not None:
                return self._wake(self.channels[watched], [owner])
            # Registered by a try whose watch is still to come: keep it for the watch.
            self._keep_unclaimed(channel, owner)
            return []
        return self._wake(chan, [owner])

    def _ours(self, owner: str) -> bool:
        """Whether ``owner`` belongs to this manager (whose home channel this is)."""
        return home_channel(manager_of(owner)) == self.home

    def _claim(self, channel: str, owner: str) -> bool:
        """Take a wake-up kept for ``owner``: on ``channel``, or on another of its
        names."""
        if self._unclaimed.pop((channel, owner), False):
            return True
        other = next((key for key in self._unclaimed if key[1] == owner), None)
        return other is not None and self._unclaimed.pop(other)

    def _keep_unclaimed(self, channel: str, owner: str) -> None:
        self._unclaimed[(channel, owner)] = True
        while len(self._unclaimed) > UNCLAIMED:
            self._unclaimed.popitem(last=False)

    @staticmethod
    def _next(chan: Channel) -> list[str]:
        """Who a release wakes: every waiter of a broadcast channel, else the next one."""
        owners = list(chan.waiters)
        return owners if chan.broadcast else owners[:1]

    def _wake(self, chan: Channel, owners: list[str]) -> list[Waiter]:
        """Count a wake-up for each of ``owners``; they go last in the order to wake."""
        woken = []
        for owner in owners:
            waiter = chan.waiters.pop(owner)
            waiter.wakes += 1
            chan.waiters[owner] = waiter
            woken.append(waiter)
        return woken

    def _accept(self, channel: str, release_id: str) -> bool:
        """Count a release once, however many masters announce it; True if it is new."""
        key = (channel, release_id)
        if key in self._recent_set:
            return False
        self._recent.append(key)
        self._recent_set.add(key)
        if len(self._recent) > RECENT_RELEASES:
            self._recent_set.discard(self._recent.popleft())
        return True

    def _prune(self) -> None:
        for name in [c for c, chan in self.channels.items() if not chan.waiters]:
            if not any(sent is not None and name in sent for sent in self._sent):
                del self.channels[name]
