-- Exclusive acquire for `RwLock`: refused while a writer holds or any reader lease is live.
-- KEYS[1] writer key, KEYS[2] reader set, KEYS[3] write intent, KEYS[4] fence counter (only when
-- fenced)
-- ARGV[1] secret, ARGV[2] TTL in ms, ARGV[3] how long a write intent lasts in ms (0: the lock is
-- not writer-preferred, and a refused writer leaves none)
-- Returns {1, fence} when acquired (fence 0 when unfenced), {0, ms until the blocking lease ends}.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. now)
local writer = redis.call('PTTL', KEYS[1])
if writer ~= -2 then
  -- A retry of an acquisition whose reply was lost finds our own secret in place: acquired,
  -- with the fence we were given (the counter's value as long as we hold the lock).
  if redis.call('GET', KEYS[1]) == ARGV[1] then
    return {1, KEYS[4] and tonumber(redis.call('GET', KEYS[4]) or '0') or 0}
  end
  return {0, writer}
end
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if last[2] then
  -- Refused by readers: new readers are refused while the intent lives, so these end.
  -- The intent is published on the lock's channel (the writer key without its `:w`), so that
  -- processes sharing a reader lease among their requests stop admitting new ones at once,
  -- rather than at their next extend.
  if tonumber(ARGV[3]) > 0 then
    redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[3])
    redis.call('PUBLISH', string.sub(KEYS[1], 1, -3), 'w')
  end
  return {0, tonumber(last[2]) - now}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('DEL', KEYS[3])
if KEYS[4] then
  -- As in acquire.lua: max(last + 1, server time in µs), so fences survive a lost counter,
  -- and the counter expires an hour after the last acquisition (or one TTL, if longer).
  local micros = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local fence = math.max(tonumber(redis.call('GET', KEYS[4]) or '0') + 1, micros)
  local life = math.max(3600000, tonumber(ARGV[2]))
  redis.call('SET', KEYS[4], string.format('%d', fence), 'PX', life)
  return {1, fence}
end
return {1, 0}
