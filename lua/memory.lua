-- name: memory
-- version: 2
-- Reads this master's memory record (see the stamp in acquire.lua), changing nothing:
-- whether its votes may count yet.
-- KEYS[1]  the record, the hash 'redreentrant:v1:memory'
-- Reply    {time, age, failover}: the server's time in ms, ms since its memory began,
--          1 when it began with a failover (also one the next try will begin: this
--          server was promoted from a replica since the record was written);
--          {time, -1, 0} when there is no record (the next try makes it: the memory
--          begins then); {time} on a Redis Cluster node, which keeps none
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function info(section)
  local text = redis.pcall('info', section)
  return type(text) == 'string' and text or ''
end
if string.find(info('cluster'), 'cluster_enabled:1', 1, true) then
  return {now}
end
local kept = redis.call('hmget', KEYS[1], 'began', 'replid2', 'failover')
local began = tonumber(kept[1])
if not began then
  return {now, -1, 0}
end
local id2 = string.match(info('replication'), 'master_replid2:(%w+)') or ''
if kept[2] ~= id2 and string.find(id2, '[^0]') then
  return {now, 0, 1}
end
return {now, now - began, tonumber(kept[3]) or 0}
