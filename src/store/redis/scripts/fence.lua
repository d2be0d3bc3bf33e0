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

