-- Extend an exclusive or writer lease to one full TTL from now. Never re-acquires: once the key
-- is gone or belongs to someone else, the answer is 0. A key a waiter marked (the secret and
-- `!`, see acquire.lua) is still the holder's.
-- KEYS[1] lock key; ARGV[1] secret, ARGV[2] TTL in ms. Returns 1 when extended, 0 otherwise.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] or held == ARGV[1] .. '!' then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
