-- The first look at a fenced idempotency key: the reservation and its fence in one step. (An
-- unfenced key is looked at by plain commands, `redis_idempotency.rs`.)
-- KEYS[1] the key: the holder's secret while a request runs, its record once it completed
-- (the request fingerprint (16 bytes), the completing secret (16 bytes), the response);
-- KEYS[2] fence counter
-- ARGV[1] secret, ARGV[2] TTL in ms
-- Returns {1, fence} reserved, {0, value, pttl} taken: the key's value and its PTTL.
local function fence()
  -- As acquire.lua: max(last + 1, server µs), so it keeps growing when the counter is lost.
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local value = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, now)
  redis.call('SET', KEYS[2], string.format('%d', value), 'PX', math.max(3600000, tonumber(ARGV[2])))
  return value
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, fence()}
end
local value = redis.call('GET', KEYS[1])
-- A retry of a begin whose reply was lost finds our own secret: reserved, with our fence.
if value == ARGV[1] then
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
return {0, value, redis.call('PTTL', KEYS[1])}
