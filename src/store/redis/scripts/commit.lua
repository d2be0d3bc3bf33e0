-- Store a rebuilt entry, unless a newer one is already there; release the
-- lease if it is still ours; wake every waiter in the fleet.
--
-- KEYS[1] value   the encoded entry
-- KEYS[2] fresh   freshness marker
-- KEYS[3] lease   the rebuild lease
-- KEYS[4] fence   hash {next, committed}
-- KEYS[5] gen     the group's generation
-- ARGV[1] token   our lease token
-- ARGV[2] fence   our fencing number
-- ARGV[3] entry   the encoded entry, prefixed with `<gen>|`
-- ARGV[4] fresh   freshness in milliseconds (0: share, do not mark fresh)
-- ARGV[5] keep    value lifetime in milliseconds: freshness plus the longest stale window
-- ARGV[6] fkeep   fence hash lifetime in milliseconds
-- ARGV[7] channel the namespace's event channel
-- ARGV[8] message the wake-up message for this key
-- ARGV[9] refused the failure notice, sent when a newer entry won
-- ARGV[10] gen    the group's generation when the lease was taken
-- KEYS[6] failed  the failure marker (release.lua): a stored entry ends the episode
--
-- Returns 1 when stored, 0 when fenced off: a newer entry was stored, an
-- invalidation came, or a newer lease was issued after ours (ours lapsed and
-- another holder is rebuilding from fresher data), or the group was
-- invalidated since the lease was taken (its generation moved).
-- A fence hash that is gone (evicted, expired, lost to a restart) proves
-- nothing about this lease's age: reseed it, above every number issued
-- before, so an older lease's commit is refused rather than trusted.
seed_fence(KEYS[4]) -- fence.lua, prepended
local committed = tonumber(redis.call('HGET', KEYS[4], 'committed') or '0')
local issued = tonumber(redis.call('HGET', KEYS[4], 'next') or '0')
local fence = tonumber(ARGV[2])
local stored = 0
local gen = redis.call('GET', KEYS[5])
if fence >= committed and fence >= issued and gen == ARGV[10] then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[5])
  if tonumber(ARGV[4]) > 0 then
    redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[4])
  else
    redis.call('DEL', KEYS[2])
  end
  redis.call('HSET', KEYS[4], 'committed', fence)
  redis.call('PEXPIRE', KEYS[4], ARGV[6])
  -- The generation outlives every value of its group.
  generation(KEYS[5], math.max(tonumber(ARGV[5]), tonumber(ARGV[6]))) -- fence.lua
  redis.call('DEL', KEYS[6])
  stored = 1
end
local held = redis.call('GET', KEYS[3]) == ARGV[1]
if held then
  redis.call('DEL', KEYS[3])
end
if stored == 1 then
  redis.call('PUBLISH', ARGV[7], ARGV[8])
elseif held then
  -- Our waiters would otherwise sleep out a lease nobody holds.
  redis.call('PUBLISH', ARGV[7], ARGV[9])
end
return stored
