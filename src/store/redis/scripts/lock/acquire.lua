-- Fenced exclusive acquire for `Lock`. The unfenced one is a plain `SET NX PX` (see
-- `RedisStore::set_nx`); the writer key of `RwLock` has its own script.
-- KEYS[1] lock key, KEYS[2] fence counter
-- ARGV[1] secret, ARGV[2] TTL in ms
-- Returns one integer, as every acquire script does: the fence (0 or more) when acquired,
-- -3 - pttl when held (so -1 is a holder gone in between, -2 one without expiry). A table
-- would cost the server more to hand back than the rest of the script.
--
-- A fence is max(last + 1, server time in µs): it grows with every acquisition, and one issued
-- after the counter was lost (a restart without persistence, a failover, a flush) is still above
-- every fence issued before, as long as the server clock did not step back. Written with %d:
-- Redis would turn a Lua number this large into a string with an exponent.
--
-- So the counter only matters while it is ahead of the server clock, a few µs after its last
-- fence: it expires an hour after the lock's last acquisition (or one TTL, if longer), and a
-- name nobody uses leaves no key behind.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local fence = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, now)
  local life = math.max(3600000, tonumber(ARGV[2]))
  redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', life)
  return fence
end
-- A retry of an acquisition whose reply was lost finds our own secret in place: acquired, with
-- the fence we were given, which is the counter's value as long as we hold the lock.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
return -3 - redis.call('PTTL', KEYS[1])
