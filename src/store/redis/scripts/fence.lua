-- Prepended to the scripts that issue or check fencing numbers for cache
-- entries (fetch_or_lease.lua, commit.lua, invalidate.lua): Redis scripts
-- cannot share code otherwise.

-- Whether `s` is a number these scripts wrote: plain decimal digits, below
-- 2^53 (so Lua holds it exactly and INCR, HINCRBY can add to it). Anything
-- else (foreign bytes, an empty string, a sign, an exponent, 29 digits) is
-- treated as lost: reseeded from the clock, never fed to INCR for ever.
local function plain(s)
  return type(s) == 'string' and #s >= 1 and #s <= 16 and string.find(s, '^%d+$') ~= nil
    and tonumber(s) < 9007199254740992
end

-- Redis's clock in microseconds, as a string: a Lua number this large would
-- be sent as 1.7e+15.
local function clock()
  local t = redis.call('TIME')
  return t[1] .. string.format('%06d', tonumber(t[2]))
end

-- Make `key` live at least `ms` milliseconds more: never shortened (another
-- lease or value may need it longer), and a key left without a TTL gets one.
-- Every key these scripts write for an entry lives no longer than the entry
-- or the lease that needs it.
local function at_least(key, ms)
  if redis.call('PTTL', key) < tonumber(ms) then
    redis.call('PEXPIRE', key, ms)
  end
end

-- Fencing numbers only go up, for the life of the deployment. A fence hash
-- lives as long as the lease it was issued for (renewals included), then as
-- long as the value that lease stored: no longer. One lost to its own
-- expiry, to eviction or to a restart with empty memory starts again from
-- Redis's clock in microseconds: above every number issued before it (each
-- lease adds one; a microsecond passes far more often), so a lease issued
-- before the loss can no longer commit. Foreign bytes in the hash are
-- treated the same way.
local function seed_fence(key)
  local next = redis.call('HGET', key, 'next')
  local committed = redis.call('HGET', key, 'committed')
  if not plain(next) or (committed and not plain(committed)) then
    -- Gone, or foreign bytes HINCRBY would refuse for ever: both numbers
    -- start again above every one issued before.
    local seed = clock()
    if plain(next) and tonumber(next) > tonumber(seed) then
      seed = next
    end
    redis.call('HSET', key, 'next', seed)
    if committed then
      redis.call('HSET', key, 'committed', seed)
    end
  end
end


-- A group's generation (every variant of one URL): the prefix of every value
-- stored in the group. An invalidation moves it, so all the group's values,
-- and every lease taken under the old one, are void at once. It lives as
-- long as the longest of them: each lease makes it last its lease time at
-- least, each commit its value's keep. A lost generation starts again from
-- Redis's clock, like a fence hash: never a number some stored value or
-- running lease carries (those are all below the clock).
local function generation(key, keep)
  local g = redis.call('GET', key)
  if not plain(g) then
    -- Lost, or foreign bytes INCR would refuse: start again from the clock.
    g = clock()
    redis.call('SET', key, g)
  end
  at_least(key, keep)
  return g
end

-- The stored value if it belongs to generation `g` (nil: none). A value
-- with another generation's prefix, or with none at all (foreign bytes, or
-- an entry written before values carried one), is not the group's current
-- value: it is absent, and rebuilt.
local function current(value, g)
  if not value or not g then
    return nil
  end
  local tag = g .. '|'
  if string.sub(value, 1, #tag) == tag then
    return value
  end
  return nil
end
