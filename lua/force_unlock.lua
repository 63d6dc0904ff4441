-- name: force_unlock
-- version: 2
-- Deletes a lock whoever holds it and wakes its waiters. Refuses a key that is not
-- a lock hash rather than deleting data it does not understand.
-- KEYS[1]  the lock hash
-- ARGV[1]  wake-up channel
-- ARGV[2]  release id, published as the wake-up's payload
-- Reply    1 a lock was deleted, 0 there was none; an error reply for a non-hash key
local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then
  return 0
end
if kind ~= 'hash' then
  return redis.error_reply('WRONGTYPE lock key holds a ' .. kind)
end
redis.call('del', KEYS[1])
redis.call('publish', ARGV[1], ARGV[2])
return 1
