-- The first look at an at-most-once idempotency key: as idem_begin.lua, and the reservation
-- leaves a marker for the retention. A free key whose marker lives had a holder that died
-- before it completed: its outcome is unknown, and it is not reserved again.
-- KEYS[1] the key (the holder's secret, or the record: fingerprint, completing secret,
-- response); KEYS[2] fence counter; KEYS[3] marker
-- ARGV[1] secret, ARGV[2] TTL in ms, ARGV[3] retention in ms, ARGV[4] '1' when fenced
-- Returns {1, fence} reserved (fence 0 unfenced), {0, value, pttl} taken, {2, pttl} unknown.
local function fence()
  if ARGV[4] ~= '1' then
    return 0
  end
  -- As acquire.lua: max(last + 1, server µs), so it keeps growing when the counter is lost.
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local value = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, now)
  redis.call('SET', KEYS[2], string.format('%d', value), 'PX', math.max(3600000, tonumber(ARGV[2])))
  return value
end
local value = redis.call('GET', KEYS[1])
if not value then
  local left = redis.call('PTTL', KEYS[3])
  if left ~= -2 then
    return {2, left}
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.call('SET', KEYS[3], '', 'PX', ARGV[3])
  return {1, fence()}
end
-- A retry of a begin whose reply was lost finds our own secret: reserved, with our fence.
if value == ARGV[1] then
  if ARGV[4] ~= '1' then
    return {1, 0}
  end
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
return {0, value, redis.call('PTTL', KEYS[1])}
