-- Fenced exclusive acquire for `Lock`. The unfenced one is a plain `SET NX PX` (see
-- `RedisStore::set_nx`); the writer key of `RwLock` has its own script.
-- KEYS[1] lock key, KEYS[2] fence counter
-- ARGV[1] secret, ARGV[2] TTL in ms
-- Returns {1, fence} when acquired, {0, pttl} when held.
--
-- A fence is max(last + 1, server time in µs): it grows with every acquisition, and one issued
-- after the counter was lost (a restart without persistence, a failover, a flush) is still above
-- every fence issued before, as long as the server clock did not step back. Written with %d:
-- Redis would turn a Lua number this large into a string with an exponent.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local fence = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, now)
  redis.call('SET', KEYS[2], string.format('%d', fence))
  return {1, fence}
end
return {0, redis.call('PTTL', KEYS[1])}
