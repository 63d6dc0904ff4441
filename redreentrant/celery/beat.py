"""One beat at a time: :class:`LeaderScheduler`, a Celery beat scheduler on an election.

``celery beat -S redreentrant.celery.LeaderScheduler`` may run in any number of
processes, on any number of hosts: they campaign in one election (its name
``app.conf.redreentrant_beat_name``, default ``"celery-beat"``, on the masters of
:func:`~redreentrant.celery.manager_for`), and only the leader sends due tasks. The
others wait in line, woken by the election (the leader's resignation, or the end of its
lease), and one of them takes over within about one lease when the leader dies, at once
when it stops cleanly (``close()`` resigns).

Each entry's schedule state (``last_run_at`` and ``total_run_count``) is kept in Redis,
so a new leader goes on where the old one stopped. It lives on ONE Redis server,
``app.conf.redreentrant_beat_store`` (a URL), by default the first URL of
``app.conf.redreentrant_masters``, under these keys (``NAME`` is the election's name;
they share the hash tag ``{NAME}``)::

    redreentrant:celery-beat:{NAME}:term         the largest term that wrote (FencedStore's)
    redreentrant:celery-beat:{NAME}:leader       JSON: the last leader's value and term
    redreentrant:celery-beat:{NAME}:entry:ENTRY  JSON: last_run_at (ISO 8601),
                                                 total_run_count, term

None of them expires; the key of an entry removed from the schedule is left behind
(delete it by hand if you like). All are written through :class:`~redreentrant.FencedStore`
with the leader's term, so a deposed leader's writes are refused.

What is promised, under the assumptions of the election (see docs/leader-election.md):

- **At most one send per due time.** A new leader first writes its term to the store
  (refusing every later write of an older leader), then reads each entry's state. Before
  each send the leader writes that entry's new state with its term; a refused write means
  a later leader took over, and the entry is not sent (this beat stops leading and
  campaigns again). A leader whose leadership was found lost (``ensure_held()``) sends
  nothing more. Write, then send: a leader killed between the two misses that one send.
- **Takeover.** Within about one lease after the leader dies; at once after a clean stop.
  The leader ticks at least every third of a lease (``max_interval`` is at most
  ``lease / 3``), so it notices a lost leadership well within a lease.
- **Missed runs.** Due times that passed while nobody led are sent once when the next
  leader takes over, as celery beat does after a restart (not once per missed time).

What is not promised:

- The state is on one Redis server: while it cannot be reached, no entry is sent (each
  such send is skipped, as a missed run); if it loses its data, entries start again from
  celery's defaults (and a leader whose marker is refused raises the election's fence
  past the store's term, then campaigns again).
- A send is a message to the broker, not a task run: at most once per due time holds
  for what beat sends, not for what the workers do with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from datetime import datetime
from typing import Any

import redis
from celery.beat import Scheduler
from celery.utils.log import get_logger

from redreentrant import Election, FencedStore, LockError, LockTimeoutError

from .manager import ManagerSource, manager_for

logger = get_logger(__name__)

#: the election's name when ``app.conf.redreentrant_beat_name`` is not set
DEFAULT_NAME = "celery-beat"


def state_key(name: str, part: str) -> str:
    """The store's key ``part`` (``term``, ``leader``, ``entry:<entry name>``) of the
    election ``name``."""
    return f"redreentrant:celery-beat:{{{name}}}:{part}"


class LeaderScheduler(Scheduler):  # type: ignore[misc]
    """A beat scheduler that sends due tasks only while it leads the election, and keeps
    each entry's schedule state in Redis, fenced by its term (see the module's doc).

    ``manager``: a :class:`~redreentrant.LockManager` (or what makes one) instead of the
    one :func:`~redreentrant.celery.manager_for` makes from the app's configuration.
    """

    def __init__(self, *args: Any, manager: ManagerSource | None = None, **kwargs: Any) -> None:
        # Set before the base's __init__, which calls setup_schedule() unless lazy.
        self._given = manager
        self._election: Election | None = None
        self._term: int | None = None
        self._campaigning = False
        self._client: redis.Redis | None = None
        super().__init__(*args, **kwargs)

    # -- celery's hooks -----------------------------------------------------------------

    def setup_schedule(self) -> None:
        """The schedule from the app's configuration (celery's defaults for each entry's
        state until this beat leads), the election, and the store's client."""
        super().setup_schedule()
        manager = manager_for(self.app, self._given)
        self._client = redis.Redis.from_url(
            store_url(self.app), socket_timeout=manager.lease / 3, socket_connect_timeout=5
        )
        self._election = manager.election(self.name, owner=self)
        self.max_interval: float = min(float(self.max_interval), manager.lease / 3)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass of beat's loop. Not leading: campaign for at most ``max_interval``
        seconds (woken by the election), and return 0 (campaign again at once) or, after
        an error, ``max_interval``. Leading: celery's tick, which sends at most one due
        entry through :meth:`apply_entry`."""
        if self._term is not None and not self._held():
            self._step_down("its leadership was lost")
        if self._term is None:
            pause = self._campaign()
            if self._term is None:
                return pause
        return float(super().tick(*args, **kwargs))

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        """Send ``entry`` if this beat still leads and the store accepted the entry's new
        state (``reserve()`` moved it) with this beat's term; else send nothing (and stop
        leading when the store refused it: a later leader wrote)."""
        if self._term is None or not self._held():
            self._step_down("its leadership was lost")
            return
        state = self.schedule.get(entry.name, entry)
        try:
            written = self._store(f"entry:{entry.name}").write(self._term, _dump(state, self._term))
        except redis.RedisError as error:
            logger.error("beat: %s not sent: its state could not be stored: %r", entry.name, error)
            return
        if not written:
            self._step_down(f"the store refused term {self._term} (a later leader wrote)")
            return
        super().apply_entry(entry, producer=producer)

    def close(self) -> None:
        """Celery's close, then resign (a follower takes over at once) and close the
        store's connections (reopened if the scheduler is used again). Inside a campaign
        (celery's SIGTERM handler runs ``close()`` wherever the main thread is), the
        resignation is left to the ``close()`` that follows once the campaign unwound."""
        try:
            super().close()
        finally:
            if not self._campaigning:
                self._resign()
                if self._client is not None:
                    self._client.close()

    @property
    def name(self) -> str:
        """The election's name: ``app.conf.redreentrant_beat_name``, default
        ``"celery-beat"``."""
        return str(self.app.conf.get("redreentrant_beat_name") or DEFAULT_NAME)

    @property
    def info(self) -> str:
        return f"    . election -> {self.name}"

    @property
    def term(self) -> int | None:
        """The term this beat leads with, None while it does not lead (local knowledge:
        set on taking over, cleared as soon as a loss or a refused write is seen)."""
        return self._term

    # -- leadership -----------------------------------------------------------------------

    @property
    def _value(self) -> str:
        """What this beat proclaims as leader: its host and pid (taken when asked, so
        a process that forked after the scheduler was made names itself)."""
        return f"{socket.gethostname()}:{os.getpid()}"

    def _campaign(self) -> float:
        """Campaign for at most ``max_interval`` seconds; on winning, take over. Returns
        the pause before the next tick."""
        election = self._required_election()
        self._campaigning = True
        try:
            election.campaign(value=self._value, timeout=self.max_interval)
            term = election.term
        except LockTimeoutError:
            return 0.0
        except LockError as error:
            logger.error("beat: could not campaign for %s: %r", self.name, error)
            return float(self.max_interval)
        finally:
            self._campaigning = False
        return self._take_over(election, term)

    def _take_over(self, election: Election, term: int) -> float:
        """Write the marker with ``term`` (older leaders' writes are refused from now on),
        then load every entry's state. Returns the pause before the next tick."""
        marker = self._store("leader")
        try:
            if not marker.write(term, json.dumps({"leader": self._value, "term": term})):
                stored = marker.largest_token() or 0
                logger.error(
                    "beat: term %d of %s is older than the store's (%d): raising the"
                    " election's fence past it and campaigning again",
                    term, self.name, stored,
                )  # fmt: skip
                self._resign()
                election.raise_fence(stored)
                return 0.0
            self._load(term)
        except (redis.RedisError, LockError) as error:
            logger.error("beat: could not take over %s: %r", self.name, error)
            self._resign()
            return float(self.max_interval)
        self._term = term
        self._heap = None  # rebuilt from the loaded state at the next tick
        logger.info("beat: leading %s with term %d", self.name, term)
        return 0.0

    def _load(self, term: int) -> None:
        """Each entry's state from the store (an entry without one keeps its own)."""
        for name, entry in self.schedule.items():
            raw = self._store(f"entry:{name}").read()
            if raw is None:
                continue
            try:
                state = json.loads(raw)
                last_run_at = datetime.fromisoformat(state["last_run_at"])
                total_run_count = int(state["total_run_count"])
            except (ValueError, KeyError, TypeError) as error:
                logger.warning("beat: the stored state of %s is unreadable: %r", name, error)
                continue
            entry.last_run_at = last_run_at
            entry.total_run_count = total_run_count
        logger.debug("beat: loaded the schedule's state for term %d", term)

    def _held(self) -> bool:
        """Whether this beat's leadership is still held (local: no round trip)."""
        try:
            self._required_election().ensure_held()
        except LockError:
            return False
        return True

    def _step_down(self, why: str) -> None:
        """Stop leading at once (nothing more is sent), and resign what is left."""
        if self._term is not None:
            logger.warning("beat: no longer leading %s: %s", self.name, why)
        self._resign()

    def _resign(self) -> None:
        """Give up leadership if this beat holds it (a lost one included)."""
        self._term = None
        self._heap = None
        election = self._election
        if election is None:
            return
        with contextlib.suppress(LockError):  # not leading, or lost meanwhile
            election.resign()

    # -- the store ------------------------------------------------------------------------

    def _store(self, part: str) -> FencedStore:
        if self._client is None:
            raise RuntimeError("the scheduler was made lazy: no schedule set up")
        term_key = state_key(self.name, "term")
        return FencedStore(self._client, state_key(self.name, part), token_key=term_key)

    def _required_election(self) -> Election:
        if self._election is None:
            raise RuntimeError("the scheduler was made lazy: no schedule set up")
        return self._election


def store_url(app: Any) -> str:
    """The URL of the Redis that keeps the beat's state: ``app.conf.redreentrant_beat_store``,
    else the first of ``app.conf.redreentrant_masters``; ``ValueError`` when neither is
    set (a manager given by other means names no store)."""
    url = app.conf.get("redreentrant_beat_store")
    if url:
        return str(url)
    masters = app.conf.get("redreentrant_masters")
    first = next(iter(masters)) if masters else None
    if isinstance(first, str) and first.startswith(("redis://", "rediss://", "unix://")):
        return first
    raise ValueError(
        "no Redis for the beat's schedule state: set app.conf.redreentrant_beat_store"
        " (a Redis URL), or app.conf.redreentrant_masters (its first URL is used)"
    )


def _dump(entry: Any, term: int) -> str:
    """An entry's state as the store keeps it (JSON)."""
    return json.dumps(
        {
            "last_run_at": entry.last_run_at.isoformat(),
            "total_run_count": entry.total_run_count,
            "term": term,
        }
    )
