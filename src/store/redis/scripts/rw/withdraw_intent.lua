-- Withdrawal of a write intent by the waiting writer that gives up: only an intent that still
-- holds its secret goes, so another writer's (one that wrote it since, and still waits) stays.
-- Readers were refused only by the intent, so its withdrawal publishes on the lock's channel, as
-- a release does, waking readers waiting in other processes, while a refused reader's mark
-- lives (read_acquire.lua).
-- KEYS[1] write intent, KEYS[2] the lock's waited mark; ARGV[1] secret, ARGV[2] channel. Returns 1 when withdrawn, 0 when the
-- intent was gone or another writer's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('PUBLISH', ARGV[2], '')
  end
  return 1
end
return 0
