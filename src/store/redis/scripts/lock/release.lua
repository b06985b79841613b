-- Release of an exclusive, writer or reservation lease: only the holder's own secret deletes the
-- key, so a holder whose lease ran out can never delete the next holder's lock.
-- KEYS[1] lock key, KEYS[2] (a `Lock`'s only) the waited-on mark; ARGV[1] secret, ARGV[2]
-- channel. Returns 1 when released, 0 when the lease was gone.
--
-- A `Lock`'s release publishes on its channel, waking waiters in other processes, only when a
-- refused caller that waits marked the name (see acquire.lua), and takes the mark with the key
-- in one `DEL` (2: both were there). Without a mark key (writers, reservations), every release
-- publishes.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if not KEYS[2] then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', ARGV[2], '')
  elseif redis.call('DEL', KEYS[1], KEYS[2]) == 2 then
    redis.call('PUBLISH', ARGV[2], '')
  end
  return 1
end
return 0
