-- The first look at an idempotency key: in one step, a completed record answers (with its
-- response, or as a mismatch), else a live reservation answers in flight, else the reservation
-- is ours.
-- KEYS[1] record (hash: fp, response, by), KEYS[2] reservation, KEYS[3] fence counter (only
-- when fenced)
-- ARGV[1] secret, ARGV[2] TTL in ms, ARGV[3] request fingerprint
-- Returns {1, fence} reserved, {0, pttl} in flight, {2, response, pttl} completed, {3, 0}
-- mismatch.
local fp = redis.call('HGET', KEYS[1], 'fp')
if fp then
  if fp == ARGV[3] then
    return {2, redis.call('HGET', KEYS[1], 'response'), redis.call('PTTL', KEYS[1])}
  end
  return {3, 0}
end
local function fence(next)
  if not KEYS[3] then
    return 0
  end
  if not next then
    return tonumber(redis.call('GET', KEYS[3]) or '0')
  end
  -- As acquire.lua: max(last + 1, server µs), so it keeps growing when the counter is lost.
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local value = math.max(tonumber(redis.call('GET', KEYS[3]) or '0') + 1, now)
  redis.call('SET', KEYS[3], string.format('%d', value), 'PX', math.max(3600000, tonumber(ARGV[2])))
  return value
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, fence(true)}
end
-- A retry of a begin whose reply was lost finds our own secret: reserved, with our fence.
if redis.call('GET', KEYS[2]) == ARGV[1] then
  return {1, fence(false)}
end
return {0, redis.call('PTTL', KEYS[2])}
