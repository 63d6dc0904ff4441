-- name: acquire
-- version: 9
-- Takes a free exclusive lock, or re-enters it, as a hash owner -> hold, where a hold
-- is '<count>:<tag>': its hold count and the tag of the try that made it (a number
-- that grows with every try of the owner's process; a value without ':<tag>' has tag
-- 0). Nothing sent for one try changes a hold made by a later one, however late it
-- comes: a first hold (count 1) takes over the owner's own hold of a smaller tag (an
-- earlier try's, left behind) and is refused where the owner's hold has a greater
-- tag; a re-entry (count > 1) changes only the hold of its own tag.
-- The key is created only by a first hold (count 1): a re-entry whose hold is gone
-- is refused, so a lost lease is never silently taken again under an old count.
-- A free lock that a release reserved for the waiter it woke (KEYS[3], see
-- release.lua) is granted to that waiter only, until the reservation ends: the
-- releasing owner coming straight back must not take it from under the waiter.
-- A refused first hold may register its owner as a waiter in KEYS[2], for ARGV[4] ms
-- (server time), keeping its place when already registered: a release then wakes the
-- registered waiters one at a time, in the order their registrations end (see
-- release.lua). A grant keeps the owner's registration, where it has one, until its
-- final release (or abandon) ends it: a try granted here but not by a quorum (a split
-- vote, undone) keeps its place in the same order on every master, which the masters
-- then agree on whom to wake next. KEYS[2] lives exactly as long as its last
-- registration, and is gone once it holds none.
-- A polite first hold (ARGV[5] > 0: an owner whose release just woke a waiter, on
-- several masters, where nothing is reserved) is refused, although the lock is free,
-- while another owner is registered: the waiter woken keeps its place until it takes
-- the lock (release.lua), so it goes first however long it takes to come, up to
-- ARGV[5] ms; the polite owner registers behind the others.
-- A registration's end may be proposed by the owner (ARGV[6], by its own clock, the
-- same in every try of one acquire and on every master): the masters then order their
-- waiters alike, whatever order the tries reached them in. It is taken only when it
-- lies after the server's time and at most PLACE_SKEW_MS beyond now + ARGV[4] (the
-- clocks roughly agree); otherwise the registration ends at now + ARGV[4].
-- KEYS[1]  the lock hash
-- KEYS[2]  zset of registered waiters: owner -> end of its registration (server ms)
-- KEYS[3]  the reservation: the owner id a release woke, with a short PTTL
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds: the key's PTTL after a grant
-- ARGV[3]  the hold to record on a grant: '<count>:<tag>' (count 1 takes the lock,
--          >1 re-enters)
-- ARGV[4]  ms the owner stays registered as a waiter if refused (0: do not register;
--          a re-entry never registers)
-- ARGV[5]  (optional) polite: the most ms a free lock is left to the registered
--          waiters; '0' or absent: not polite
-- ARGV[6]  (optional) the proposed end of the owner's registration, in ms since the
--          epoch; '0' or absent: none (ARGV[5] is then sent as '0' when not polite)
-- Reply    {1, count, stamp} granted; {0, pttl, stamp} refused: pttl is the holder's
--          remaining lease in ms (or what is left of the reservation that refused it,
--          or of the first other registration that refused a polite hold, at most
--          ARGV[5]), or -2 when the key is absent (a re-entry whose hold is gone);
--          stamp is {time, age, failover}: the server's time in ms and its memory
--          record (see stamp below)
local PLACE_SKEW_MS = 1000
local count, tag = string.match(ARGV[3], '^(%d+):?(%d*)$')
count, tag = tonumber(count), tonumber(tag) or 0
local polite = tonumber(ARGV[5] or '0')
local free = false
local pttl = -2
local now = nil
local function server_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- The try's stamp: {time, age, failover}: the server's time in ms, and this master's
-- memory record (the hash 'redreentrant:v1:memory': when its current memory began, in
-- server ms, the server's previous replication id then, and whether it began with a
-- failover). The record is made now when missing (a restart without persistence,
-- FLUSHALL, FLUSHDB, eviction), and begun anew, as a failover, when this server was
-- promoted from a replica since (a promotion sets its previous replication id,
-- master_replid2, to the one it replicated: another than the record's, not zeros); a
-- restart that kept the data keeps it. age: ms since the memory began. {time} alone on a Redis Cluster node, where the record
-- would lie outside the lock's hash slot. (A server that denies scripts INFO keeps
-- the record, but a failover there looks like a restart that kept the data.)
local function stamp(now)
  local function info(section)
    local text = redis.pcall('info', section)
    return type(text) == 'string' and text or ''
  end
  if string.find(info('cluster'), 'cluster_enabled:1', 1, true) then
    return {now}
  end
  local id2 = string.match(info('replication'), 'master_replid2:(%w+)') or ''
  local memory = 'redreentrant:v1:memory'
  local kept = redis.call('hmget', memory, 'began', 'replid2', 'failover')
  local began, failover = tonumber(kept[1]), tonumber(kept[3]) or 0
  if not began or (kept[2] ~= id2 and string.find(id2, '[^0]')) then
    failover = began and 1 or 0
    began = now
    redis.call('hset', memory, 'began', began, 'replid2', id2, 'failover', failover)
  elseif kept[2] ~= id2 then
    redis.call('hset', memory, 'replid2', id2)
  end
  return {now, now - began, failover}
end
-- The owner's own hold here, if any: the tag of the try that made it.
local mine = redis.call('hget', KEYS[1], ARGV[1])
if mine then
  mine = tonumber(string.match(mine, ':(%d+)$')) or 0
end
if count == 1 and not mine and redis.call('exists', KEYS[1]) == 0 then
  local reserved = redis.call('get', KEYS[3])
  if reserved and reserved ~= ARGV[1] then
    pttl = redis.call('pttl', KEYS[3])
  else
    free = true
    if polite > 0 and redis.call('exists', KEYS[2]) == 1 then
      now = server_ms()
      redis.call('zremrangebyscore', KEYS[2], '-inf', now)
      local first = redis.call('zrange', KEYS[2], 0, 1, 'withscores')
      for i = 1, #first, 2 do
        if first[i] ~= ARGV[1] then
          free = false
          pttl = math.max(1, math.min(polite, tonumber(first[i + 1]) - now))
          break
        end
      end
    end
    if free and reserved then
      redis.call('del', KEYS[3])
    end
  end
end
if free or (mine and (mine == tag or (count == 1 and mine < tag))) then
  redis.call('hset', KEYS[1], ARGV[1], ARGV[3])
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, count, stamp(now or server_ms())}
end
if pttl == -2 then
  pttl = redis.call('pttl', KEYS[1])
end
local wait = tonumber(ARGV[4])
if count == 1 and wait > 0 and not mine then
  now = now or server_ms()
  redis.call('zremrangebyscore', KEYS[2], '-inf', now)
  local ends = now + wait
  local place = tonumber(ARGV[6] or '0')
  if place > now and place <= ends + PLACE_SKEW_MS then
    ends = place
  end
  -- NX: a waiter that tries again keeps its place (and its registration's end); once
  -- that end passed it was purged above, and registers anew at the back.
  redis.call('zadd', KEYS[2], 'NX', ends, ARGV[1])
  local last = redis.call('zrange', KEYS[2], -1, -1, 'withscores')
  redis.call('pexpire', KEYS[2], math.max(1, tonumber(last[2]) - now))
end
return {0, pttl, stamp(now or server_ms())}
