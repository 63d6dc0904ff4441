-- name: fence
-- version: 2
-- The fencing counter of one lock on one master (see docs/fencing.md).
-- A counter that is absent (never written here, lost by a restart without
-- persistence, or expired) is "fresh": it is never created by 'next', only by
-- 'raise', so a fresh counter cannot pass for one that kept the last token.
-- Counters and tokens are decimal integers from 0 to 2^63-1 (Redis INCR's range).
-- They are never turned into Lua numbers (doubles, exact only up to 2^53): values
-- are replied as the decimal strings Redis stores, and compared as strings.
-- KEYS[1]  the lock's hash (its holder is a field of it)
-- KEYS[2]  the counter (a string holding an integer)
-- ARGV[1]  the operation; the rest depends on it:
--   next   ARGV[2] the holder's field in KEYS[1], ARGV[3] counter TTL in ms.
--          Where the field is present (the caller holds the lock here) and the
--          counter exists and is below 2^63-1: INCR it and refresh its TTL.
--          Reply {held, value, state}: held 1 if the field is present, else 0;
--          value a decimal string; state
--            0  value = the counter (after INCR if held): it was kept
--            1  value = this server's time in microseconds: the counter is absent
--            2  value = the counter, at 2^63-1 (or past it) and held: not stepped,
--               nothing changed
--   raise  ARGV[2] a token (a decimal integer from 0 to 2^63-1, no leading zeros),
--          ARGV[3] counter TTL in ms.
--          Sets the counter to max(counter, token) and refreshes its TTL.
--          Reply the counter's value afterwards (a decimal string)
-- A KEYS[2] that is not a string counter is refused with an error (nothing changes).
local MAX = '9223372036854775807'
-- a < b, for decimal integers >= 0 without leading zeros: exact at any size
local function less(a, b)
  return #a < #b or (#a == #b and a < b)
end
local op = ARGV[1]
local ttl = ARGV[3]
if op == 'next' then
  local held = redis.call('hexists', KEYS[1], ARGV[2])
  local value = redis.call('get', KEYS[2])
  if not value then
    local t = redis.call('time')
    return {held, string.format('%s%06d', t[1], t[2]), 1}
  end
  if held == 0 then
    return {0, value, 0}
  end
  if not less(value, MAX) then
    return {1, value, 2}
  end
  redis.call('incr', KEYS[2])
  redis.call('pexpire', KEYS[2], ttl)
  return {1, redis.call('get', KEYS[2]), 0}
elseif op == 'raise' then
  local current = redis.call('get', KEYS[2])
  if not current or less(current, ARGV[2]) then
    redis.call('set', KEYS[2], ARGV[2])
    current = ARGV[2]
  end
  redis.call('pexpire', KEYS[2], ttl)
  return current
end
return redis.error_reply('ERR fence: unknown operation ' .. tostring(op))
