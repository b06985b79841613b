-- Exclusive acquire for `RwLock`: refused while a writer holds, any reader lease is live, or a
-- read phase (phase-fair locks: the readers that waited for the last write, see read_acquire.lua)
-- has readers still to come in.
-- KEYS[1] writer key, KEYS[2] reader set, KEYS[3] write intent, KEYS[4] waiting readers (not
-- used here: they wait for this writer, and its release lets them in), KEYS[5] read phase,
-- KEYS[6] the lock's waited mark, KEYS[7] fence counter (only when fenced)
-- ARGV[1] secret, ARGV[2] TTL in ms, ARGV[3] how long a write intent lasts in ms (0: the lock is
-- readers-first, and a refused writer leaves none), ARGV[4] `0` unless the lock is phase-fair;
-- then `1`, or `2` for an attempt of a bounded wait: refused by a writer, it leaves its intent too
-- (the reads that come after it wait for it). Phase-fair writers that wait go in the order their
-- waits began: a secret's first six bytes are the wait's start in ms (big-endian), and the live
-- intent of a writer whose wait began earlier refuses this one (its time left); a later one's this
-- one takes over, as if there were none. ARGV[5] how long a waiter's mark lasts in ms when the
-- attempt is one of a bounded wait, else `0`.
-- Returns one integer (see acquire.lua): the fence (0 when unfenced) when acquired, -3 - the ms
-- until the blocking lease (or read phase) ends when refused.
--
-- With no reader set, no intent and no read phase, the common path is two calls (EXISTS, SET
-- NX); else five (EXISTS, TIME, the latest live reader, SET NX, one DEL for the intent and the
-- ended readers). A fenced acquisition adds the counter's.
--
-- A waiting writer refused marks what refused it, so that its end publishes (and releases
-- nobody waits for publish nothing): a writer's key (its secret and `!`, as acquire.lua marks a
-- lock), or else the lock's waited mark (readers, a read phase, an earlier writer's intent),
-- which the last reader's release and an intent's withdrawal check. A writer that acquires
-- while that mark lives takes its key marked: readers refused by its intent wait for its end.
local time
if redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[5], KEYS[6]) > 0 then
  if ARGV[4] == '2' then
    local first = redis.call('GET', KEYS[3])
    if first and first ~= ARGV[1] then
      -- The wait starts, compared as numbers: Lua compares strings by the server's locale.
      local a1, a2, a3, a4, a5, a6 = string.byte(first, 1, 6)
      local b1, b2, b3, b4, b5, b6 = string.byte(ARGV[1], 1, 6)
      local theirs = ((((a1 * 256 + a2) * 256 + a3) * 256 + a4) * 256 + a5) * 256 + a6
      local ours = ((((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6
      if theirs <= ours then
        -- A phase-fair writer that began waiting before this one (or with it) goes first; not
        -- before this one's own live lease, though (a resend whose reply was lost: acquired
        -- below, or the lease it holds would refuse everyone for its TTL).
        local held = redis.call('GET', KEYS[1])
        if held ~= ARGV[1] and held ~= ARGV[1] .. '!' then
          if ARGV[5] ~= '0' then
            redis.call('SET', KEYS[6], '', 'PX', ARGV[5])
          end
          return -3 - redis.call('PTTL', KEYS[3])
        end
      end
    end
  end
  time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local last = redis.call('ZREVRANGEBYSCORE', KEYS[2], '+inf', now, 'WITHSCORES', 'LIMIT', 0, 1)
  local blocked
  if last[2] then
    -- Ended readers go, so that a set kept alive by readers that never stop holds no crashed
    -- ones for long.
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. now)
    blocked = tonumber(last[2]) - now
  else
    -- The readers of a read phase come in before this writer.
    local phase = redis.call('PTTL', KEYS[5])
    if phase > 0 then
      blocked = phase
    end
  end
  if blocked then
    if ARGV[5] ~= '0' then
      redis.call('SET', KEYS[6], '', 'PX', ARGV[5])
    end
    -- Refused by readers (a writer never holds while one is live, or during a read phase). New
    -- readers are refused while the intent lives, so these end. The intent is published on the
    -- lock's channel (the writer key without its `:w`), so that processes sharing a reader lease
    -- among their requests stop admitting new ones at once, rather than at their next extend.
    if tonumber(ARGV[3]) > 0 then
      redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[3])
      redis.call('PUBLISH', string.sub(KEYS[1], 1, -3), 'w')
    end
    return -3 - blocked
  end
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  -- A retry of an acquisition whose reply was lost finds our own secret in place: acquired,
  -- with the fence we were given (the counter's value as long as we hold the lock).
  local held = redis.call('GET', KEYS[1])
  if held == ARGV[1] or held == ARGV[1] .. '!' then
    return KEYS[7] and tonumber(redis.call('GET', KEYS[7]) or '0') or 0
  end
  if ARGV[4] == '2' then
    redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[3])
  end
  local left = redis.call('PTTL', KEYS[1])
  if ARGV[5] ~= '0' and left > 0 and held and #held == 16 then
    if redis.REDIS_VERSION_NUM then
      redis.call('SET', KEYS[1], held .. '!', 'KEEPTTL')
    else
      redis.call('SET', KEYS[1], held .. '!', 'PX', left + 1)
    end
  end
  return -3 - left
end
if time then
  -- No reader is live: the set holds only ended ones, if it is there at all. The waiting
  -- readers stay, for this write's release.
  redis.call('DEL', KEYS[3], KEYS[2])
  if redis.call('EXISTS', KEYS[6]) == 1 then
    redis.call('SET', KEYS[1], ARGV[1] .. '!', 'PX', ARGV[2])
  end
end
if not KEYS[7] then
  return 0
end
-- As in acquire.lua: max(last + 1, server time in µs), so fences survive a lost counter, and
-- the counter expires an hour after the last acquisition (or one TTL, if longer).
time = time or redis.call('TIME')
local micros = tonumber(time[1]) * 1000000 + tonumber(time[2])
local fence = math.max(tonumber(redis.call('GET', KEYS[7]) or '0') + 1, micros)
local life = math.max(3600000, tonumber(ARGV[2]))
redis.call('SET', KEYS[7], string.format('%d', fence), 'PX', life)
return fence
