-- Move one generation of the namespace's invalidation table (everything, or
-- one tag bucket), and tell every instance.
--
-- KEYS[1] table   hash {all = generation, b<n> = generation of tag bucket n}
-- ARGV[1] field   `all` or `b<n>`
-- ARGV[2] channel the namespace's event channel
-- ARGV[3] signed  `<instance>:<nonce>`, appended to the message
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
-- Returns {generation, instances that received the message}.
local function plain(s)
  return type(s) == 'string' and #s >= 1 and #s <= 16 and string.find(s, '^%d+$') ~= nil
    and tonumber(s) < 9007199254740992
end
local t = redis.call('TIME')
local clock = t[1] .. string.format('%06d', tonumber(t[2]))
local old = redis.call('HGET', KEYS[1], ARGV[1])
if plain(old) and tonumber(old) >= tonumber(clock) then
  if tonumber(old) + 1 >= 9007199254740992 then
    -- Nothing above it: starting again from the clock would go back below
    -- what entries recorded, so the invalidation fails instead.
    return redis.error_reply('stampede-guard: generation ' .. ARGV[1] .. ' exhausted')
  end
  redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
else
  redis.call('HSET', KEYS[1], ARGV[1], clock)
end
local gen = redis.call('HGET', KEYS[1], ARGV[1])
local receivers = redis.call('PUBLISH', ARGV[2], 'g:' .. ARGV[1] .. ':' .. gen .. ':' .. ARGV[3])
return {gen, receivers}
