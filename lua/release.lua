-- name: release
-- version: 15
-- Everything that frees the plain lock or ends a wait on it, and the hand-off of a
-- wake-up to ONE registered waiter (acquire.lua registers refused waiters in KEYS[2]).
--
-- When the lock becomes free here, the registered waiter whose registration ends first
-- is woken on its manager's home channel: the home prefix followed by the owner id
-- less its last ':' part (an owner id is '<manager id>:<token>'), with the message
-- '<release id>\n<owner id>\n<wake channel>'. It keeps its place in KEYS[2] until its
-- final release (a grant keeps it: acquire.lua), gives up ('abandon') or its
-- registration ends, which a wake-up brings forward to KEEP_MS after it at the latest:
-- a woken waiter that loses
-- the race for the lock (on several masters, a split vote) is the one woken next, not
-- sent to the back, while one that never comes (its process frozen) holds up the
-- waiters behind it for KEEP_MS at most. A waiter whose manager hears nothing there
-- (PUBLISH reached no subscriber: its process died, or its connection is being remade)
-- is dropped and the next one is tried, so a dead waiter never swallows the wake-up.
-- Registrations past their end are purged first.
-- A waiter of another manager woken with a reservation (ARGV 'reserve' ms > 0) is the
-- only one that may take the lock until the reservation (KEYS[3]) ends (acquire.lua).
-- A release may also defer the wake-up ('defer'): while the releasing manager's turn
-- lasts, it frees the lock but wakes (or hands it to) nobody; that manager sends
-- 'wake' a moment later unless it took the lock again meanwhile.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  zset of registered waiters: owner -> end of its registration (server ms)
-- KEYS[3]  the reservation: the owner id of the waiter woken last, with a short PTTL
-- ARGV[1]  the operation; the rest depends on it:
--   release  ARGV[2] owner, ARGV[3] the hold left, '<count>:<tag>' (see acquire.lua;
--            count 0 frees the owner's hold): a count above 0 is set on the owner's
--            hold of that tag only, and count 0 frees a hold of that tag or a smaller
--            one (made by the same try or an earlier one, never a later one),
--            ARGV[4] the lock's wake channel, ARGV[5] release id (the same on every
--            master, so that a manager counts N masters' wake-ups of one release once),
--            ARGV[6] home channel prefix, ARGV[7] '1' to end the owner's own
--            registration too (a final release: a try that reached this master too
--            late to count may have registered it), '0' to keep it (undoing a try that
--            failed elsewhere, while still waiting: such an undo wakes no registered
--            waiter, for the owner undoing tries again or gives up, which wakes the
--            next waiter, and a wake-up would draw one more contender into the split),
--            ARGV[8] (optional) a hand-over, '<lease ms>:<tag>', '0' or absent for
--            none: when the waiter to wake belongs to the releasing owner's own
--            manager, it is granted the lock at once instead (the hold '1:<tag>',
--            that PTTL; its registration ends) and nothing is published: that manager
--            reads this reply and tells it. A waiter of another manager
--            is only woken (handing over to another process would make every hand-off
--            wait for that process to be scheduled). ARGV[9] (optional) '1' to defer
--            the wake-up (nobody is woken or handed the lock, nothing is published,
--            the waiters keep their places), ARGV[10] (optional) ms to reserve the lock
--            for a woken waiter of another manager, '0' or absent for none. The count
--            is absolute, not a decrement, so a repeated call cannot release twice.
--            Reply {1, ''} still held with the new count; {0, woken, ms, deferred} the
--            owner's hold is gone (freed here), ms the hand-over lease if the woken
--            waiter was granted the lock, else 0, deferred 1 if the wake-up was
--            deferred (KEYS[2] exists: someone is registered), else 0; {-1, ''}
--            the owner held nothing on this master
--   abandon  ARGV[2] owner, ARGV[3] wake channel, ARGV[4] release id, ARGV[5] home
--            prefix, ARGV[6] (optional) a tag: a waiter gives up. Ends its
--            registration, takes back a hold it was handed or a try left meanwhile (of
--            that tag or a smaller one) and, if the lock is free here, wakes the next
--            waiter (the one giving up may have been woken, and will not take the
--            lock). Reply {0, woken}
--   wake     ARGV[2] wake channel, ARGV[3] release id, ARGV[4] home prefix, ARGV[5]
--            reservation ms: the deferred wake-up of a release. If the lock is free
--            here, wakes the next waiter (reserving the lock for it as a release does).
--            Reply {0, woken}
--   force    ARGV[2] wake channel, ARGV[3] release id, ARGV[4] home prefix: deletes the
--            lock whoever holds it and wakes one waiter. Reply {1, woken} a lock was
--            deleted, {0, ''} there was none; a WRONGTYPE error for a non-hash key
-- woken: the owner id of the waiter that was woken, '' when none was. Abandon and force
-- end a reservation of the owner giving up, or any reservation.

local op = ARGV[1]
local hash, waiters, reserved = KEYS[1], KEYS[2], KEYS[3]

-- The tag of a hold (see acquire.lua): the number after its ':', 0 for none.
local function tag_of(hold)
  return tonumber(string.match(hold, ':(%d+)$')) or 0
end
-- how long (ms) a woken waiter keeps its place at most, if it does not take the lock
local KEEP_MS = 1000

local function manager_of(owner)
  return string.match(owner, '^(.*):[^:]*$') or owner
end

-- Wakes the next registered waiter, or grants it the lock with the lease handover
-- (0: never) and the tag handed if it belongs to local_manager; a waiter of another manager woken gets a
-- reservation of reserve ms (0: none); with defer, nobody is woken. Returns (the owner
-- woken or '', the lease it was granted or 0, 1 if the wake-up was deferred else 0).
local function wake_next(channel, id, prefix, handover, handed, local_manager, reserve, defer)
  local now = 0
  if redis.call('exists', waiters) == 1 then
    if defer then
      -- KEYS[2] lives as long as its last registration: someone waits (or a waiter
      -- whose registration ended meanwhile, which the deferred wake-up purges). No
      -- purge here: a deferral is on the hot path of every contended turn.
      return '', 0, 1
    end
    local t = redis.call('time')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('zremrangebyscore', waiters, '-inf', now)
  end
  while true do
    local first = redis.call('zrange', waiters, 0, 0)
    if #first == 0 then
      return '', 0, 0
    end
    local owner = first[1]
    local manager = manager_of(owner)
    if handover > 0 and manager == local_manager then
      redis.call('zrem', waiters, owner)
      redis.call('hset', hash, owner, handed ~= '' and '1:' .. handed or '1')
      redis.call('pexpire', hash, handover)
      return owner, handover, 0
    end
    if redis.call('publish', prefix .. manager, id .. '\n' .. owner .. '\n' .. channel) > 0 then
      if reserve > 0 and manager ~= local_manager then
        redis.call('set', reserved, owner, 'PX', reserve)
      end
      -- LT: woken again, it keeps the end its first wake-up set
      redis.call('zadd', waiters, 'XX', 'LT', now + KEEP_MS, owner)
      return owner, 0, 0
    end
    redis.call('zrem', waiters, owner)
  end
end

if op == 'force' then
  local kind = redis.call('type', hash)['ok']
  if kind == 'none' then
    return {0, ''}
  end
  if kind ~= 'hash' then
    return redis.error_reply('WRONGTYPE lock key holds a ' .. kind)
  end
  redis.call('del', hash, reserved)
  return {1, (wake_next(ARGV[2], ARGV[3], ARGV[4], 0, '', '', 0, false))}
end

if op == 'abandon' then
  redis.call('zrem', waiters, ARGV[2])
  local hold = redis.call('hget', hash, ARGV[2])
  if hold and tag_of(hold) <= tonumber(ARGV[6] or '0') then
    redis.call('hdel', hash, ARGV[2])
  end
  if redis.call('get', reserved) == ARGV[2] then
    redis.call('del', reserved)
  end
  if redis.call('exists', hash) == 1 then
    return {0, ''}
  end
  return {0, (wake_next(ARGV[3], ARGV[4], ARGV[5], 0, '', '', 0, false))}
end

if op == 'wake' then
  if redis.call('exists', hash) == 1 then
    return {0, ''}
  end
  return {0, (wake_next(ARGV[2], ARGV[3], ARGV[4], 0, '', '', tonumber(ARGV[5]), false))}
end

-- op == 'release'
local owner = ARGV[2]
if ARGV[7] == '1' then
  redis.call('zrem', waiters, owner)
end
local count, tag = string.match(ARGV[3], '^(%d+):?(%d*)$')
count, tag = tonumber(count), tonumber(tag) or 0
local hold = redis.call('hget', hash, owner)
if not hold or tag_of(hold) > tag or (count > 0 and tag_of(hold) ~= tag) then
  return {-1, ''}
end
if count > 0 then
  redis.call('hset', hash, owner, ARGV[3])
  return {1, ''}
end
redis.call('hdel', hash, owner)
if redis.call('exists', hash) == 1 then
  return {0, '', 0, 0}
end
if ARGV[7] == '0' then
  return {0, '', 0, 0}  -- an undo wakes no registered waiter
end
local lease, handed = string.match(ARGV[8] or '0', '^(%d+):?(%d*)$')
local woken, granted, deferred = wake_next(ARGV[4], ARGV[5], ARGV[6], tonumber(lease), handed,
  manager_of(owner), tonumber(ARGV[10] or '0'), ARGV[9] == '1')
return {0, woken, granted, deferred}
