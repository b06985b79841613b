-- Release of an exclusive or writer lease: only the holder's own secret deletes the key, so a
-- holder whose lease ran out can never delete the next holder's lock. A release that frees the
-- lock publishes on its channel, waking waiters in other processes.
-- KEYS[1] lock key; ARGV[1] secret, ARGV[2] channel. Returns 1 when released, 0 when the lease
-- was gone.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
return 0
