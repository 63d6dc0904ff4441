-- name: fenced_write
-- version: 2
-- A write to a resource guarded by fencing tokens (see docs/fencing.md): it is
-- accepted only if its token is at least the largest token accepted before, so a
-- holder whose lock expired (paused, partitioned) cannot overwrite the work of a
-- later holder, whose token is larger. Equal tokens are accepted: one hold may write
-- many times. Tokens are compared as decimal strings, exactly at any size (never as
-- Lua numbers, which are exact only up to 2^53).
-- KEYS[1]  the guarded value (a string)
-- KEYS[2]  the largest token accepted so far (a string holding an integer)
-- ARGV[1]  the writer's token (a decimal integer from 0 to 2^63-1, no leading zeros)
-- ARGV[2]  the value to write
-- Reply    {1, token} written; {0, largest} refused: a larger token was accepted
--          before, and nothing changed (tokens as decimal strings)
local largest = redis.call('get', KEYS[2])
local token = ARGV[1]
if largest and (#largest > #token or (#largest == #token and largest > token)) then
  return {0, largest}
end
redis.call('set', KEYS[1], ARGV[2])
redis.call('set', KEYS[2], token)
return {1, token}
