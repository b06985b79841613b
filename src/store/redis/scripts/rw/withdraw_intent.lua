-- Withdrawal of a write intent by the waiting writer that gives up: only an intent that still
-- holds its secret goes, so another writer's (one that wrote it since, and still waits) stays.
-- Readers were refused only by the intent, so its withdrawal publishes on the lock's channel, as
-- a release does, waking readers waiting in other processes.
-- KEYS[1] write intent; ARGV[1] secret, ARGV[2] channel. Returns 1 when withdrawn, 0 when the
-- intent was gone or another writer's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
return 0
