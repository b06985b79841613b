-- Release one permit of a `Semaphore` whose holder could not confirm it live (a holder that
-- did releases it in plain commands, `live_release.rs`): only a live one counts (an ended permit
-- is gone, and the answer is 0 as if it had been dropped). Every release frees a slot, so each
-- one publishes on the semaphore's channel, which is the set's own key, waking a waiter in
-- another process, while a refused waiter's mark lives (permit_acquire.lua); nobody would hear
-- it otherwise.
-- The message is the secret, by which the store that released knows its own when it hears it.
-- KEYS[1] permit set, KEYS[2] the waited mark; ARGV[1] secret. Returns 1 when released, 0 when
-- the permit was gone.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local mine = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not mine then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
if tonumber(mine) < now then
  return 0
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PUBLISH', KEYS[1], ARGV[1])
end
return 1
