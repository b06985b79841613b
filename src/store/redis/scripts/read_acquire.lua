-- Shared acquire for `RwLock`. Readers live in a sorted set scored by lease end (server ms).
-- KEYS[1] writer key, KEYS[2] reader set, KEYS[3] write intent, KEYS[4] fence counter (only when
-- fenced)
-- ARGV[1] secret, ARGV[2] TTL in ms
-- Returns {1, fence} when acquired (the current write generation, 0 when unfenced, never
-- written, or not acquired at all for an hour), {0, ms until the writer's lease ends} when a
-- writer holds, or {0, ms until the intent ends} while a writer of a writer-preferred lock waits
-- for the readers to leave.
--
-- Every call costs the server's CPU, and this script runs once per read, so the common path (no
-- writer, no intent) makes four: TIME, one EXISTS for both blockers, ZADD, PEXPIREAT. Ended readers
-- are not dropped here: they block no reader, the set never outlives its longest lease, and the
-- release, the extend and the write acquire drop them.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- Sets `key` to expire at `at` unless it already expires later: one call on Redis 7 when the
-- key is new (`NX`), two otherwise; older servers need `PTTL` first.
local function expire_at(key, at)
  if redis.REDIS_VERSION_NUM and redis.REDIS_VERSION_NUM >= 0x070000 then
    if redis.call('PEXPIREAT', key, at, 'NX') == 0 then
      redis.call('PEXPIREAT', key, at, 'GT')
    end
  elseif redis.call('PTTL', key) < at - now then
    redis.call('PEXPIREAT', key, at)
  end
end
-- The write generation, whose counter a reader keeps alive: it expires an hour after the
-- lock's last acquisition, read or write (or one TTL, if longer), so a name in use keeps its
-- generation, and one nobody uses leaves no key behind.
local function generation()
  if not KEYS[4] then
    return 0
  end
  local fence = redis.call('GET', KEYS[4])
  if not fence then
    return 0
  end
  redis.call('PEXPIRE', KEYS[4], math.max(3600000, tonumber(ARGV[2])))
  return tonumber(fence)
end
if redis.call('EXISTS', KEYS[1], KEYS[3]) > 0 then
  -- A writer holds only while no reader lease is live, so it never holds ours.
  local writer = redis.call('PTTL', KEYS[1])
  if writer ~= -2 then
    return {0, writer}
  end
  local intent = redis.call('PTTL', KEYS[3])
  if intent > 0 then
    -- A retry of an acquisition whose reply was lost finds our own live lease: acquired.
    local mine = redis.call('ZSCORE', KEYS[2], ARGV[1])
    if mine and tonumber(mine) >= now then
      return {1, generation()}
    end
    return {0, intent}
  end
end
local ttl = tonumber(ARGV[2])
-- A retry adds nothing new: it moves our own lease's end, as an extend would.
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
-- The set must outlive its longest reader lease, and no longer: its expiry only moves later.
expire_at(KEYS[2], now + ttl)
return {1, generation()}
