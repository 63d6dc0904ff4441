-- name: semaphore
-- version: 4
-- A semaphore of P permits kept as P slots (see docs/semaphore.md): each slot is a
-- hash owner -> hold ('<count>:<tag>', see acquire.lua: nothing sent for one try
-- changes a hold made by a later one) whose PTTL is the lease, as the plain lock keeps
-- a lock, and
-- a permit is one slot held on a quorum of masters. An owner holds at most one slot
-- here. The index (owner -> slot number) tells which slot each holder has; it lives as
-- long as the longest of those holds. Refused owners register as waiters (owner -> end
-- of registration, server ms) and keep their place until their final release; a freed
-- slot wakes a registered waiter on its manager's home channel as release.lua does:
-- the first that holds no permit here and was not woken in the last KEEP_MS, else the
-- first that holds none. A waiter whose manager hears nothing there is dropped.
-- KEYS     the slots the operation names (slot hashes), then the waiters zset, then
--          the index hash (renew: pairs of a slot and its index instead)
-- ARGV[1]  the operation; the rest depends on it:
--   acquire  ARGV[2] owner, ARGV[3] lease ms, ARGV[4] the hold to record,
--            '<count>:<tag>' (count 1 takes, >1 re-enters the hold of that tag),
--            ARGV[5] ms the owner stays registered as a waiter if refused (0: do not
--            register), ARGV[6] the end of that registration the owner proposes (ms
--            since the epoch, 0: none; taken as acquire.lua takes it), ARGV[7..] the
--            slots to try, in order, as positions in KEYS (1-based). A first hold takes the first slot that is free or already the
--            owner's, and lets go of any other the owner holds among them; it is
--            refused where the owner holds one of them with a greater tag (a later
--            try's). A free slot is kept for each waiter woken in the last KEEP_MS
--            that holds no permit yet: another owner takes one only where more slots
--            are free than are kept, so waiters are served in the order they came.
--            A re-entry re-enters the owner's hold on the first slot only.
--            Reply {1, count, position, stamp} granted; {0, ms, stamp} refused: ms
--            until a kept slot's waiter loses it or the first of the tried slots'
--            holds ends, -2 for a re-entry whose
--            hold is gone (or a try that a later one overtook); stamp is {time, age,
--            failover}: the server's time in ms and its memory record (see stamp)
--   release  KEYS[1] the owner's slot; ARGV[2] owner, ARGV[3] the hold left,
--            '<count>:<tag>' (a count above 0 is set on the hold of that tag only; 0
--            frees a hold of that tag or a smaller one), ARGV[4] the wake channel,
--            ARGV[5] release id, ARGV[6]
--            home channel prefix, ARGV[7] '1' for a final release (it ends the owner's
--            registration too, and a freed slot wakes a waiter) or '0' for an undo
--            (nobody is woken). The count is absolute: a repeated call changes nothing.
--            Reply {1, ''} still held; {0, woken, 0, 0} freed here; {-1, ''} the owner
--            held nothing on that slot
--   drop     ARGV[2] owner, ARGV[3] the position of a slot to keep (0: none), ARGV[4]
--            a tag: lets go of the owner's holds of that tag or a smaller one on every
--            other slot named (the undo of a try), waking nobody; ARGV[5] '1' also ends
--            the owner's registration (it holds a permit: a master that refused it
--            keeps no slot for it). Reply how many holds it let go of
--   abandon  ARGV[2] owner, ARGV[3] wake channel, ARGV[4] release id, ARGV[5] home
--            prefix, ARGV[6] a tag: a waiter gives up. Ends its registration, lets go
--            of any hold a try left it on the slots named (of that tag or a smaller
--            one), and where one of them is free wakes another waiter. Reply {0, woken}
--   renew    KEYS pairs (a slot, its semaphore's index); ARGV[2] lease ms, ARGV[1+2i]
--            the owner of the i-th pair, ARGV[2+2i] its hold '<count>:<tag>' (count
--            0: renew only). The hold of that tag is renewed; where the slot is free
--            and the owner holds no other slot here, it takes the slot again. Reply
--            array: 1 renewed, 2 taken again, 0 not held there; then the server's
--            time in ms
--   extend   KEYS[1] the owner's slot; ARGV[2] owner, ARGV[3] ms, ARGV[4] 'add' (the
--            slot's PTTL grows by ms) or 'set' (it becomes ms), ARGV[5] the hold's
--            tag. Reply the PTTL after (> 0); 0 when the owner holds nothing there
--            with that tag
--   probe    the slots named, or with none, those the index names. Reply
--            {{slot number, owner, hold count, pttl, ...}, {waiter, ...}}: every hold, and
--            the registered waiters whose registration has not ended, in their order
--   force    deletes the slots named (with none: those the index names) and the index,
--            and wakes as many waiters as slots were held. Reply {1, woken} a slot was
--            held, {0, ''} none was
-- A slot key that is not a hash is refused with a WRONGTYPE error (nothing changes).
local KEEP_MS = 1000
local PLACE_SKEW_MS = 1000
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

local function check_types(first, last)
  for i = first, last do
    local kind = redis.call('type', KEYS[i])['ok']
    if kind ~= 'none' and kind ~= 'hash' then
      return redis.error_reply('WRONGTYPE lock key holds a ' .. kind)
    end
  end
end

-- A hold '<count>:<tag>': its count and its tag (0 for none).
local function parse(hold)
  local count, tag = string.match(hold, '^(%d+):?(%d*)$')
  return tonumber(count), tonumber(tag) or 0
end

-- The tag of the owner's hold of slot ``key`` (a pcall: nil for none, or a key that is
-- not a hash).
local function tag_in(key, owner)
  local hold = redis.pcall('hget', key, owner)
  if type(hold) ~= 'string' then return nil end
  local _, tag = parse(hold)
  return tag
end

-- The slot number of a slot key, and the slot key of a number (next to the index).
local function number_of(key)
  return tonumber(string.match(key, ':(%d+)$'))
end
local function slot_key(index, number)
  return string.sub(index, 1, -#'holders' - 1) .. number
end

-- Drop index entries whose hold is gone; let the index live as its longest hold.
local function tidy_index(index)
  local entries = redis.call('hgetall', index)
  local longest = 0
  for i = 1, #entries, 2 do
    local key = slot_key(index, entries[i + 1])
    if tag_in(key, entries[i]) then
      longest = math.max(longest, redis.call('pttl', key))
    else
      redis.call('hdel', index, entries[i])
    end
  end
  if longest > 0 then
    redis.call('pexpire', index, longest)
  else
    redis.call('del', index)
  end
end

-- Let go of the owner's hold of ``key`` if its tag is at most ``tag``: 1 if it did.
local function let_go(key, owner, tag)
  local mine = tag_in(key, owner)
  if mine and mine <= tag then
    return redis.call('hdel', key, owner)
  end
  return 0
end

local function manager_of(owner)
  return string.match(owner, '^(.*):[^:]*$') or owner
end

-- Wake up to n registered waiters (see the header); returns the first woken, or ''.
local function wake(waiters, index, n, channel, id, prefix)
  redis.call('zremrangebyscore', waiters, '-inf', now)
  local first = ''
  local woken = {}
  for pass = 1, 2 do
    local candidates = redis.call('zrange', waiters, 0, -1, 'withscores')
    for i = 1, #candidates, 2 do
      if n <= 0 then
        return first
      end
      local owner = candidates[i]
      local fresh = pass == 2 or tonumber(candidates[i + 1]) > now + KEEP_MS
      if fresh and not woken[owner] and redis.call('hexists', index, owner) == 0 then
        local message = id .. '\n' .. owner .. '\n' .. channel
        if redis.call('publish', prefix .. manager_of(owner), message) > 0 then
          -- LT: woken again, it keeps the end its first wake-up set
          redis.call('zadd', waiters, 'XX', 'LT', now + KEEP_MS, owner)
          woken[owner] = true
          n = n - 1
          if first == '' then
            first = owner
          end
        else
          redis.call('zrem', waiters, owner)
        end
      end
    end
    if first ~= '' then
      return first
    end
  end
  return first
end

if op == 'renew' then
  local out = {}
  for i = 1, #KEYS / 2 do
    local key, index = KEYS[2 * i - 1], KEYS[2 * i]
    local owner, hold = ARGV[1 + 2 * i], ARGV[2 + 2 * i]
    local count, tag = parse(hold)
    out[i] = 0
    if tag_in(key, owner) == tag then
      redis.call('pexpire', key, ARGV[2])
      tidy_index(index)
      out[i] = 1
    elseif count > 0 and redis.call('exists', key) == 0 then
      local other = redis.call('hget', index, owner)
      if not other or not tag_in(slot_key(index, other), owner) then
        redis.call('hset', key, owner, hold)
        redis.call('pexpire', key, ARGV[2])
        redis.call('hset', index, owner, number_of(key))
        tidy_index(index)
        out[i] = 2
      end
    end
  end
  out[#out + 1] = now
  return out
end

local waiters, index = KEYS[#KEYS - 1], KEYS[#KEYS]
local slots = #KEYS - 2
local wrong = check_types(1, slots)
if wrong then
  return wrong
end

if op == 'probe' or op == 'force' then
  local named = {}
  for i = 1, slots do
    named[#named + 1] = KEYS[i]
  end
  if slots == 0 then
    local entries = redis.call('hgetall', index)
    for i = 2, #entries, 2 do
      named[#named + 1] = slot_key(index, entries[i])
    end
  end
  if op == 'probe' then
    local holds = {}
    for _, key in ipairs(named) do
      local fields = redis.call('hgetall', key)
      local pttl = redis.call('pttl', key)
      for i = 1, #fields, 2 do
        holds[#holds + 1] = {number_of(key), fields[i], (parse(fields[i + 1])), pttl}
      end
    end
    return {holds, redis.call('zrangebyscore', waiters, '(' .. now, '+inf')}
  end
  local held = 0
  for _, key in ipairs(named) do
    held = held + redis.call('exists', key)
    redis.call('del', key)
  end
  redis.call('del', index)
  if held == 0 then
    return {0, ''}
  end
  return {1, wake(waiters, index, held, ARGV[2], ARGV[3], ARGV[4])}
end

local owner = ARGV[2]

if op == 'acquire' then
  local lease = tonumber(ARGV[3])
  local count, tag = parse(ARGV[4])
  local pick = nil
  local reserved = nil  -- ms until the first reservation that refused this try ends
  if count > 1 then
    local position = tonumber(ARGV[7])
    if tag_in(KEYS[position], owner) ~= tag then
      return {0, -2, stamp(now)}
    end
    pick = position
  else
    for i = 7, #ARGV do
      local mine = tag_in(KEYS[tonumber(ARGV[i])], owner)
      if mine and mine > tag then
        return {0, -2, now}  -- a later try of this owner's holds a slot here
      end
    end
    local free = {}
    for i = 7, #ARGV do
      local position = tonumber(ARGV[i])
      local key = KEYS[position]
      if tag_in(key, owner) then
        pick = position
        break
      elseif redis.call('exists', key) == 0 then
        free[#free + 1] = position
      end
    end
    if not pick and #free > 0 then
      -- A free slot is kept for each waiter woken in the last KEEP_MS (see wake) that
      -- holds none yet: an owner not among them takes one only where more are free.
      local kept = 0
      redis.call('zremrangebyscore', waiters, '-inf', now)
      local woken = redis.call('zrangebyscore', waiters, '-inf', now + KEEP_MS, 'withscores')
      for i = 1, #woken, 2 do
        if woken[i] == owner then
          kept = 0
          break
        elseif redis.call('hexists', index, woken[i]) == 0 then
          kept = kept + 1
          reserved = reserved or tonumber(woken[i + 1]) - now
        end
      end
      if #free > kept then
        pick = free[1]
      end
    end
  end
  if pick then
    if count == 1 then
      for i = 7, #ARGV do
        local position = tonumber(ARGV[i])
        if position ~= pick then
          let_go(KEYS[position], owner, tag)
        end
      end
    end
    redis.call('hset', KEYS[pick], owner, ARGV[4])
    redis.call('pexpire', KEYS[pick], lease)
    redis.call('hset', index, owner, number_of(KEYS[pick]))
    tidy_index(index)
    return {1, count, pick, stamp(now)}
  end
  local wait = tonumber(ARGV[5])
  if wait > 0 then
    redis.call('zremrangebyscore', waiters, '-inf', now)
    -- The end the owner proposed, where the clocks roughly agree (see acquire.lua):
    -- every master then orders its waiters alike. NX: a waiter that tries again keeps
    -- its place (and its registration's end).
    local ends, place = now + wait, tonumber(ARGV[6])
    if place > now and place <= ends + PLACE_SKEW_MS then
      ends = place
    end
    redis.call('zadd', waiters, 'NX', ends, owner)
    local last = redis.call('zrange', waiters, -1, -1, 'withscores')
    redis.call('pexpire', waiters, math.max(1, tonumber(last[2]) - now))
  end
  local soonest = reserved or -1
  for i = 7, #ARGV do
    local pttl = redis.call('pttl', KEYS[tonumber(ARGV[i])])
    if pttl > 0 and (soonest < 0 or pttl < soonest) then
      soonest = pttl
    end
  end
  return {0, soonest, stamp(now)}
end

if op == 'release' then
  if ARGV[7] == '1' then
    redis.call('zrem', waiters, owner)
  end
  local key = KEYS[1]
  local left, tag = parse(ARGV[3])
  local mine = tag_in(key, owner)
  if not mine or mine > tag or (left > 0 and mine ~= tag) then
    return {-1, ''}
  end
  if left > 0 then
    redis.call('hset', key, owner, ARGV[3])
    return {1, ''}
  end
  let_go(key, owner, tag)
  tidy_index(index)
  if ARGV[7] == '0' or redis.call('exists', key) == 1 then
    return {0, '', 0, 0}
  end
  return {0, wake(waiters, index, 1, ARGV[4], ARGV[5], ARGV[6]), 0, 0}
end

if op == 'drop' then
  local keep, tag = tonumber(ARGV[3]), tonumber(ARGV[4])
  local dropped = 0
  if ARGV[5] == '1' then
    redis.call('zrem', waiters, owner)
  end
  for i = 1, slots do
    if i ~= keep then
      dropped = dropped + let_go(KEYS[i], owner, tag)
    end
  end
  tidy_index(index)
  return dropped
end

if op == 'abandon' then
  redis.call('zrem', waiters, owner)
  local free = false
  local tag = tonumber(ARGV[6])
  for i = 1, slots do
    let_go(KEYS[i], owner, tag)
    free = free or redis.call('exists', KEYS[i]) == 0
  end
  tidy_index(index)
  if not free then
    return {0, ''}
  end
  return {0, wake(waiters, index, 1, ARGV[3], ARGV[4], ARGV[5])}
end

if op == 'extend' then
  local key = KEYS[1]
  if tag_in(key, owner) ~= tonumber(ARGV[5]) then
    return 0
  end
  local ttl = tonumber(ARGV[3])
  if ARGV[4] == 'add' then
    ttl = ttl + math.max(0, redis.call('pttl', key))
  end
  redis.call('pexpire', key, ttl)
  tidy_index(index)
  return ttl
end

return redis.error_reply('ERR semaphore: unknown operation ' .. tostring(op))
