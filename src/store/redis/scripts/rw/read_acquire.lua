-- Shared acquire for `RwLock`. Readers live in a sorted set scored by lease end (server ms).
-- KEYS[1] writer key, KEYS[2] reader set, KEYS[3] write intent, KEYS[4] waiting readers, KEYS[5]
-- read phase, KEYS[6] the lock's waited mark, KEYS[7] fence counter (only when fenced)
-- ARGV[1] secret, ARGV[2] TTL in ms, ARGV[3] how long a read phase lasts in ms (0: the lock is not
-- phase-fair), ARGV[4] how long a waiter's mark lasts in ms when the attempt is one of a bounded
-- wait (it comes back with the same secret), else `0`
-- Returns one integer (see acquire.lua): when acquired, the current write generation (0 when
-- unfenced, never written, or not acquired at all for an hour); when refused, -3 - the ms until
-- the writer's lease ends, or until the intent ends while a writer waits for the readers to leave.
--
-- Phase-fair locks: a waiting reader refused by a writer or an intent is noted in the waiting
-- readers (a sorted set of secrets scored by the note's end: the refusal's wait plus two read
-- phases); a writer's release (write_release.lua) makes them the read phase, whose readers enter
-- despite a newer intent, each leaving the phase (and the waiting readers) as it enters.
--
-- A waiting reader refused marks what refused it, so that its end publishes: the writer's key
-- (its secret and `!`, as acquire.lua marks a lock; the writer's release publishes for it), or
-- for an intent the lock's waited mark (the intent's withdrawal publishes while it lives, and a
-- writer that acquires while it lives takes its key marked). Releases nobody waits for publish
-- nothing.
--
-- Every call costs the server's CPU, and this script runs once per read, so the common path (no
-- writer, no intent, nobody waiting) makes four: TIME, one EXISTS for every blocker, ZADD,
-- PEXPIREAT. Ended readers are not dropped here: they block no reader, the set never outlives its
-- longest lease, and the release, the extend and the write acquire drop them. No helper
-- functions: a script's body runs whole on every call, so each one would be a closure made anew
-- each time.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- Set when a retry finds our own live lease behind an intent: acquired, nothing to add.
local kept = false
if redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[4], KEYS[5]) > 0 then
  local phase = tonumber(ARGV[3])
  -- How long what refuses us lasts, if something does.
  local blocked
  -- A writer holds only while no reader lease is live, so it never holds ours.
  local writer = redis.call('PTTL', KEYS[1])
  if writer ~= -2 then
    blocked = writer
  else
    local intent = redis.call('PTTL', KEYS[3])
    if intent > 0 then
      -- A retry of an acquisition whose reply was lost finds our own live lease: acquired.
      local mine = redis.call('ZSCORE', KEYS[2], ARGV[1])
      if mine and tonumber(mine) >= now then
        kept = true
      elseif phase == 0 or redis.call('ZREM', KEYS[5], ARGV[1]) == 0 then
        -- Not one of the read phase that waited for the last write: after the intent's writer.
        blocked = intent
      end
    end
  end
  if blocked then
    if ARGV[4] ~= '0' then
      if writer ~= -2 then
        local held = redis.call('GET', KEYS[1])
        if writer > 0 and held and #held == 16 then
          if redis.REDIS_VERSION_NUM then
            redis.call('SET', KEYS[1], held .. '!', 'KEEPTTL')
          else
            redis.call('SET', KEYS[1], held .. '!', 'PX', writer + 1)
          end
        end
      else
        redis.call('SET', KEYS[6], '', 'PX', ARGV[4])
      end
    end
    if phase > 0 and ARGV[4] ~= '0' then
      -- Noted as waiting until its next attempt, and two read phases more.
      local ends = now + math.max(blocked, 0) + 2 * phase
      redis.call('ZADD', KEYS[4], ends, ARGV[1])
      if redis.call('PTTL', KEYS[4]) < ends - now then
        redis.call('PEXPIREAT', KEYS[4], ends)
      end
    end
    return -3 - blocked
  end
  if phase > 0 and ARGV[4] ~= '0' then
    -- In: it waits no more (and, entering without an intent, leaves its phase).
    redis.call('ZREM', KEYS[4], ARGV[1])
    redis.call('ZREM', KEYS[5], ARGV[1])
  end
end
if not kept then
  local at = now + tonumber(ARGV[2])
  -- A retry adds nothing new: it moves our own lease's end, as an extend would.
  redis.call('ZADD', KEYS[2], at, ARGV[1])
  -- The set must outlive its longest reader lease, and no longer: its expiry only moves later
  -- (NX sets it on a new set, GT moves it on an old one; older servers have neither).
  if not redis.REDIS_VERSION_NUM or redis.REDIS_VERSION_NUM < 0x070000 then
    if redis.call('PTTL', KEYS[2]) < at - now then
      redis.call('PEXPIREAT', KEYS[2], at)
    end
  elseif redis.call('PEXPIREAT', KEYS[2], at, 'NX') == 0 then
    redis.call('PEXPIREAT', KEYS[2], at, 'GT')
  end
end
-- The write generation, whose counter a reader keeps alive: it expires an hour after the
-- lock's last acquisition, read or write (or one TTL, if longer), so a name in use keeps its
-- generation, and one nobody uses leaves no key behind.
if not KEYS[7] then
  return 0
end
local fence = redis.call('GET', KEYS[7])
if not fence then
  return 0
end
redis.call('PEXPIRE', KEYS[7], math.max(3600000, tonumber(ARGV[2])))
return tonumber(fence)
