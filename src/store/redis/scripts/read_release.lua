-- Release one reader lease: only a live one counts (an ended reader's lease is gone, and the
-- answer is 0 as if it had been dropped). The last live reader's release publishes on the
-- lock's channel, the reader set's key without its `:r`, waking a writer waiting in another
-- process.
-- KEYS[1] reader set; ARGV[1] secret. Returns 1 when released, 0 when the lease was gone.
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
-- The last reader's ZREM deletes the set; ended readers left behind are dropped with it.
local gone = redis.call('EXISTS', KEYS[1]) == 0
if not gone and redis.call('ZCOUNT', KEYS[1], now, '+inf') == 0 then
  redis.call('DEL', KEYS[1])
  gone = true
end
if gone then
  redis.call('PUBLISH', string.sub(KEYS[1], 1, -3), '')
end
return 1
