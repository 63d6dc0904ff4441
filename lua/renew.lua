-- name: renew
-- version: 1
-- Renews many leases in one call: each key's PTTL is reset where its owner still
-- holds it. A key that is not a hash counts as not held instead of failing the batch.
-- KEYS[i]    a lock hash (on a Redis Cluster node: keys of one hash slot per call)
-- ARGV[1]    lease in milliseconds
-- ARGV[i+1]  owner id of KEYS[i]
-- Reply      array: 1 renewed, 0 the owner holds nothing under KEYS[i]
local out = {}
for i, key in ipairs(KEYS) do
  local held = redis.pcall('hexists', key, ARGV[i + 1])
  if held == 1 then
    redis.call('pexpire', key, ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
