-- A request that completed under its reservation: its record is stored for the retention and
-- the reservation ends, only while the reservation is still ours. Waiters elsewhere are told
-- on the key's channel.
-- KEYS[1] record, KEYS[2] reservation
-- ARGV[1] secret, ARGV[2] fingerprint, ARGV[3] response, ARGV[4] retention in ms,
-- ARGV[5] channel
-- Returns 1 when stored, 0 when the reservation was not ours any more.
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('HSET', KEYS[1], 'fp', ARGV[2], 'response', ARGV[3], 'by', ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  redis.call('DEL', KEYS[2])
  redis.call('PUBLISH', ARGV[5], '')
  return 1
end
-- A retry of a completion whose reply was lost finds its own record.
if redis.call('HGET', KEYS[1], 'by') == ARGV[1] then
  return 1
end
return 0
