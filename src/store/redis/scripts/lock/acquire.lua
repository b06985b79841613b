-- Exclusive acquire for a fenced `Lock`, and for any `Lock` whose caller waits. The unfenced one
-- that does not wait is a plain `SET NX PX` (see `RedisStore::set_nx`); the writer key of
-- `RwLock` has its own script.
-- KEYS[1] lock key, KEYS[2] the waited-on mark, KEYS[3] fence counter (only when fenced)
-- ARGV[1] secret, ARGV[2] TTL in ms, ARGV[3] how long a refusal marks the name as waited on, in
-- ms (0: the caller does not wait, and marks nothing)
-- Returns one integer, as every acquire script does: the fence (0 or more; 0 unfenced) when
-- acquired, -3 - pttl when held (so -1 is a holder gone in between, -2 one without expiry). A
-- table would cost the server more to hand back than the rest of the script.
--
-- A refused caller that waits marks the name (KEYS[2], `PX` ARGV[3]) in this same call: the
-- release publishes only when it finds a mark, and a release after this refusal finds it. The
-- mark is set with `PSETEX` (`SET … PX` by another name), so that `INFO commandstats` counts
-- marks apart from the acquisitions' `SET`s.
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
  if not KEYS[3] then
    return 0
  end
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local fence = math.max(tonumber(redis.call('GET', KEYS[3]) or '0') + 1, now)
  local life = math.max(3600000, tonumber(ARGV[2]))
  redis.call('SET', KEYS[3], string.format('%d', fence), 'PX', life)
  return fence
end
-- A retry of an acquisition whose reply was lost finds our own secret in place: acquired, with
-- the fence we were given, which is the counter's value as long as we hold the lock.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return KEYS[3] and tonumber(redis.call('GET', KEYS[3]) or '0') or 0
end
if ARGV[3] ~= '0' then
  redis.call('PSETEX', KEYS[2], ARGV[3], '1')
end
return -3 - redis.call('PTTL', KEYS[1])
