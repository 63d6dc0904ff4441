-- name: acquire
-- version: 1
-- Takes a free exclusive lock, or re-enters it, as a hash owner -> hold count.
-- The key is created only by a first hold (count 1): a re-entry whose hold is gone
-- is refused, so a lost lease is never silently taken again under an old count.
-- KEYS[1]  the lock hash
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds: the key's PTTL after a grant
-- ARGV[3]  hold count to record on a grant (1 takes the lock, >1 re-enters)
-- Reply    {1, count} granted; {0, pttl} refused: pttl is the holder's remaining
--          lease in ms, or -2 when the key is absent (a re-entry whose hold is gone)
local count = tonumber(ARGV[3])
if redis.call('hexists', KEYS[1], ARGV[1]) == 1
    or (count == 1 and redis.call('exists', KEYS[1]) == 0) then
  redis.call('hset', KEYS[1], ARGV[1], count)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, count}
end
return {0, redis.call('pttl', KEYS[1])}
