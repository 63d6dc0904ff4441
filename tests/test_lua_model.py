"""tests/test_core.py's model of the scripts (its ``Master``) against the real ones.

test_core's scenarios are run (in a process of their own, the sync driver's; the asyncio
driver's send the same calls) with the model recording every call it answers: the
script, keys and arguments, its reply, its state after the call, the fake time, and
whose home channels a subscriber hears; and every change a scenario made to a master's
state directly (an unrecorded one fails the scenario there). Each scenario is then
replayed in order on a real server running lua/*.lua with EVALSHA, a database per
master, a subscriber on exactly the home channels the model says are heard, and each
reply and each state after a call (lock hashes and their leases, the registered waiters
in the order a release wakes them and what is left of each registration, reservations)
compared with the model's, exactly.

Real time does not pass as the fake clock does, so before each event the master's
database is moved in time: the event is given a server millisecond a little ahead, and
every expiry there and every registration's end (a sorted-set score, server ms) is
moved by the difference between that millisecond and the event's fake time (exactly,
by PEXPIRETIME: Redis 7 or later); the absolute times the model was given (a proposed
place, the ends of registrations a scenario set) are moved alike. A call that still ran
late (a busy machine) leaves the times it set that much off: times are then compared
within the lateness so far, and a disagreement found after one replays the scenario
again.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import require_redis_server

from redreentrant._core.keys import MEMORY_KEY, home_channel
from redreentrant._core.scripts import LOCK_SCRIPTS
from redreentrant.testing import LocalServer, redis_server_version

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CORE = Path(__file__).with_name("test_core.py")
#: test_core.py's switch that makes its model record (LOG_ENV there)
LOG_ENV = "REDREENTRANT_MODEL_LOG"
SHAS = {script.name: script.sha for script in LOCK_SCRIPTS}
#: a database per master of a scenario (its worlds' masters together)
DATABASES = 256

#: test-only: wait for the server's millisecond ARGV[1], then move this database's clock
#: on by ARGV[2] ms (back, if negative): every key's expiry moved by it (exactly, by its
#: PEXPIRETIME; a key whose expiry is reached is deleted) and every sorted-set score (a
#: registration's end, server ms) moved back by it. Returns the server's ms after (more
#: than ARGV[1]: the command came late, and the event will be replayed again).
WARP = """
local function ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local now = ms()
while now < tonumber(ARGV[1]) do
  now = ms()
end
local delta = tonumber(ARGV[2])
for _, key in ipairs(redis.call('keys', '*')) do
  if redis.call('type', key)['ok'] == 'zset' then
    local items = redis.call('zrange', key, 0, -1, 'withscores')
    for i = 1, #items, 2 do
      redis.call('zadd', key, string.format('%d', tonumber(items[i + 1]) - delta), items[i])
    end
  end
  local at = redis.call('pexpiretime', key)
  if at > 0 then
    if at - delta <= now then
      redis.call('del', key)
    else
      redis.call('pexpireat', key, at - delta)
    end
  end
end
return ms()
"""
#: test-only: delete every key of type ARGV[1]
DROP = """
for _, key in ipairs(redis.call('keys', '*')) do
  if redis.call('type', key)['ok'] == ARGV[1] then
    redis.call('del', key)
  end
end
return 0
"""
#: test-only: this database's state as the model's ``Master.state`` shows it: each key
#: with its type, content (a sorted set: the registrations not ended, with the ms left of
#: each) and PTTL; and the server's time (ms) once read
DUMP = """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for _, key in ipairs(redis.call('keys', '*')) do
  local kind = redis.call('type', key)['ok']
  local content
  if kind == 'hash' then
    content = redis.call('hgetall', key)
  elseif kind == 'zset' then
    content = redis.call('zrangebyscore', key, '(' .. string.format('%d', now), '+inf',
      'withscores')
    for i = 2, #content, 2 do
      content[i] = tonumber(content[i]) - now
    end
  else
    content = {redis.call('get', key)}
  end
  out[#out + 1] = {key, kind, content, redis.call('pttl', key)}
end
t = redis.call('time')  -- a dump that ran into the next ms (a busy machine) counts late
return {tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)), out}
"""


def time_of(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


class Replay:
    """Replays recorded scenarios on one server; each returns its first disagreement
    with the model (None: none)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.clients: dict[int, redis.Redis] = {}
        self.pubsub = redis.Redis.from_url(url).pubsub()
        self.heard: set[str] = set()
        admin = self.client(0)
        for script in LOCK_SCRIPTS:
            admin.script_load(script.source)
        self.warp, self.drop, self.dump = (admin.script_load(s) for s in (WARP, DROP, DUMP))

    def client(self, db: int) -> redis.Redis:
        if db not in self.clients:
            url = f"{self.url.rsplit('/', 1)[0]}/{db}"
            self.clients[db] = redis.Redis.from_url(url, decode_responses=True)
        return self.clients[db]

    def close(self) -> None:
        self.pubsub.close()
        for client in self.clients.values():
            client.close()

    def listen(self, managers: list[str]) -> None:
        """Subscribe to exactly these managers' home channels (a release that wakes
        one of their waiters publishes to a subscriber), and wait until the server
        confirmed."""
        wanted = {home_channel(m) for m in managers}
        if wanted == self.heard:
            return
        if self.heard - wanted:
            self.pubsub.unsubscribe(*(self.heard - wanted))
        if wanted - self.heard:
            self.pubsub.subscribe(*(wanted - self.heard))
        self.heard = wanted
        admin = self.client(0)
        while set(admin.pubsub_channels()) != wanted:
            while self.pubsub.get_message(timeout=0.01):  # confirmations, messages heard
                pass

    def scenario(self, events: list[dict[str, Any]]) -> str | None:
        """Replay a scenario. A call replayed late (a busy machine: it ran a ms or more
        after the one that stands for its time) leaves the times it set that much off:
        times are then compared within the lateness so far, and a disagreement found
        after one replays the scenario again."""
        problem = None
        for _ in range(5):
            problem, exact = self._replay(events)
            if problem is None or exact:
                return problem
        return f"{problem}\n  (replayed five times, each time some call ran late)"

    def _replay(self, events: list[dict[str, Any]]) -> tuple[str | None, bool]:
        self.client(0).flushall()
        dbs: dict[tuple[int, int], int] = {}
        offsets: dict[int, int] = {}  # per world: virtual ms = fake ms + offset
        warps: dict[int, int] = {}  # per database: virtual ms = server ms + warp
        lateness: dict[int, int] = {}  # per database: the ms its calls ran late, in all
        for index, event in enumerate(events):
            db = dbs.setdefault((event["world"], event["master"]), len(dbs) + 1)
            r = self.client(db)
            if event["kind"] == "call":
                self.listen(event["listening"])
            # The event runs in the server's millisecond `at` (a little ahead: the
            # commands' way there), which is to stand for the event's fake time.
            at = time_of(r) + 2
            fake = math.floor(event["now"] * 1000 + 1e-6)  # ms, as the model counts
            offset = offsets.setdefault(event["world"], at - fake)
            warp = fake + offset - at
            delta, warps[db] = warp - warps.get(db, 0), warp

            def server(fake_ms: int, offset: int = offset, warp: int = warp) -> int:
                """The server time (ms) that stands for a fake time (ms)."""
                return fake_ms + offset - warp

            pipe = r.pipeline(transaction=False)
            pipe.evalsha(self.warp, 0, at, delta)
            self.apply(pipe, event, server)
            pipe.evalsha(self.dump, 0)
            warped, *_, reply, (dumped, keys) = pipe.execute(raise_on_error=False)
            lateness[db] = lateness.get(db, 0) + max(int(warped), int(dumped)) - at
            if event["kind"] != "call":
                continue
            late = lateness[db]
            problem = reply_problem(event["script"], event["reply"], reply, late, server)
            problem = problem or state_problem(event["state"], state_of(keys), late)
            if problem:
                exact = not any(lateness.values())
                return describe(index, event, reply, keys, problem), exact
        return None, True

    def apply(self, pipe: Any, event: dict[str, Any], server: Any) -> None:
        kind = event["kind"]
        if kind == "call":
            args = list(event["args"])
            if event["script"] == "acquire" and len(args) > 5 and int(args[5]):
                args[5] = server(int(args[5]))  # a place: ms since the epoch, fake clock
            keys = event["keys"]
            pipe.evalsha(SHAS[event["script"]], len(keys), *keys, *args)
        elif kind == "hold":
            pipe.delete(event["key"])
            pipe.hset(event["key"], mapping=event["fields"])
            pipe.pexpire(event["key"], event["ttl"])
        elif kind == "waiters":
            ends = {owner: server(end) for owner, end in event["ends"].items()}
            pipe.delete(event["key"])
            now = server(math.floor(event["now"] * 1000 + 1e-6))
            if ends and max(ends.values()) > now:
                pipe.zadd(event["key"], ends)
                pipe.pexpire(event["key"], max(ends.values()) - now)
            else:
                pipe.echo("nothing")
        elif kind == "drop_holds":
            pipe.evalsha(self.drop, 0, "hash")
        elif kind == "drop_reservations":
            pipe.evalsha(self.drop, 0, "string")
        else:
            raise AssertionError(f"unknown event {kind}")


def reply_problem(
    script: str, model: Any, lua: Any, tolerance: int, server: Callable[[int], int]
) -> str | None:
    if isinstance(lua, Exception):
        return f"the script failed: {lua}"
    if script in ("acquire", "renew"):
        # A try's and a renewal's reply end with the server's time (ms): the model's is
        # the fake time, which ``server`` tells in the server's.
        if not isinstance(lua, list) or not lua or not isinstance(model, list) or not model:
            return "replies differ"
        # (A try's is the first of its stamp, whose memory record the model has none of.)
        time = lua[-1][0] if isinstance(lua[-1], list) else lua[-1]
        if abs(server(model[-1]) - time) > tolerance + 1:
            return f"time {server(model[-1])} (model) vs {time} (Lua), tolerance {tolerance} ms"
        model, lua = model[:-1], lua[:-1]
    if script == "acquire" and model[0] == 0 and lua[0] == 0 and model[1] != lua[1]:
        # A refused acquire's pttl: the holder's (or reservation's, or registration's)
        # time left; exact, unless the replay of this call ran late.
        if model[1] > 0 and lua[1] > 0 and abs(model[1] - lua[1]) <= tolerance:
            return None
        return f"pttl {model[1]} (model) vs {lua[1]} (Lua), tolerance {tolerance} ms"
    if model != lua:
        return "replies differ"
    return None


def state_of(keys: list[Any]) -> dict[str, Any]:
    """The dump of a database in the model's ``Master.state`` shape."""
    holds: dict[str, Any] = {}
    waiting: dict[str, list[str]] = {}
    reserved: dict[str, str] = {}
    for key, kind, content, pttl in keys:
        if key == MEMORY_KEY:
            continue  # the master's memory record, which the model does not keep
        if kind == "hash":
            fields = dict(zip(content[::2], content[1::2], strict=True))
            holds[key] = {"fields": fields, "ttl": pttl}
        elif kind == "zset":
            if content:
                pairs = zip(content[::2], content[1::2], strict=True)
                waiting[key] = [[owner, int(left)] for owner, left in pairs]
        elif kind == "string":
            reserved[key] = [content[0], pttl]
    return {"holds": holds, "waiting": waiting, "reserved": reserved}


def state_problem(model: dict[str, Any], lua: dict[str, Any], tolerance: int) -> str | None:
    if {k: v["fields"] for k, v in model["holds"].items()} != {
        k: v["fields"] for k, v in lua["holds"].items()
    }:
        return "lock hashes differ"
    for key, hold in model["holds"].items():
        if abs(hold["ttl"] - lua["holds"][key]["ttl"]) > tolerance:
            return f"{key}: lease left {hold['ttl']} (model) vs {lua['holds'][key]['ttl']} ms"
    for name in ("waiting", "reserved"):
        # the owners exactly (the registered waiters in the order a release wakes them),
        # the ms left of each within the tolerance
        if not same_owners_and_times(model[name], lua[name], tolerance):
            return f"{'registered waiters' if name == 'waiting' else 'reservations'} differ"
    return None


def same_owners_and_times(model: dict[str, Any], lua: dict[str, Any], tolerance: int) -> bool:
    if model.keys() != lua.keys():
        return False
    for key, ours in model.items():
        theirs = lua[key]
        pairs = [ours] if isinstance(ours[0], str) else ours  # a reservation: one pair
        others = [theirs] if isinstance(theirs[0], str) else theirs
        if [o for o, _ in pairs] != [o for o, _ in others]:
            return False
        if any(abs(a - b) > tolerance for (_, a), (_, b) in zip(pairs, others, strict=True)):
            return False
    return True


def describe(index: int, event: dict[str, Any], reply: Any, keys: Any, problem: str) -> str:
    lines = [f"event {index} on master {event['master']} (world {event['world']}): {problem}"]
    if event["kind"] == "call":
        lines += [
            f"  {event['script']} KEYS={event['keys']} ARGV={event['args']}",
            f"  listening: {event['listening']}",
            f"  model reply: {event['reply']!r}",
            f"  Lua reply:   {reply!r}",
            f"  model state after: {json.dumps(event['state'], sort_keys=True)}",
            f"  Lua state after:   {json.dumps(state_of(keys), sort_keys=True)}",
        ]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """test_core's scenarios, recorded by a run of them (the sync driver's: the asyncio
    driver's send the same calls)."""
    log = tmp_path_factory.mktemp("model") / "model.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(CORE)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, LOG_ENV: str(log)},
        cwd=CORE.parent.parent,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    scenarios = [json.loads(line) for line in log.read_text().splitlines()]
    return [s for s in scenarios if "[asyncio" not in s["scenario"]]


@pytest.fixture(scope="module")
def replay() -> Iterator[Replay]:
    binary = require_redis_server("the model's replay")
    if redis_server_version(binary) < (7, 0, 0):
        pytest.skip("the replay moves expiries by PEXPIRETIME: Redis 7 or later")
    with LocalServer(binary=binary, extra_args=["--databases", str(DATABASES)]) as server:
        replaying = Replay(server.url)
        try:
            yield replaying
        finally:
            replaying.close()


def test_the_model_answers_every_recorded_call_as_the_scripts_do(
    recorded: list[dict[str, Any]], replay: Replay
) -> None:
    calls = sum(e["kind"] == "call" for s in recorded for e in s["events"])
    scripts = {e["script"] for s in recorded for e in s["events"] if e["kind"] == "call"}
    # The record is the one expected: most of test_core's scenarios, every script the
    # model stands for, thousands of calls.
    assert len(recorded) >= 40 and calls >= 2000, (len(recorded), calls)
    assert scripts == {"acquire", "release", "renew"}
    disagreements = {}
    for scenario in recorded:
        problem = replay.scenario(scenario["events"])
        if problem is not None:
            disagreements[scenario["scenario"]] = problem
    assert not disagreements, "the model and the scripts disagree:\n" + "\n\n".join(
        f"{name}\n{problem}" for name, problem in disagreements.items()
    )
