-- Acquire one permit of a `Semaphore`. Permits live in a sorted set scored by lease end (server
-- ms).
-- KEYS[1] permit set, KEYS[2] the semaphore's waited mark
-- ARGV[1] secret, ARGV[2] TTL in ms, ARGV[3] the most permits live at once, ARGV[4] how long a
-- waiter's mark lasts in ms (0 when the attempt is not one of a bounded wait)
-- Returns one integer (see acquire.lua): 0 when acquired, -3 - the ms until the earliest live
-- permit ends when all are taken.
--
-- Ended permits are dropped only when the set looks full and its earliest lease end has passed:
-- while it has room counting them, it has room without them, so the common path makes four
-- calls (TIME, ZCARD, ZADD, PEXPIREAT), and a refusal four or five (TIME, ZCARD, ZRANGE,
-- ZSCORE, and SET for a waiter) where it made six or seven with a sweep every time.
-- No helper functions: a script's body runs whole on every call.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local limit = tonumber(ARGV[3])
if redis.call('ZCARD', KEYS[1]) >= limit then
  -- The earliest lease end says whether any permit ended: a full set of live permits (the
  -- refusal of every contended attempt) is answered without a sweep, and with the wait.
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local full = true
  if first[2] and tonumber(first[2]) < now then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
    full = redis.call('ZCARD', KEYS[1]) >= limit
    if full then
      first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    end
  end
  if full then
    -- A retry of an acquisition whose reply was lost finds our own permit in place: acquired.
    -- (With room left, the ZADD below takes it again, unchanged but for its lease end.)
    if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
      return 0
    end
    -- A waiter refused marks the semaphore, so that releases publish (permit_release.lua)
    -- until the mark ends: it outlives the waiter's wait until its next attempt, which marks
    -- again if refused again.
    if ARGV[4] ~= '0' then
      redis.call('SET', KEYS[2], '', 'PX', ARGV[4])
    end
    -- No member at all only with a limit of 0, which the callers never send.
    return -3 - (first[2] and math.max(tonumber(first[2]) - now, 0) or 0)
  end
end
local at = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], at, ARGV[1])
-- The set must outlive its longest permit, and no longer: its expiry only moves later (NX sets
-- it on a new set, GT moves it on an old one; older servers have neither).
if not redis.REDIS_VERSION_NUM or redis.REDIS_VERSION_NUM < 0x070000 then
  if redis.call('PTTL', KEYS[1]) < at - now then
    redis.call('PEXPIREAT', KEYS[1], at)
  end
elseif redis.call('PEXPIREAT', KEYS[1], at, 'NX') == 0 then
  redis.call('PEXPIREAT', KEYS[1], at, 'GT')
end
return 0
