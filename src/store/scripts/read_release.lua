-- Release one reader lease. Expired readers are dropped first, so a member that is still in the
-- set is a live lease.
-- KEYS[1] reader set; ARGV[1] secret. Returns 1 when released, 0 when the lease was gone.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
return redis.call('ZREM', KEYS[1], ARGV[1])
