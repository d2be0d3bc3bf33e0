-- Read fields of the namespace's invalidation table, and its epoch. A
-- script calling HGET rather than HGETALL or HMGET: it needs no permission
-- the other scripts do not (an ACL user confined to the crate's commands can
-- run it).
--
-- KEYS[1] table   hash {epoch, all = generation, b<n> = generation of tag bucket n}
-- ARGV[1] floor   the epoch the caller knows (0 for none)
-- ARGV[2..]       the fields to read
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
-- Returns {epoch, the fields' values in order, nil where absent}.
local function plain(s)
  return type(s) == 'string' and #s >= 1 and #s <= 16 and string.find(s, '^%d+$') ~= nil
    and tonumber(s) < 9007199254740992
end
local t = redis.call('TIME')
local clock = tonumber(t[1] .. string.format('%06d', tonumber(t[2])))
local floor = tonumber(ARGV[1]) or 0
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not (plain(epoch) and tonumber(epoch) >= 1000000000000000 and tonumber(epoch) >= floor
    and tonumber(epoch) <= clock + 3600000000) then
  local new = clock
  if new <= floor then
    new = floor + 1
  end
  epoch = string.format('%.0f', new)
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'epoch', epoch)
end
local out = {epoch}
for i = 2, #ARGV do
  out[i] = redis.call('HGET', KEYS[1], ARGV[i])
end
return out
