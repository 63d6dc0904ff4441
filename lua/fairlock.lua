-- name: fairlock
-- version: 7
-- The fair lock: reentrant like the plain lock, but granted in order of arrival.
-- Waiters queue in KEYS[2] with a deadline each in KEYS[3] (server time, ms): a waiter
-- stays queued while it keeps its deadline fresh. A head of the queue past its deadline
-- (it died or gave up) is purged by every call, so a dead waiter holds up the queue by
-- at most its deadline. A release wakes only the head, on its own channel. The holder
-- stays at the head of the queue until it releases.
-- Each place in the queue carries the ticket of the acquire that took it (KEYS[4]): an
-- owner that got the lock, released it and queued again is a new arrival, which a
-- yield meant for its earlier place must not put ahead of anyone.
-- An election is a fair lock with a leader record, KEYS[5]: a hash of one field, the
-- leader's owner id -> "<term>\n<seq>\n<the leader's own part>", living as long as
-- the lock's hold (seq counts the leader's proclaims within its term, from 1). Each
-- change is published on the channel of the record's own name: "<owner>\n<pttl>\n
-- <record>" when the record is written (pttl: what the hold has left), "<owner>\n-1\n
-- <record>" when it ends.
--
-- KEYS[1]  hash: owner -> hold, '<count>:<tag>' (PTTL = the holder's lease; see
--          acquire.lua: nothing sent for one try changes a hold made by a later one)
-- KEYS[2]  list: waiting owners, first come first
-- KEYS[3]  zset: waiting owner -> its deadline (server ms)
-- KEYS[4]  hash: waiting owner -> the ticket of the acquire that queued it
-- KEYS[5]  (an election only) hash: the leader record
-- ARGV[1]  the operation; the rest depends on it:
--   acquire  ARGV[2] owner, ARGV[3] lease ms, ARGV[4] the hold to record,
--            '<count>:<tag>' (count 1 takes, >1 re-enters the hold of that tag),
--            ARGV[5] ms the waiter stays queued (0: do not queue), ARGV[6] the
--            acquire's ticket (the same in each of its tries; '' none)
--            Reply {1, count, stamp} granted; {0, ms, head, ticket, stamp} refused, ms =
--            when a retry may succeed (-2: a re-entry whose hold is gone), head = the
--            queue's head here ('' when none), ticket = the head's ticket ('' none);
--            stamp = {time, age, failover}: the server's time in ms and its
--            memory record (see stamp below)
--   release  ARGV[2] owner, ARGV[3] the hold left, '<count>:<tag>' (a count above 0
--            is set on the hold of that tag only; 0 frees a hold of that tag or a
--            smaller one), ARGV[4] prefix of the
--            waiters' channels (the head's owner id is appended), ARGV[5] release id,
--            ARGV[6] '1' to leave the queue too when the hold ends (a try that reached
--            this master too late to count may have queued the owner), '0' to keep the
--            place (undoing a try that failed elsewhere, while still waiting). A hold
--            that ends ends its leader record too.
--            Reply 1 still held; 0 the hold is gone; -1 the owner held nothing here
--   abandon  ARGV[2] owner, ARGV[3] channel prefix, ARGV[4] release id: leave the queue
--            (and wake the next head if the lock is free). Reply 0
--   yield    ARGV[2] owner, ARGV[3] another waiter, ARGV[4] channel prefix, ARGV[5]
--            release id, ARGV[6] the other waiter's ticket (as a refusal replied it):
--            if the owner is queued ahead of the other waiter here, and the other
--            waiter's place is still the one of that ticket, move the owner to just
--            behind it, and wake the new head if the lock is free. Masters that saw
--            two arrivals in different orders each grant a different head (a split
--            vote, again and again); yielding to the head of the most masters settles
--            one order. Reply 1 moved, 0 not
--   force    ARGV[2] channel prefix, ARGV[3] release id. Reply 1 deleted, 0 none
--   probe    (after purging dead heads) Reply {pttl, {owner, count, ...}, {waiter, ...},
--            {leader, record}} (the last: an election's, empty when none)
--   proclaim ARGV[2] owner, ARGV[3] its term, ARGV[4] its own part of the record,
--            ARGV[5] the tag of its hold: where the owner holds the lock with that
--            tag, its record replaces the leader record. Reply 1 written, 0 not held
--   renew    KEYS pairs (a lock, its leader record), ARGV[2] lease ms, ARGV[1+2i] the
--            owner of the i-th pair and ARGV[2+2i] its hold, '<count>:<tag>' (count 0:
--            renew only): the lock's and the record's PTTL are reset where the owner
--            holds the lock with that tag; where the lock is free, the owner takes it
--            again. Reply array: 1 renewed, 2 taken again, 0 not held there; then the
--            server's time in ms
-- A KEYS[1] that is not a hash is refused with a WRONGTYPE error (nothing changes).

local op = ARGV[1]

-- A hold '<count>:<tag>' (see acquire.lua): its count and its tag (0 for none).
local function parse(hold)
  local count, tag = string.match(hold, '^(%d+):?(%d*)$')
  return tonumber(count), tonumber(tag) or 0
end

-- The tag of the owner's hold of ``hash`` (a pcall: nil for a key that is not a hash).
local function tag_in(hash, owner)
  local hold = redis.pcall('hget', hash, owner)
  if type(hold) ~= 'string' then return nil end
  local _, tag = parse(hold)
  return tag
end

if op == 'renew' then
  local out = {}
  for i = 1, #KEYS / 2 do
    local lock, record = KEYS[2 * i - 1], KEYS[2 * i]
    local owner, hold = ARGV[1 + 2 * i], ARGV[2 + 2 * i]
    local count, tag = parse(hold)
    out[i] = 0
    if tag_in(lock, owner) == tag then
      redis.call('pexpire', lock, ARGV[2])
      if redis.call('hexists', record, owner) == 1 then
        redis.call('pexpire', record, ARGV[2])
      end
      out[i] = 1
    elseif count > 0 and redis.call('exists', lock) == 0 then
      redis.call('hset', lock, owner, hold)
      redis.call('pexpire', lock, ARGV[2])
      out[i] = 2
    end
  end
  local t = redis.call('time')
  out[#out + 1] = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return out
end

local hash, queue, deadlines, tickets, record = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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

local kind = redis.call('type', hash)['ok']
if kind ~= 'none' and kind ~= 'hash' then
  return redis.error_reply('WRONGTYPE lock key holds a ' .. kind)
end

-- Drop heads past their deadline; keep the queue keys as long as their last deadline.
local function purge()
  while true do
    local head = redis.call('lindex', queue, 0)
    if not head then break end
    local deadline = redis.call('zscore', deadlines, head)
    if deadline and tonumber(deadline) > now then break end
    redis.call('lpop', queue)
    redis.call('zrem', deadlines, head)
    redis.call('hdel', tickets, head)
  end
  local last = redis.call('zrange', deadlines, -1, -1, 'withscores')
  if #last > 0 then
    local ttl = math.max(1, tonumber(last[2]) - now)
    redis.call('pexpire', queue, ttl)
    redis.call('pexpire', deadlines, ttl)
    redis.call('pexpire', tickets, ttl)
  else
    redis.call('del', queue, deadlines, tickets)
  end
  return redis.call('lindex', queue, 0)
end

local function leave(owner)
  if redis.call('zrem', deadlines, owner) == 1 then
    redis.call('lrem', queue, 0, owner)
    redis.call('hdel', tickets, owner)
  end
end

-- An election's leader record ends with the leader's hold (any leader's, for nil):
-- deleted and announced.
local function unrecord(owner)
  if not record then
    return
  end
  local fields = redis.call('hgetall', record)
  if #fields > 0 and (owner == nil or fields[1] == owner) then
    redis.call('del', record)
    redis.call('publish', record, fields[1] .. '\n-1\n' .. fields[2])
  end
end

local function wake_head(prefix, id)
  local head = purge()
  if head and redis.call('exists', hash) == 0 then
    redis.call('publish', prefix .. head, id)
  end
end

if op == 'probe' then
  purge()
  local leader = {}
  if record then
    leader = redis.call('hgetall', record)
  end
  return {redis.call('pttl', hash), redis.call('hgetall', hash),
          redis.call('lrange', queue, 0, -1), leader}
end

if op == 'force' then
  local existed = redis.call('exists', hash)
  redis.call('del', hash)
  unrecord(nil)
  wake_head(ARGV[2], ARGV[3])
  return existed
end

if op == 'abandon' then
  leave(ARGV[2])
  wake_head(ARGV[3], ARGV[4])
  return 0
end

local owner = ARGV[2]

if op == 'proclaim' then
  if tag_in(hash, owner) ~= tonumber(ARGV[5]) then
    return 0
  end
  local seq = 1
  local old = redis.call('hget', record, owner)
  if old then
    local term, n = string.match(old, '^(%d+)\n(%d+)\n')
    if term == ARGV[3] then
      seq = tonumber(n) + 1
    end
  end
  local value = ARGV[3] .. '\n' .. seq .. '\n' .. ARGV[4]
  local pttl = math.max(1, redis.call('pttl', hash))
  redis.call('del', record)
  redis.call('hset', record, owner, value)
  redis.call('pexpire', record, pttl)
  redis.call('publish', record, owner .. '\n' .. pttl .. '\n' .. value)
  return 1
end

if op == 'yield' then
  local other = ARGV[3]
  -- A place the other waiter took since (it got the lock and queued again: a new
  -- arrival, now behind the owner) is not the one the owner yields to.
  if (redis.call('hget', tickets, other) or '') ~= (ARGV[6] or '') then
    return 0
  end
  local mine, theirs
  for i, waiter in ipairs(redis.call('lrange', queue, 0, -1)) do
    if waiter == owner then mine = i end
    if waiter == other then theirs = i end
  end
  if mine and theirs and mine < theirs then
    redis.call('lrem', queue, 1, owner)
    redis.call('linsert', queue, 'after', other, owner)
    wake_head(ARGV[4], ARGV[5])
    return 1
  end
  return 0
end

if op == 'release' then
  local left, tag = parse(ARGV[3])
  local mine = tag_in(hash, owner)
  local held = mine ~= nil and mine <= tag and (left == 0 or mine == tag)
  if ARGV[6] == '1' and (left == 0 or not held) then
    leave(owner)
  end
  if not held then
    return -1
  end
  if left > 0 then
    redis.call('hset', hash, owner, ARGV[3])
    return 1
  end
  redis.call('hdel', hash, owner)
  unrecord(owner)
  wake_head(ARGV[4], ARGV[5])
  return 0
end

-- op == 'acquire'
local lease, wait = tonumber(ARGV[3]), tonumber(ARGV[5])
local count, tag = parse(ARGV[4])
local head = purge()
local mine = tag_in(hash, owner)
if mine == tag or (mine and count == 1 and mine < tag)
    or (count == 1 and not mine and redis.call('exists', hash) == 0
        and (not head or head == owner)) then
  -- The holder keeps its place at the head until its release: if this grant turns out
  -- to be a split (no quorum) and is undone, it must not lose its turn.
  redis.call('hset', hash, owner, ARGV[4])
  redis.call('pexpire', hash, lease)
  return {1, count, stamp(now)}
end
if count > 1 or mine then
  -- A re-entry whose hold is gone, or a try of this owner's that a later one overtook.
  return {0, -2, '', '', stamp(now)}
end
if wait > 0 then
  if not redis.call('zscore', deadlines, owner) then
    redis.call('rpush', queue, owner)
  end
  redis.call('zadd', deadlines, now + wait, owner)
  redis.call('hset', tickets, owner, ARGV[6] or '')
  head = purge()
end
-- Retry when the holder's lease ends, or when a head that is not us would be purged.
local retry = redis.call('pttl', hash)
if head and head ~= owner then
  local until_purge = tonumber(redis.call('zscore', deadlines, head)) - now
  if retry < 0 or until_purge < retry then retry = until_purge end
end
local ticket = ''
if head then
  ticket = redis.call('hget', tickets, head) or ''
end
return {0, math.max(1, retry), head or '', ticket, stamp(now)}
