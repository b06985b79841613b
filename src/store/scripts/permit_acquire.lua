-- Acquire one permit of a `Semaphore`. Permits live in a sorted set scored by lease end (server
-- ms); ended permits are dropped first, so every member counted is a live lease.
-- KEYS[1] permit set
-- ARGV[1] secret, ARGV[2] TTL in ms, ARGV[3] the most permits live at once
-- Returns {1, 0} when acquired, {0, ms until the earliest live permit ends} when all are taken.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  -- A retry of an acquisition whose reply was lost finds our own permit in place: acquired.
  -- (With room left, the ZADD below takes it again, unchanged but for its lease end.)
  if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
    return {1, 0}
  end
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  -- No member at all only with a limit of 0, which the callers never send.
  return {0, first[2] and (tonumber(first[2]) - now) or 0}
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
-- The set must outlive its longest permit, and no longer.
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
return {1, 0}
