-- Fenced exclusive acquire for `Lock`. The unfenced one is `SET NX PX` + `PTTL` in a pipeline (see
-- `RedisStore::set_nx`); the writer key of `RwLock` has its own script.
-- KEYS[1] lock key, KEYS[2] fence counter
-- ARGV[1] secret, ARGV[2] TTL in ms
-- Returns {1, fence} when acquired, {0, pttl} when held.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('INCR', KEYS[2])}
end
return {0, redis.call('PTTL', KEYS[1])}
