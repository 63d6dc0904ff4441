-- name: rwlock
-- version: 6
-- The read/write lock: many readers or one writer, both reentrant and owner-scoped,
-- and the upgradeable reader: one owner at a time that shares with readers and
-- excludes writers. Its write acquire is its upgrade: granted, in the same call, once
-- no hold but its own is left, while new readers are refused meanwhile.
-- Every hold has its own lease, kept as a score (server time, ms) in KEYS[2], so a
-- crashed reader frees the lock by itself; expired holds are purged by every call.
-- A writer that waits (or an upgrade) registers in KEYS[3] and new readers are refused
-- while it waits (no writer starvation); its entry ends at its own deadline if it dies.
--
-- KEYS[1]  hash: 'mode' -> 'read'|'write', 'writer' -> owner, 'upgradeable' -> owner,
--          'r:<owner>' / 'w:<owner>' / 'u:<owner>' -> read / write / upgradeable hold,
--          '<count>:<tag>' (see acquire.lua: nothing sent for one try changes a hold
--          made by a later one)
-- KEYS[2]  zset of hold leases: 'r:<owner>' / 'w:<owner>' / 'u:<owner>' -> lease end
--          (server ms)
-- KEYS[3]  zset of waiting writers and upgrades: owner -> end of its wait (server ms)
-- ARGV[1]  the operation; the rest depends on it:
--   acquire  ARGV[2] side 'r'|'w'|'u', ARGV[3] owner, ARGV[4] lease ms, ARGV[5] the
--            hold to record, '<count>:<tag>' (count 1 takes, >1 re-enters the hold of
--            that tag), ARGV[6] ms a waiting writer stays registered (0: do not
--            register)
--            'u' is refused while a writer holds or waits, or another owner holds 'u';
--            'r' by the owner of 'u' is not held up by waiting writers (it is inside);
--            'w' by the owner of 'u' (its upgrade) waits for every hold but its own.
--            Reply {1, count, stamp} granted; {0, ms, stamp} refused, ms = when a retry
--            may succeed (an upgrade: when the other holds end; -2: a re-entry whose
--            hold is gone), stamp = {time, age, failover}: the server's time in ms
--            and its memory record (see stamp below)
--   release  ARGV[2] side, ARGV[3] owner, ARGV[4] the hold left, '<count>:<tag>' (a
--            count above 0 is set on the hold of that tag only; 0 frees a hold of
--            that tag or a smaller one),
--            ARGV[5] readers' channel, ARGV[6] writers' channel, ARGV[7] release id,
--            ARGV[8] '1' to end the owner's wait as a writer too (a try that reached
--            this master too late to count may have registered it), '0' to keep it
--            (undoing a try that failed elsewhere, while still waiting), ARGV[9] the
--            upgrade channel, ARGV[10] (optional, with ARGV[4] '0:<tag>' of 'u') the
--            tag of the owner's upgrade. The last release of 'u' that frees it also
--            frees the owner's 'w' hold (its upgrade); where 'u' is not held, the 'w'
--            hold of that tag or a smaller one (a master may have granted the upgrade
--            as a plain write where it refused 'u'). A release that leaves only the
--            holds of an owner of 'u' waiting to upgrade publishes on the upgrade
--            channel.
--            Reply 1 still held; 0 the hold is gone; -1 the owner held nothing here
--   abandon  ARGV[2] owner, ARGV[3] readers' channel, ARGV[4] release id: a waiting
--            writer (or upgrade) gives up. Reply 0
--   renew    ARGV[2] lease ms, then per lock i (KEYS[3i-2..3i]) ARGV[3i] side,
--            ARGV[3i+1] owner and ARGV[3i+2] its hold '<count>:<tag>' (count 0:
--            renew only). Reply array: 1 renewed, 2 taken again (the hold was gone and
--            the lock is free for it: no writer for a reader, no other upgradeable
--            reader or writer for 'u', no hold at all for a writer), 0 not held; then
--            the server's time in ms
--   force    ARGV[2] readers' channel, ARGV[3] writers' channel, ARGV[4] release id,
--            ARGV[5] the upgrade channel. Reply 1 a lock was deleted, 0 there was none
--   probe    (after purging ended holds) Reply {pttl, {field, value, ...},
--            {waiting writer, ...}}
--   extend   ARGV[2] side, ARGV[3] owner, ARGV[4] ms, ARGV[5] 'add' (the hold's lease
--            end moves ms later) or 'set' (it ends ms from now), ARGV[6] the hold's
--            tag, only where the owner still holds that side with that tag. Reply the ms left on the hold afterwards (> 0); 0
--            when the owner holds nothing here
-- A KEYS[1] that is not a hash is refused with a WRONGTYPE error (nothing changes).

local op = ARGV[1]
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

local function check_type(key)
  local kind = redis.call('type', key)['ok']
  if kind ~= 'none' and kind ~= 'hash' then
    return redis.error_reply('WRONGTYPE lock key holds a ' .. kind)
  end
end

-- Expire ended holds and waits; keep 'writer'/'mode' right; keys live as long as their
-- longest entry. Returns true when the lock is free afterwards.
local function tidy(hash, leases, writers)
  local ended = redis.call('zrangebyscore', leases, '-inf', now)
  for _, member in ipairs(ended) do
    redis.call('hdel', hash, member)
    local side = string.sub(member, 1, 2)
    if side == 'w:' then
      redis.call('hdel', hash, 'writer')
    elseif side == 'u:' then
      redis.call('hdel', hash, 'upgradeable')
    end
  end
  if #ended > 0 then
    redis.call('zremrangebyscore', leases, '-inf', now)
  end
  redis.call('zremrangebyscore', writers, '-inf', now)
  local last = redis.call('zrange', writers, -1, -1, 'withscores')
  if #last > 0 then
    redis.call('pexpire', writers, math.max(1, tonumber(last[2]) - now))
  end
  last = redis.call('zrange', leases, -1, -1, 'withscores')
  if #last == 0 then
    redis.call('del', hash, leases)
    return true
  end
  local ttl = math.max(1, tonumber(last[2]) - now)
  if redis.call('hexists', hash, 'writer') == 1 then
    redis.call('hset', hash, 'mode', 'write')
  else
    redis.call('hset', hash, 'mode', 'read')
  end
  redis.call('pexpire', hash, ttl)
  redis.call('pexpire', leases, ttl)
  return false
end

-- Milliseconds until every current hold has ended (when a writer could enter).
local function all_end(leases)
  local last = redis.call('zrange', leases, -1, -1, 'withscores')
  if #last == 0 then return 1 end
  return math.max(1, tonumber(last[2]) - now)
end

-- Milliseconds until every hold but ``owner``'s own read and upgradeable holds has
-- ended (when its upgrade could be granted); nil when there is none.
local function others_end(leases, owner)
  local mine = {['r:' .. owner] = true, ['u:' .. owner] = true}
  local all = redis.call('zrange', leases, 0, -1, 'withscores')
  local last
  for i = 1, #all, 2 do
    if not mine[all[i]] then
      last = tonumber(all[i + 1])  -- in ascending order: the last one seen ends last
    end
  end
  if last then return math.max(1, last - now) end
  return nil
end

-- Wake the owner of the upgradeable lock if it waits to upgrade and nothing else holds.
local function wake_upgrade(hash, leases, writers, channel, rid)
  local up = redis.call('hget', hash, 'upgradeable')
  if up and redis.call('zscore', writers, up) and not others_end(leases, up) then
    redis.call('publish', channel, rid)
  end
end

local function grant(hash, leases, member, hold, lease)
  redis.call('hset', hash, member, hold)
  redis.call('zadd', leases, now + lease, member)
end

-- A hold '<count>:<tag>' (see acquire.lua): its count and its tag (0 for none).
local function parse(hold)
  local count, tag = string.match(hold, '^(%d+):?(%d*)$')
  return tonumber(count), tonumber(tag) or 0
end

-- The tag of the hold ``member`` in ``hash``, or nil.
local function tag_in(hash, member)
  local hold = redis.call('hget', hash, member)
  if not hold then return nil end
  local _, tag = parse(hold)
  return tag
end

if op == 'renew' then
  local lease = tonumber(ARGV[2])
  local out = {}
  for i = 1, #KEYS / 3 do
    local hash, leases, writers = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
    local side, owner, hold = ARGV[3 * i], ARGV[3 * i + 1], ARGV[3 * i + 2]
    local member = side .. ':' .. owner
    local count, tag = parse(hold)
    out[i] = 0
    if not check_type(hash) then
      tidy(hash, leases, writers)
      if tag_in(hash, member) == tag and redis.call('zscore', leases, member) then
        redis.call('zadd', leases, now + lease, member)
        out[i] = 1
      elseif count > 0 and not redis.call('hget', hash, member) then
        local writer = redis.call('hget', hash, 'writer')
        local upgrader = redis.call('hget', hash, 'upgradeable')
        local free
        if side == 'w' then
          free = redis.call('zcard', leases) == 0
          if free then redis.call('hset', hash, 'writer', owner) end
        elseif side == 'u' then
          free = not writer and not upgrader
          if free then redis.call('hset', hash, 'upgradeable', owner) end
        else
          free = not writer
        end
        if free then
          grant(hash, leases, member, hold, lease)
          out[i] = 2
        end
      end
      tidy(hash, leases, writers)
    end
  end
  out[#out + 1] = now
  return out
end

local hash, leases, writers = KEYS[1], KEYS[2], KEYS[3]
local wrong = check_type(hash)
if wrong then return wrong end

if op == 'extend' then
  tidy(hash, leases, writers)
  local member = ARGV[2] .. ':' .. ARGV[3]
  local score = redis.call('zscore', leases, member)
  if tag_in(hash, member) ~= tonumber(ARGV[6]) or not score then
    return 0
  end
  local ends = now + tonumber(ARGV[4])
  if ARGV[5] == 'add' then
    ends = tonumber(score) + tonumber(ARGV[4])
  end
  redis.call('zadd', leases, ends, member)
  tidy(hash, leases, writers)
  return math.max(1, ends - now)
end

if op == 'probe' then
  tidy(hash, leases, writers)
  return {redis.call('pttl', hash), redis.call('hgetall', hash),
          redis.call('zrange', writers, 0, -1)}
end

if op == 'force' then
  local existed = redis.call('exists', hash)
  redis.call('del', hash, leases, writers)
  redis.call('publish', ARGV[2], ARGV[4])
  redis.call('publish', ARGV[3], ARGV[4])
  redis.call('publish', ARGV[5], ARGV[4])
  return existed
end

if op == 'abandon' then
  redis.call('zrem', writers, ARGV[2])
  tidy(hash, leases, writers)
  if redis.call('hexists', hash, 'writer') == 0 then
    redis.call('publish', ARGV[3], ARGV[4])
  end
  return 0
end

local side, owner = ARGV[2], ARGV[3]
local member = side .. ':' .. owner

if op == 'release' then
  if ARGV[8] == '1' then
    redis.call('zrem', writers, owner)
  end
  tidy(hash, leases, writers)
  local left, tag = parse(ARGV[4])
  local mine = tag_in(hash, member)
  local held = mine ~= nil and mine <= tag and (left == 0 or mine == tag)
  if held and left > 0 then
    redis.call('hset', hash, member, ARGV[4])
    return 1
  end
  local gone = {}
  if held then gone[1] = member end
  if held and side == 'u' and left == 0 and redis.call('hexists', hash, 'w:' .. owner) == 1 then
    -- The last release of the upgradeable lock ends its upgrade too.
    gone[#gone + 1] = 'w:' .. owner
  elseif not held and side == 'u' and left == 0 and ARGV[10] then
    -- Its upgrade, granted here as a plain write where this hold was refused.
    local upgrade = tag_in(hash, 'w:' .. owner)
    if upgrade and upgrade <= tonumber(ARGV[10]) then
      gone[#gone + 1] = 'w:' .. owner
    end
  end
  if #gone == 0 then
    return -1
  end
  for _, m in ipairs(gone) do
    redis.call('hdel', hash, m)
    redis.call('zrem', leases, m)
    if string.sub(m, 1, 2) == 'w:' then
      redis.call('hdel', hash, 'writer')
    elseif string.sub(m, 1, 2) == 'u:' then
      redis.call('hdel', hash, 'upgradeable')
    end
  end
  local free = tidy(hash, leases, writers)
  if free or side ~= 'r' then
    -- Readers (and upgradeable readers) may enter now: their channel wakes them all.
    redis.call('publish', ARGV[5], ARGV[7])
  end
  if free then
    redis.call('publish', ARGV[6], ARGV[7])
  else
    wake_upgrade(hash, leases, writers, ARGV[9], ARGV[7])
  end
  if held then return 0 end
  return -1
end

-- op == 'acquire'
local lease, wait = tonumber(ARGV[4]), tonumber(ARGV[6])
local count, tag = parse(ARGV[5])
tidy(hash, leases, writers)
local mine = tag_in(hash, member)
if mine == tag or (mine and count == 1 and mine < tag) then
  grant(hash, leases, member, ARGV[5], lease)
  tidy(hash, leases, writers)
  return {1, count, stamp(now)}
end
if count > 1 or mine then
  -- A re-entry whose hold is gone, or a try of this owner's that a later one overtook.
  return {0, -2, stamp(now)}
end
local writer = redis.call('hget', hash, 'writer')
local upgrader = redis.call('hget', hash, 'upgradeable')
if side == 'w' then
  local busy
  if upgrader == owner then
    busy = others_end(leases, owner)  -- the upgrade: only its own holds may be left
  elseif redis.call('zcard', leases) > 0 then
    busy = all_end(leases)
  end
  if busy then
    if wait > 0 then
      redis.call('zadd', writers, now + wait, owner)
      tidy(hash, leases, writers)
    end
    return {0, busy, stamp(now)}
  end
  redis.call('hset', hash, 'writer', owner)
  redis.call('zrem', writers, owner)
else
  if writer and (writer ~= owner or side == 'u') then
    return {0, all_end(leases), stamp(now)}
  end
  if side == 'u' and upgrader then
    -- Another owner's (this owner's own is a re-entry): one at a time.
    local ends = redis.call('zscore', leases, 'u:' .. upgrader)
    return {0, math.max(1, (tonumber(ends) or now) - now), stamp(now)}
  end
  if not writer and upgrader ~= owner and redis.call('zcard', writers) > 0 then
    -- A writer is waiting: no new reader until it has had its turn (or its wait ended).
    local first = redis.call('zrange', writers, 0, 0, 'withscores')
    local holders = redis.call('zcard', leases)
    local retry = tonumber(first[2]) - now
    if holders > 0 then retry = math.min(retry, all_end(leases)) end
    return {0, math.max(1, retry), stamp(now)}
  end
  if side == 'u' then
    redis.call('hset', hash, 'upgradeable', owner)
  end
end
grant(hash, leases, member, ARGV[5], lease)
tidy(hash, leases, writers)
return {1, count, stamp(now)}
