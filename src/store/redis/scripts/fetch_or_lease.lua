-- Fetch an entry, and take the rebuild lease when it is not fresh.
-- One round trip for both: a fresh hit, and a miss that wins the lease.
--
-- KEYS[1] value   the encoded entry; its PX runs to the end of the last stale window
-- KEYS[2] fresh   marker whose PX is the remaining freshness (Redis's clock decides)
-- KEYS[3] lease   the rebuild lease: holds the owner's token
-- KEYS[4] fence   hash {next = last fencing number issued, committed = number of the stored value}
-- KEYS[5] gen     the group's generation; values carry it as a prefix, `<gen>|`
-- ARGV[1] token   random owner token for the lease
-- ARGV[2] lease   lease time in milliseconds
-- ARGV[3] early   -1, or take the lease even when the entry is fresh if at most
--                 this many milliseconds of freshness are left (early refresh;
--                 a newer entry than the caller's has more left and is returned)
-- ARGV[4] keep    fence hash lifetime in milliseconds
--
-- Returns {status, value, a, b, gen}:
--   {1, value, fresh_pttl, value_pttl, ""}   fresh hit
--   {2, value or "", fence, value_pttl, gen}  lease taken: rebuild, then commit with this fence and generation
--   {3, value or "", lease_pttl, value_pttl, ""}  another owner holds the lease
-- A value of an older generation of its group was invalidated: it is none.
local value = current(redis.call('GET', KEYS[1]), redis.call('GET', KEYS[5])) or ''
local value_pttl = redis.call('PTTL', KEYS[1])
local fresh_pttl = redis.call('PTTL', KEYS[2])
local early = tonumber(ARGV[3])
if value ~= '' and fresh_pttl > 0 and (early < 0 or fresh_pttl > early) then
  return {1, value, fresh_pttl, value_pttl, ''}
end
if redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[2]) then
  seed_fence(KEYS[4]) -- fence.lua, prepended
  local fence = redis.call('HINCRBY', KEYS[4], 'next', 1)
  redis.call('PEXPIRE', KEYS[4], ARGV[4])
  local gen = generation(KEYS[5], ARGV[4]) -- fence.lua, prepended
  return {2, value, fence, value_pttl, gen}
end
return {3, value, redis.call('PTTL', KEYS[3]), value_pttl, ''}
