-- name: probe
-- version: 2
-- Reads a lock without changing it.
-- KEYS[1]  the lock hash
-- KEYS[2]  (optional) zset of the lock's registered waiters: owner -> end of its
--          registration, in the server's ms (see acquire.lua)
-- Reply    {pttl, {field, value, ...}, {owner, ...}}: pttl in ms (-2 when the key is
--          absent), the hash's fields (owner -> hold count), and the registered
--          waiters whose registration has not ended, the one ending first first (none
--          without KEYS[2]); an error reply for a non-hash key
local waiting = {}
if KEYS[2] then
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  waiting = redis.call('zrangebyscore', KEYS[2], '(' .. now, '+inf')
end
return {redis.call('pttl', KEYS[1]), redis.call('hgetall', KEYS[1]), waiting}
