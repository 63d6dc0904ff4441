-- name: fence
-- version: 1
-- The fencing counter of one lock on one master (see docs/fencing.md).
-- A counter that is absent (never written here, lost by a restart without
-- persistence, or expired) is "fresh": it is never created by 'next', only by
-- 'raise', so a fresh counter cannot pass for one that kept the last token.
-- KEYS[1]  the lock's hash (its holder is a field of it)
-- KEYS[2]  the counter (a string holding an integer)
-- ARGV[1]  the operation; the rest depends on it:
--   next   ARGV[2] the holder's field in KEYS[1], ARGV[3] counter TTL in ms.
--          Where the field is present (the caller holds the lock here) and the
--          counter exists: INCR it and refresh its TTL.
--          Reply {held, value, fresh}: held 1 if the field is present, else 0;
--          fresh 0 and value = the counter (after INCR if held) when it exists;
--          fresh 1 and value = this server's time in microseconds when it does not
--   raise  ARGV[2] a token (a decimal integer), ARGV[3] counter TTL in ms.
--          Sets the counter to max(counter, token) and refreshes its TTL.
--          Reply the counter's value afterwards
-- A KEYS[2] that is not a string counter is refused with an error (nothing changes).
local op = ARGV[1]
local ttl = ARGV[3]
if op == 'next' then
  local held = redis.call('hexists', KEYS[1], ARGV[2])
  if redis.call('exists', KEYS[2]) == 0 then
    local t = redis.call('time')
    return {held, tonumber(t[1]) * 1000000 + tonumber(t[2]), 1}
  end
  if held == 1 then
    local value = redis.call('incr', KEYS[2])
    redis.call('pexpire', KEYS[2], ttl)
    return {1, value, 0}
  end
  return {0, tonumber(redis.call('get', KEYS[2])), 0}
elseif op == 'raise' then
  local current = redis.call('get', KEYS[2])
  if not current or tonumber(current) < tonumber(ARGV[2]) then
    redis.call('set', KEYS[2], ARGV[2])
    current = ARGV[2]
  end
  redis.call('pexpire', KEYS[2], ttl)
  return tonumber(current)
end
return redis.error_reply('ERR fence: unknown operation ' .. tostring(op))
