-- A request that completed under its reservation: while the key still holds its secret, the
-- key takes its record for the retention, which ends the reservation (the lock scripts that
-- extend and release it compare the secret). Waiters elsewhere are told on the key's channel.
-- KEYS[1] the key
-- ARGV[1] secret (16 bytes), ARGV[2] fingerprint (16 bytes), ARGV[3] response, ARGV[4]
-- retention in ms, ARGV[5] channel
-- Returns 1 when stored, 0 when the reservation was not ours any more.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  -- Fingerprint first, then the secret: a look compares the one, a retry of this call the other.
  redis.call('SET', KEYS[1], ARGV[2] .. ARGV[1] .. ARGV[3], 'PX', ARGV[4])
  redis.call('PUBLISH', ARGV[5], '')
  return 1
end
-- A retry of a completion whose reply was lost finds its own record.
if redis.call('GETRANGE', KEYS[1], 16, 31) == ARGV[1] then
  return 1
end
return 0
