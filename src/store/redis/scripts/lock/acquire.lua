-- Exclusive acquire for `Lock`: every fenced one, and an unfenced one for a waiter (whose
-- refusal marks the lock); the others are a plain `SET NX PX` (see `RedisStore::set_nx`). The
-- writer key of `RwLock` has its own script.
-- KEYS[1] lock key, KEYS[2] fence counter (only when fenced)
-- ARGV[1] secret, ARGV[2] TTL in ms, ARGV[3] `1` when the attempt is one of a bounded wait
-- Returns one integer, as every acquire script does: the fence (0 when unfenced) when acquired,
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
--
-- A waiter's refusal marks the lock: `!` after the holder's 16-byte secret, so the holder's
-- release (release.lua, or a native `DELIFEQ` that then finds its secret changed and runs
-- release.lua) publishes; a release nobody waits for publishes nothing. The mark goes with the
-- key. It is made in the script that refuses, so a release either came before the refusal (and
-- the key was free) or sees the mark.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if not KEYS[2] then
    return 0
  end
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local fence = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, now)
  local life = math.max(3600000, tonumber(ARGV[2]))
  redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', life)
  return fence
end
-- A retry of an acquisition whose reply was lost finds our own secret in place (marked or
-- not): acquired, with the fence we were given, the counter's value as long as we hold it.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] or held == ARGV[1] .. '!' then
  return KEYS[2] and tonumber(redis.call('GET', KEYS[2]) or '0') or 0
end
local left = redis.call('PTTL', KEYS[1])
-- Only a holder's 16-byte secret, unmarked, with an expiry (a key set without one is no lease).
if ARGV[3] == '1' and left > 0 and held and #held == 16 then
  if redis.REDIS_VERSION_NUM then
    redis.call('SET', KEYS[1], held .. '!', 'KEEPTTL')
  else
    -- Before 7.0 (no version number, maybe no KEEPTTL): a ms later rather than earlier.
    redis.call('SET', KEYS[1], held .. '!', 'PX', left + 1)
  end
end
return -3 - left
