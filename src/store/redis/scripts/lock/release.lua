-- Release of an exclusive or writer lease: only the holder's own secret deletes the key, so a
-- holder whose lease ran out can never delete the next holder's lock. A release publishes on
-- the lock's channel, waking waiters in other processes, only when a waiter marked the key
-- (the secret and `!`, see acquire.lua), or, for an idempotency reservation, always.
-- The message is the secret, by which the store that released knows its own when it hears it.
-- KEYS[1] lock key; ARGV[1] secret, ARGV[2] channel, ARGV[3] (optional) `1` to publish
-- unmarked too. Returns 1 when released, 0 when the lease was gone.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[3] then
    redis.call('PUBLISH', ARGV[2], ARGV[1])
  end
  return 1
end
if held == ARGV[1] .. '!' then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[1])
  return 1
end
return 0
