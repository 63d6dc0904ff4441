-- name: fenced_write
-- version: 1
-- A write to a resource guarded by fencing tokens (see docs/fencing.md): it is
-- accepted only if its token is at least the largest token accepted before, so a
-- holder whose lock expired (paused, partitioned) cannot overwrite the work of a
-- later holder, whose token is larger. Equal tokens are accepted: one hold may write
-- many times.
-- KEYS[1]  the guarded value (a string)
-- KEYS[2]  the largest token accepted so far (a string holding an integer)
-- ARGV[1]  the writer's token (a decimal integer)
-- ARGV[2]  the value to write
-- Reply    {1, token} written; {0, largest} refused: a larger token was accepted
--          before, and nothing changed
local largest = redis.call('get', KEYS[2])
if largest and tonumber(largest) > tonumber(ARGV[1]) then
  return {0, tonumber(largest)}
end
redis.call('set', KEYS[1], ARGV[2])
redis.call('set', KEYS[2], ARGV[1])
return {1, tonumber(ARGV[1])}
