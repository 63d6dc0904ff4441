-- name: release
-- version: 2
-- Sets the owner's hold count to what is left after a release; at zero removes the
-- owner's hold, and when that frees the lock deletes the key and publishes a wake-up.
-- The count is absolute, not a decrement, so a repeated call cannot release twice.
-- KEYS[1]  the lock hash
-- ARGV[1]  owner id
-- ARGV[2]  hold count left after this release (0 frees the owner's hold)
-- ARGV[3]  wake-up channel
-- ARGV[4]  release id, published as the wake-up's payload (the same on every master,
--          so a subscriber can tell N masters' messages of one release apart from N releases)
-- Reply    1 still held with the new count; 0 the owner's hold is gone (freed here);
--          -1 the owner held nothing on this master
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return -1
end
local count = tonumber(ARGV[2])
if count > 0 then
  redis.call('hset', KEYS[1], ARGV[1], count)
  return 1
end
redis.call('hdel', KEYS[1], ARGV[1])
if redis.call('exists', KEYS[1]) == 0 then
  redis.call('publish', ARGV[3], ARGV[4])
end
return 0
