-- Release one permit of a `Semaphore`. Ended permits are dropped first, so a member that is still
-- in the set is a live lease. Every release frees a slot, so each one publishes on the
-- semaphore's channel, waking a waiter in another process.
-- KEYS[1] permit set; ARGV[1] secret, ARGV[2] channel. Returns 1 when released, 0 when the
-- permit was gone.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
local released = redis.call('ZREM', KEYS[1], ARGV[1])
if released == 1 then
  redis.call('PUBLISH', ARGV[2], '')
end
return released
