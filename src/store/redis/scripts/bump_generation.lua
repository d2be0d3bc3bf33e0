-- Move one generation of the namespace's invalidation table (everything, or
-- one tag bucket), and tell every instance.
--
-- KEYS[1] table   hash {epoch, purges, all = generation of everything,
--                 then per service namespace its own generation and one
--                 per tag bucket n: `n.all` and `b<n>` for no namespace,
--                 `s<16 hex>.all` and `s<16 hex>.b<n>` for a named one}
-- ARGV[1] field   one of those generation fields
-- ARGV[2] channel the namespace's event channel
-- ARGV[3] signed  `<instance>:<nonce>`, appended to the message
-- ARGV[4] floor   the highest epoch the caller read (0 for none)
--
-- A table with no epoch it may keep (lost to a restart with empty memory
-- or an eviction, foreign bytes, behind the caller's: the rule of
-- load_generations.lua) starts its new life here, before the move: the
-- next read would otherwise take it for a lost table and drop every field,
-- this move among them, after the invalidation returned.
--
-- A generation only goes up, for the life of the deployment: the new one is
-- above the old one and at least Redis's clock in microseconds. A table lost
-- to a restart with empty memory, or restored from an older snapshot, so
-- starts again above every generation issued before (entries in the
-- instances' memory recorded those), as long as fewer than a million
-- invalidations a second hit one field. Foreign bytes in the field count as
-- lost: the field starts again from the clock (an invalidation). A field at
-- 2^53 - 1 cannot move up: the call fails rather than go back.
--
-- It is also above the table's epoch: entries record every generation as at
-- least the epoch, and an epoch may be ahead of Redis's clock (started above
-- the one an instance knew, after Redis lost the table on a host whose
-- clock is behind; see load_generations.lua). A move to the clock alone
-- would stay below what those entries recorded and purge none of them.
--
-- The table's purge mark moves too (see note_purge.lua): a copy of the
-- table from before this move is told from the real one.
--
-- Returns {generation, instances that received the message, purge mark,
-- epoch ('': the table has none yet)}.
local function plain(s)
  return type(s) == 'string' and #s >= 1 and #s <= 16 and string.find(s, '^%d+$') ~= nil
    and tonumber(s) < 9007199254740992
end
local t = redis.call('TIME')
local least = tonumber(t[1] .. string.format('%06d', tonumber(t[2])))
local floor = tonumber(ARGV[4]) or 0
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not (plain(epoch) and tonumber(epoch) >= 1000000000000000 and tonumber(epoch) >= floor
    and tonumber(epoch) <= least + 3600000000) then
  local new = least
  if new <= floor then
    new = floor + 1
  end
  epoch = string.format('%.0f', new)
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'epoch', epoch)
end
if plain(epoch) and tonumber(epoch) >= least then
  least = tonumber(epoch) + 1
end
local old = redis.call('HGET', KEYS[1], ARGV[1])
local gen = least
if plain(old) and tonumber(old) >= least then
  gen = tonumber(old) + 1
end
if gen >= 9007199254740992 then
  -- Nothing above it: starting again from the clock would go back below
  -- what entries recorded, so the invalidation fails instead.
  return redis.error_reply('stampede-guard: generation ' .. ARGV[1] .. ' exhausted')
end
gen = string.format('%.0f', gen)
local mark = tonumber(t[1] .. string.format('%06d', tonumber(t[2])))
local old_mark = redis.call('HGET', KEYS[1], 'purges')
if plain(old_mark) and tonumber(old_mark) >= mark then
  mark = math.min(tonumber(old_mark) + 1, 9007199254740991)
end
mark = string.format('%.0f', mark)
redis.call('HSET', KEYS[1], ARGV[1], gen, 'purges', mark)
local receivers = redis.call('PUBLISH', ARGV[2], 'g:' .. ARGV[1] .. ':' .. gen .. ':' .. ARGV[3])
return {gen, receivers, mark, redis.call('HGET', KEYS[1], 'epoch') or ''}
