-- The fenced register, as the README advises a protected resource to be: a write carries its
-- fence and is accepted only if no later fence was accepted before (ARGV[3] = '1'); the
-- deliberately broken run writes unconditionally (ARGV[3] = '0'). Every accepted write is
-- appended to the register's log, in the order the resource accepted it.
-- KEYS[1] register, KEYS[2] its log; ARGV[1] fence, ARGV[2] process, ARGV[3] conditional.
local fence = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if ARGV[3] == '1' and fence < current then
  return 0
end
if fence > current then
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('RPUSH', KEYS[2], ARGV[1] .. ':' .. ARGV[2])
return 1
