-- name: renew
-- version: 2
-- Renews many holds in one call, and takes each again where it is gone while the
-- lock is free: a master that forgot the hold (a restart, an early expiry) holds it
-- again while its owner still holds a quorum elsewhere. A hold is '<count>:<tag>'
-- (see acquire.lua): only the owner's hold of that very tag is renewed. A key that is
-- not a hash counts as not held instead of failing the batch.
-- KEYS[i]      a lock hash (on a Redis Cluster node: keys of one hash slot per call)
-- ARGV[1]      lease in milliseconds
-- ARGV[2i]     owner id of KEYS[i]
-- ARGV[2i+1]   its hold, '<count>:<tag>'; count 0: renew only, never take again
-- Reply        array: per key 1 renewed, 2 taken again (the key was free, or held
--              only by the owner's hold of a smaller tag), 0 not held; then the
--              server's time in ms
local out = {}
for i, key in ipairs(KEYS) do
  local owner, hold = ARGV[2 * i], ARGV[2 * i + 1]
  local count, tag = string.match(hold, '^(%d+):(%d+)$')
  local mine = redis.pcall('hget', key, owner)
  if type(mine) == 'table' then
    out[i] = 0  -- not a hash
  else
    mine = mine and (tonumber(string.match(mine, ':(%d+)$')) or 0)
    if mine == tonumber(tag) then
      redis.call('pexpire', key, ARGV[1])
      out[i] = 1
    elseif count ~= '0' and (redis.call('exists', key) == 0
        or (mine and mine < tonumber(tag) and redis.call('hlen', key) == 1)) then
      redis.call('hset', key, owner, hold)
      redis.call('pexpire', key, ARGV[1])
      out[i] = 2
    else
      out[i] = 0
    end
  end
end
local t = redis.call('time')
out[#KEYS + 1] = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return out
