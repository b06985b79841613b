-- Frees an idempotency key whose response is not stored (a 5xx): while the key holds the
-- reservation's secret, the reservation and the at-most-once marker go, so the next request
-- runs. Waiters elsewhere are told on the key's channel.
-- KEYS[1] the key, KEYS[2] marker; ARGV[1] secret, ARGV[2] channel.
-- Returns 1 when freed, 0 when the reservation was gone.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
return 0
