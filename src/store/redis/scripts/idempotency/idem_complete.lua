-- A request that completed under its reservation: while the key still holds its secret, the
-- key takes its record for the retention, which ends the reservation (the lock scripts that
-- extend and release it compare the secret). Waiters elsewhere are told on the key's channel.
-- An empty key takes the record too: the reservation ran out, or a restart lost it, and
-- nobody else took the key, so the request ran once, and its record is what retries must get.
-- KEYS[1] the key
-- ARGV[1] secret (16 bytes), ARGV[2] fingerprint (16 bytes), ARGV[3] response, ARGV[4]
-- retention in ms, ARGV[5] channel
-- Returns 1 when stored, 0 when another request holds or completed the key.
local value = redis.call('GET', KEYS[1])
if value == ARGV[1] or not value then
  -- Fingerprint first, then the secret: a look compares the one, a retry of this call the other.
  redis.call('SET', KEYS[1], ARGV[2] .. ARGV[1] .. ARGV[3], 'PX', ARGV[4])
  redis.call('PUBLISH', ARGV[5], '')
  return 1
end
-- A retry of a completion whose reply was lost finds its own record.
if string.sub(value, 17, 32) == ARGV[1] then
  return 1
end
return 0
