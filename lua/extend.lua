-- name: extend
-- version: 3
-- Extends one owner's hold on a lock kept as a hash owner -> '<count>:<tag>' (the
-- plain and the fair lock; see acquire.lua), only where that owner still holds it with
-- that tag: an expired key is never made again, and neither another owner's hold nor
-- a later hold of the same owner is touched. With ARGV[5], the extended hold also
-- moves to another owner (a hold handed off between processes: see Lock.take_over).
-- KEYS[1]  the lock hash
-- ARGV[1]  owner id
-- ARGV[2]  milliseconds
-- ARGV[3]  'add': the key's PTTL grows by ARGV[2]; 'set': the PTTL becomes ARGV[2]
-- ARGV[4]  the tag of the hold
-- ARGV[5]  (optional) the owner id the hold moves to, with ARGV[6] its hold there,
--          '<count>:<tag>' (see acquire.lua)
-- Reply    the key's PTTL afterwards (> 0); 0 when the owner holds nothing here
local mine = redis.pcall('hget', KEYS[1], ARGV[1])
if type(mine) ~= 'string' or (tonumber(string.match(mine, ':(%d+)$')) or 0) ~= tonumber(ARGV[4]) then
  return 0
end
local ttl = tonumber(ARGV[2])
if ARGV[3] == 'add' then
  ttl = ttl + math.max(0, redis.call('pttl', KEYS[1]))
end
if ARGV[5] then
  redis.call('hdel', KEYS[1], ARGV[1])
  redis.call('hset', KEYS[1], ARGV[5], ARGV[6])
end
redis.call('pexpire', KEYS[1], ttl)
return ttl
