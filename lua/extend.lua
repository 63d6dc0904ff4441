-- name: extend
-- version: 1
-- Extends one owner's hold on a lock kept as a hash owner -> count (the plain and the
-- fair lock), only where that owner still holds it: an expired key is never made
-- again, and another owner's hold is never touched.
-- KEYS[1]  the lock hash
-- ARGV[1]  owner id
-- ARGV[2]  milliseconds
-- ARGV[3]  'add': the key's PTTL grows by ARGV[2]; 'set': the PTTL becomes ARGV[2]
-- Reply    the key's PTTL afterwards (> 0); 0 when the owner holds nothing here
if redis.pcall('hexists', KEYS[1], ARGV[1]) ~= 1 then
  return 0
end
local ttl = tonumber(ARGV[2])
if ARGV[3] == 'add' then
  ttl = ttl + math.max(0, redis.call('pttl', KEYS[1]))
end
redis.call('pexpire', KEYS[1], ttl)
return ttl
