-- Release of a phase-fair `RwLock`'s writer lease (the others release with lock/release.lua):
-- only the holder's own secret deletes the key. The readers that waited for the write, and are
-- still waiting, become the read phase: they come in before the next writer, for at most the
-- phase's length. The release publishes on the lock's channel, waking them (and writers) in
-- other processes, when someone waits: a read phase begins, a waiter marked the key (its secret
-- and `!`, see read_acquire.lua) or the lock's waited mark lives.
-- The message is the secret, by which the store that released knows its own when it hears it.
-- KEYS[1] writer key, KEYS[2] waiting readers, KEYS[3] read phase, KEYS[4] the lock's waited
-- mark; ARGV[1] secret, ARGV[2]
-- channel, ARGV[3] how long a read phase lasts in ms. Returns 1 when released, 0 when the lease
-- was gone.
--
-- Without waiting readers, four calls: GET, DEL, EXISTS, EXISTS.
local held = redis.call('GET', KEYS[1])
local waited = held == ARGV[1] .. '!'
if held ~= ARGV[1] and not waited then
  return 0
end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  -- Notes of readers that gave up (or crashed) ended: they are not waited for.
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. now)
  if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('RENAME', KEYS[2], KEYS[3])
    redis.call('PEXPIRE', KEYS[3], ARGV[3])
    waited = true
  end
end
if waited or redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('PUBLISH', ARGV[2], ARGV[1])
end
return 1
