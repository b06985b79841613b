-- Release of an exclusive or writer lease: only the holder's own token deletes the key, so a
-- holder whose lease ran out can never delete the next holder's lock.
-- KEYS[1] lock key; ARGV[1] secret. Returns 1 when released, 0 when the lease was gone.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
