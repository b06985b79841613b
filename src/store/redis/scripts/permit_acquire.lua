-- Acquire one permit of a `Semaphore`. Permits live in a sorted set scored by lease end (server
-- ms).
-- KEYS[1] permit set
-- ARGV[1] secret, ARGV[2] TTL in ms, ARGV[3] the most permits live at once
-- Returns {1, 0} when acquired, {0, ms until the earliest live permit ends} when all are taken.
--
-- Ended permits are dropped only when the set looks full: while it has room counting them, it
-- has room without them, so the common path makes four calls (TIME, ZCARD, ZADD, PEXPIREAT).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- Sets `key` to expire at `at` unless it already expires later: one call on Redis 7 when the
-- key is new (`NX`), two otherwise; older servers need `PTTL` first.
local function expire_at(key, at)
  if redis.REDIS_VERSION_NUM and redis.REDIS_VERSION_NUM >= 0x070000 then
    if redis.call('PEXPIREAT', key, at, 'NX') == 0 then
      redis.call('PEXPIREAT', key, at, 'GT')
    end
  elseif redis.call('PTTL', key) < at - now then
    redis.call('PEXPIREAT', key, at)
  end
end
local limit = tonumber(ARGV[3])
if redis.call('ZCARD', KEYS[1]) >= limit then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
  if redis.call('ZCARD', KEYS[1]) >= limit then
    -- A retry of an acquisition whose reply was lost finds our own permit in place: acquired.
    -- (With room left, the ZADD below takes it again, unchanged but for its lease end.)
    if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
      return {1, 0}
    end
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    -- No member at all only with a limit of 0, which the callers never send.
    return {0, first[2] and (tonumber(first[2]) - now) or 0}
  end
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
-- The set must outlive its longest permit, and no longer: its expiry only moves later.
expire_at(KEYS[1], now + ttl)
return {1, 0}
