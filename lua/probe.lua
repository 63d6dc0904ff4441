-- name: probe
-- version: 1
-- Reads a lock without changing it.
-- KEYS[1]  the lock hash
-- Reply    {pttl, {field, value, ...}}: pttl in ms (-2 when the key is absent) and the
--          hash's fields (owner -> hold count); an error reply for a non-hash key
return {redis.call('pttl', KEYS[1]), redis.call('hgetall', KEYS[1])}
