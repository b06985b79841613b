-- Exclusive acquire for `RwLock`: refused while a writer holds or any reader lease is live.
-- KEYS[1] writer key, KEYS[2] reader set, KEYS[3] fence counter (only when fenced)
-- ARGV[1] secret, ARGV[2] TTL in ms
-- Returns {1, fence} when acquired (fence 0 when unfenced), {0, ms until the blocking lease ends}.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. now)
local writer = redis.call('PTTL', KEYS[1])
if writer ~= -2 then
  return {0, writer}
end
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if last[2] then
  return {0, tonumber(last[2]) - now}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if KEYS[3] then
  -- As in acquire.lua: max(last + 1, server time in µs), so fences survive a lost counter.
  local micros = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local fence = math.max(tonumber(redis.call('GET', KEYS[3]) or '0') + 1, micros)
  redis.call('SET', KEYS[3], string.format('%d', fence))
  return {1, fence}
end
return {1, 0}
