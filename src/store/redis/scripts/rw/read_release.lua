-- Release one reader lease whose holder could not confirm it live (a holder that did releases
-- it in plain commands, `live_release.rs`): only a live one counts (an ended reader's lease is
-- gone, and the answer is 0 as if it had been dropped). The last live reader's release
-- publishes on the lock's channel, the reader set's key without its `:r`, waking a writer
-- waiting in another process, while a refused writer's mark lives (write_acquire.lua); nobody
-- would hear it otherwise.
-- The message is the secret, by which the store that released knows its own when it hears it.
-- KEYS[1] reader set, KEYS[2] the lock's waited mark; ARGV[1] secret. Returns 1 when released,
-- 0 when the lease was gone.
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
-- The last reader's ZREM deletes the set; ended readers left behind are dropped with it. One
-- EXISTS asks for both the set and a waiter's mark: when this was the last reader and nobody
-- waits, it is the only call after the ZREM.
local left = redis.call('EXISTS', KEYS[1], KEYS[2])
if left == 0 then
  return 1
end
if left == 2 or redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('ZCOUNT', KEYS[1], now, '+inf') > 0 then
    return 1
  end
  redis.call('DEL', KEYS[1])
  -- The set was all that EXISTS found: no mark, nobody to wake.
  if left == 1 then
    return 1
  end
end
redis.call('PUBLISH', string.sub(KEYS[1], 1, -3), ARGV[1])
return 1
