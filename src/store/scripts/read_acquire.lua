-- Shared acquire for `RwLock`. Readers live in a sorted set scored by lease end (server ms).
-- KEYS[1] writer key, KEYS[2] reader set, KEYS[3] write intent, KEYS[4] fence counter (only when
-- fenced)
-- ARGV[1] secret, ARGV[2] TTL in ms
-- Returns {1, fence} when acquired (the current write generation, 0 when unfenced, never
-- written, or not acquired at all for an hour), {0, ms until the writer's lease ends} when a
-- writer holds, or {0, ms until the intent ends} while a writer of a writer-preferred lock waits
-- for the readers to leave.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. now)
-- The write generation, whose counter a reader keeps alive: it expires an hour after the
-- lock's last acquisition, read or write (or one TTL, if longer), so a name in use keeps its
-- generation, and one nobody uses leaves no key behind.
local function generation()
  if not KEYS[4] then
    return 0
  end
  local fence = redis.call('GET', KEYS[4])
  if not fence then
    return 0
  end
  redis.call('PEXPIRE', KEYS[4], math.max(3600000, tonumber(ARGV[2])))
  return tonumber(fence)
end
-- A retry of an acquisition whose reply was lost finds our own lease in place: acquired.
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return {1, generation()}
end
local writer = redis.call('PTTL', KEYS[1])
if writer ~= -2 then
  return {0, writer}
end
local intent = redis.call('PTTL', KEYS[3])
if intent > 0 then
  return {0, intent}
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
-- The set must outlive its longest reader lease, and no longer.
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[2], last[2])
return {1, generation()}
