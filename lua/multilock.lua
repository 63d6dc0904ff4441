-- name: multilock
-- version: 3
-- Several plain locks taken or released together (see docs/multi-lock.md): all of the
-- names in the call or none, in one call. Each name is the plain lock of that name
-- (acquire.lua, release.lua): a hash owner -> hold ('<count>:<tag>': nothing sent for
-- one try changes a hold made by a later one), its registered waiters, its
-- reservation. On a Redis Cluster node a call holds the names of one hash slot; a
-- multi-lock over several slots is one call per slot.
-- KEYS     per name, three keys: its lock hash, its waiters zset, its reservation
-- ARGV[1]  the operation; the rest depends on it (the same for every name):
--   acquire  ARGV[2] owner, ARGV[3] lease ms, ARGV[4] the hold to record,
--            '<count>:<tag>' (count 1 takes, >1 re-enters the hold of that tag),
--            ARGV[5] ms the owner stays registered as a waiter of each name if refused
--            (0: do not register). Every name is taken (count 1: free, and not
--            reserved for another owner, or the owner's own hold of a smaller tag) or
--            re-entered (the owner's hold of that tag), or nothing changes. Reply
--            {1, count, {}, stamp} granted; {0, ms, {}, stamp} refused: ms until the
--            longest of the names' holds ends (-2: a re-entry whose hold is gone
--            somewhere, or a try that a later one overtook); stamp is {time, age,
--            failover}: the server's time in ms and its memory record (see stamp)
--   release  ARGV[2] owner, ARGV[3] the hold left, '<count>:<tag>' (a count above 0
--            is set on the holds of that tag only; 0 frees the names' holds of that
--            tag or a smaller one), ARGV[4]
--            release id, ARGV[5] home channel prefix, ARGV[6] '1' a final release
--            (ends the owner's registrations too, and each name freed wakes its next
--            registered waiter, as release.lua does) or '0' an undo (wakes nobody).
--            The count is absolute: a repeated call changes nothing. Reply
--            {status, woken, {per name: status}}: per name 1 still held, 0 freed,
--            -1 the owner held nothing there; status the least of them; woken the
--            first waiter woken, or ''
--   renew    ARGV[2] lease ms, then per name ARGV its owner, its hold's number and the
--            hold '<count>:<tag>' (count 0: renew only): each name where its owner
--            holds it with that tag gets the lease; where every name of a hold is
--            either so held or free, the free ones are taken again. Reply per hold (in
--            the order of their numbers): 1 renewed on all of its names here, 2
--            renewed and taken again, 0 not; then the server's time in ms
--   extend   ARGV[2] owner, ARGV[3] ms, ARGV[4] 'add' (each name's PTTL grows by ms)
--            or 'set' (it becomes ms), ARGV[5] the hold's tag, only where every name
--            is held by the owner with that tag.
--            Reply the least PTTL after (> 0); 0 when the owner lacks a name here
--   abandon  ARGV[2] owner, ARGV[3] release id, ARGV[4] home prefix: a waiter gives
--            up: ends its registrations, and each name that is free wakes its next
--            registered waiter. Reply {0, woken, {}}
-- A wake-up is published on the waiter's manager's home channel with the message
-- '<release id>\n<owner id>\n<the name's wake channel>' (ARGV for each name is not
-- needed: the wake channel is the lock hash's key followed by ':wake').
-- A lock key that is not a hash is refused with a WRONGTYPE error (nothing changes).
local op = ARGV[1]
local names = #KEYS / 3
local KEEP_MS = 1000

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

for i = 1, names do
  local kind = redis.call('type', KEYS[3 * i - 2])['ok']
  if kind ~= 'none' and kind ~= 'hash' then
    return redis.error_reply('WRONGTYPE lock key holds a ' .. kind)
  end
end

local function manager_of(owner)
  return string.match(owner, '^(.*):[^:]*$') or owner
end

-- A hold '<count>:<tag>': its count and its tag (0 for none).
local function parse(hold)
  local count, tag = string.match(hold, '^(%d+):?(%d*)$')
  return tonumber(count), tonumber(tag) or 0
end

-- The tag of the owner's hold of ``hash``, or nil.
local function tag_in(hash, owner)
  local hold = redis.call('hget', hash, owner)
  if not hold then return nil end
  local _, tag = parse(hold)
  return tag
end

-- Wakes the next registered waiter of name i (as release.lua does, without hand-over
-- or reservation); returns the owner woken, or ''.
local function wake_next(i, id, prefix)
  local hash, waiters = KEYS[3 * i - 2], KEYS[3 * i - 1]
  if redis.call('exists', waiters) == 0 then
    return ''
  end
  local now = server_ms()
  redis.call('zremrangebyscore', waiters, '-inf', now)
  while true do
    local first = redis.call('zrange', waiters, 0, 0)
    if #first == 0 then
      return ''
    end
    local owner = first[1]
    local message = id .. '\n' .. owner .. '\n' .. hash .. ':wake'
    if redis.call('publish', prefix .. manager_of(owner), message) > 0 then
      redis.call('zadd', waiters, 'XX', 'LT', now + KEEP_MS, owner)
      return owner
    end
    redis.call('zrem', waiters, owner)
  end
end

if op == 'renew' then
  local lease = ARGV[2]
  -- Per hold: 1 while each of its names is held, 2 once one is free (taken again if
  -- all the others are held or free), 0 once one is another's.
  local state, order = {}, {}
  for i = 1, names do
    local owner, n, hold = ARGV[3 * i], ARGV[3 * i + 1], ARGV[3 * i + 2]
    local count, tag = parse(hold)
    if state[n] == nil then
      state[n] = 1
      order[#order + 1] = n
    end
    local hash = KEYS[3 * i - 2]
    if tag_in(hash, owner) == tag then
      redis.call('pexpire', hash, lease)
    elseif count > 0 and state[n] ~= 0 and redis.call('exists', hash) == 0 then
      state[n] = 2
    else
      state[n] = 0
    end
  end
  for i = 1, names do
    local owner, n, hold = ARGV[3 * i], ARGV[3 * i + 1], ARGV[3 * i + 2]
    local hash = KEYS[3 * i - 2]
    if state[n] == 2 and redis.call('exists', hash) == 0 then
      redis.call('hset', hash, owner, hold)
      redis.call('pexpire', hash, lease)
    end
  end
  local out = {}
  for k, n in ipairs(order) do
    out[k] = state[n]
  end
  out[#out + 1] = server_ms()
  return out
end

local owner = ARGV[2]

if op == 'acquire' then
  local lease, wait = tonumber(ARGV[3]), tonumber(ARGV[5])
  local count, tag = parse(ARGV[4])
  local refused = false
  local longest = -2
  for i = 1, names do
    local hash = KEYS[3 * i - 2]
    local mine = tag_in(hash, owner)
    local ok
    if count > 1 then
      ok = mine == tag
    elseif mine and mine > tag then
      return {0, -2, {}, stamp(server_ms())}  -- a later try of this owner's holds it here
    else
      local reserved = redis.call('get', KEYS[3 * i])
      ok = (mine or redis.call('exists', hash) == 0) and (not reserved or reserved == owner)
    end
    if not ok then
      refused = true
      longest = math.max(longest, redis.call('pttl', hash))
    end
  end
  if not refused then
    for i = 1, names do
      local hash = KEYS[3 * i - 2]
      redis.call('hset', hash, owner, ARGV[4])
      redis.call('pexpire', hash, lease)
      if count == 1 then
        redis.call('del', KEYS[3 * i])  -- a reservation for this owner is used up
      end
    end
    return {1, count, {}, stamp(server_ms())}
  end
  if count > 1 then
    return {0, -2, {}, stamp(server_ms())}
  end
  if wait > 0 then
    local now = server_ms()
    for i = 1, names do
      local waiters = KEYS[3 * i - 1]
      redis.call('zremrangebyscore', waiters, '-inf', now)
      -- NX: a waiter that tries again keeps its place (and its registration's end).
      redis.call('zadd', waiters, 'NX', now + wait, owner)
      local last = redis.call('zrange', waiters, -1, -1, 'withscores')
      redis.call('pexpire', waiters, math.max(1, tonumber(last[2]) - now))
    end
  end
  return {0, longest, {}, stamp(server_ms())}
end

if op == 'release' then
  local left, tag = parse(ARGV[3])
  local final = ARGV[6] == '1'
  local status, woken, each = 1, '', {}
  for i = 1, names do
    local hash = KEYS[3 * i - 2]
    if final then
      redis.call('zrem', KEYS[3 * i - 1], owner)
    end
    local mine = tag_in(hash, owner)
    if not mine or mine > tag or (left > 0 and mine ~= tag) then
      each[i] = -1
    elseif left > 0 then
      redis.call('hset', hash, owner, ARGV[3])
      each[i] = 1
    else
      redis.call('hdel', hash, owner)
      each[i] = 0
      if final and redis.call('exists', hash) == 0 then
        local w = wake_next(i, ARGV[4], ARGV[5])
        if woken == '' then
          woken = w
        end
      end
    end
    status = math.min(status, each[i])
  end
  return {status, woken, each}
end

if op == 'extend' then
  for i = 1, names do
    if tag_in(KEYS[3 * i - 2], owner) ~= tonumber(ARGV[5]) then
      return 0
    end
  end
  local least = nil
  for i = 1, names do
    local hash = KEYS[3 * i - 2]
    local ttl = tonumber(ARGV[3])
    if ARGV[4] == 'add' then
      ttl = ttl + math.max(0, redis.call('pttl', hash))
    end
    redis.call('pexpire', hash, ttl)
    least = least and math.min(least, ttl) or ttl
  end
  return least
end

if op == 'abandon' then
  local woken = ''
  for i = 1, names do
    redis.call('zrem', KEYS[3 * i - 1], owner)
    if redis.call('exists', KEYS[3 * i - 2]) == 0 then
      local w = wake_next(i, ARGV[3], ARGV[4])
      if woken == '' then
        woken = w
      end
    end
  end
  return {0, woken, {}}
end

return redis.error_reply('ERR multilock: unknown operation ' .. tostring(op))
