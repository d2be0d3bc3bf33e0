-- Read fields of the namespace's invalidation table, and its epoch. A
-- script calling HGET rather than HGETALL or HMGET: it needs no permission
-- the other scripts do not (an ACL user confined to the crate's commands can
-- run it).
--
-- KEYS[1] table   hash {epoch, purges = purge mark, all = generation of
--                 everything, and per service namespace its own and its
--                 tag buckets' generations (see bump_generation.lua)}
-- ARGV[1] floor   the epoch the caller knows (0 for none)
-- ARGV[2] seen    the epoch under which the caller saw its highest purge mark
-- ARGV[3] mark    that mark (0 for none; see note_purge.lua)
-- ARGV[4] channel the namespace's event channel
-- ARGV[5] signed  `<instance>:<nonce>`, appended to a repair's message
-- ARGV[6..]       the fields to read
--
-- The epoch names this life of the table: entries record it, and one
-- recorded under another epoch is a miss. A table that lost it (evicted,
-- deleted, Redis restarted empty), holds foreign bytes in it, or one behind
-- what the caller already knew (rewritten, or restored from an older copy)
-- starts a new life: every field of the old one is dropped (entries of the
-- old epoch are misses anyway) and the epoch starts again from Redis's clock
-- in microseconds, above the caller's. An epoch more than an hour ahead of
-- that clock is foreign too.
--
-- A table that kept its epoch but whose purge mark is below the one the
-- caller saw under that epoch went back in time: Redis was restored from a
-- copy older than a purge (or a replica that lagged took over), and the
-- entries that purge dropped may be back (every purge moves the mark:
-- note_purge.lua after a key's, bump_generation.lua with a tag's or
-- everything's). Every entry stored before is void then: `all` moves (as
-- bump_generation.lua moves it, and every instance hears it), and the mark
-- is set back to the caller's, so the repair is made once.
--
-- Returns {epoch, mark, the generation `all` moved to by a repair or '',
-- the fields' values in order, nil where absent}.
local function plain(s)
  return type(s) == 'string' and #s >= 1 and #s <= 16 and string.find(s, '^%d+$') ~= nil
    and tonumber(s) < 9007199254740992
end
local t = redis.call('TIME')
local clock = tonumber(t[1] .. string.format('%06d', tonumber(t[2])))
local floor = tonumber(ARGV[1]) or 0
local epoch = redis.call('HGET', KEYS[1], 'epoch')
local repaired = ''
if not (plain(epoch) and tonumber(epoch) >= 1000000000000000 and tonumber(epoch) >= floor
    and tonumber(epoch) <= clock + 3600000000) then
  local new = clock
  if new <= floor then
    new = floor + 1
  end
  epoch = string.format('%.0f', new)
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'epoch', epoch)
else
  local mark = redis.call('HGET', KEYS[1], 'purges')
  if not plain(mark) then
    mark = '0'
  end
  local seen = ARGV[3]
  if ARGV[2] == epoch and plain(seen) and tonumber(mark) < tonumber(seen) then
    local gen = clock
    if tonumber(epoch) >= gen then
      gen = tonumber(epoch) + 1
    end
    local old = redis.call('HGET', KEYS[1], 'all')
    if plain(old) and tonumber(old) >= gen then
      gen = tonumber(old) + 1
    end
    if gen >= 9007199254740992 then
      return redis.error_reply('stampede-guard: generation all exhausted')
    end
    repaired = string.format('%.0f', gen)
    redis.call('HSET', KEYS[1], 'all', repaired, 'purges', seen)
    redis.call('PUBLISH', ARGV[4], 'g:all:' .. repaired .. ':' .. ARGV[5])
  end
end
local mark = redis.call('HGET', KEYS[1], 'purges')
if not plain(mark) then
  mark = '0'
end
local out = {epoch, mark, repaired}
for i = 6, #ARGV do
  out[i - 2] = redis.call('HGET', KEYS[1], ARGV[i])
end
return out
