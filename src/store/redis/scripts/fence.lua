-- Prepended to the scripts that issue or check fencing numbers for cache
-- entries (fetch_or_lease.lua, commit.lua, invalidate.lua): Redis scripts
-- cannot share code otherwise.
--
-- Fencing numbers only go up, for the life of the deployment. A fence hash
-- lost to a restart with empty memory, to eviction or to its own expiry
-- starts again from Redis's clock in microseconds: above every number issued
-- before it (each lease adds one; a microsecond passes far more often).
local function seed_fence(key)
  if redis.call('HEXISTS', key, 'next') == 0 then
    local t = redis.call('TIME')
    -- Built as a string: a Lua number this large would be sent as 1.7e+15.
    redis.call('HSET', key, 'next', t[1] .. string.format('%06d', tonumber(t[2])))
  end
end


-- A group's generation (every variant of one URL): the prefix of every value
-- stored in the group. An invalidation moves it, so all the group's values,
-- and every lease taken under the old one, are void at once. A lost
-- generation starts again from Redis's clock, like a fence hash: never a
-- number some stored value carries.
local function generation(key, keep)
  local g = redis.call('GET', key)
  if not g then
    local t = redis.call('TIME')
    g = t[1] .. string.format('%06d', tonumber(t[2]))
    redis.call('SET', key, g)
  end
  if redis.call('PTTL', key) < tonumber(keep) then
    redis.call('PEXPIRE', key, keep)
  end
  return g
end

-- The stored value if it belongs to generation `g` (nil: none). A value
-- with another generation's prefix is gone; one with no prefix at all is
-- foreign bytes, handed back for the caller to count as unreadable.
local function current(value, g)
  if not value then
    return nil
  end
  local tag = (g or '') .. '|'
  if g and string.sub(value, 1, #tag) == tag then
    return value
  end
  if string.find(string.sub(value, 1, 24), '^%d+|') then
    return nil
  end
  return value
end
