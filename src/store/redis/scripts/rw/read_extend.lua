-- Extend one reader lease to one full TTL from now; an expired reader is not re-added.
-- KEYS[1] reader set (or a semaphore's permit set), KEYS[2] write intent (readers only);
-- ARGV[1] secret, ARGV[2] TTL in ms.
-- Returns 0 when the lease is gone (not extended), 1 when extended, 2 when extended while a
-- write intent lives: new readers are refused then, and a process sharing this lease among its
-- requests stops admitting new ones to it.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
if KEYS[2] and redis.call('PTTL', KEYS[2]) > 0 then
  return 2
end
return 1
