-- Record in the namespace's invalidation table that a key's group was
-- purged: its `purges` field moves up, as a generation does. Run after the
-- purge itself (invalidate.lua, in the key's own slot), so a copy of Redis
-- that holds the moved field also holds the purge.
--
-- KEYS[1] table   hash {epoch, purges = purge mark, all, b<n>}
--
-- The mark only goes up: above the old one and at least Redis's clock in
-- microseconds. An instance remembers the highest mark it saw under the
-- table's epoch; a table of the same epoch whose mark is below it is an
-- older copy (a restored snapshot, a replica that lagged) that may hold
-- entries purged since: load_generations.lua repairs it.
--
-- Returns {mark, epoch} ('': the table has no epoch yet).
local function plain(s)
  return type(s) == 'string' and #s >= 1 and #s <= 16 and string.find(s, '^%d+$') ~= nil
    and tonumber(s) < 9007199254740992
end
local t = redis.call('TIME')
local mark = tonumber(t[1] .. string.format('%06d', tonumber(t[2])))
local old = redis.call('HGET', KEYS[1], 'purges')
if plain(old) and tonumber(old) >= mark then
  mark = tonumber(old) + 1
end
if mark >= 9007199254740992 then
  return redis.error_reply('stampede-guard: purge mark exhausted')
end
mark = string.format('%.0f', mark)
redis.call('HSET', KEYS[1], 'purges', mark)
return {mark, redis.call('HGET', KEYS[1], 'epoch') or ''}
