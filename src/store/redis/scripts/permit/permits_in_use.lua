-- How many permits of a `Semaphore` are live: members whose lease ends now or later. Reads only,
-- so it leaves ended members for the next acquire to drop.
-- KEYS[1] permit set. Returns the count.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], now, '+inf')
