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
-- ARGV[6] channel the namespace's event channel
-- ARGV[7] message the wake-up message for this key
-- ARGV[8] refused the failure notice, sent when a newer entry won
-- ARGV[9] gen     the group's generation when the lease was taken
-- KEYS[6] failed  the failure marker (release.lua): a stored entry ends the episode
--
-- Returns 1 when stored, 0 when fenced off: a newer entry was stored, an
-- invalidation came, or a newer lease was issued after ours (ours lapsed and
-- another holder is rebuilding from fresher data), or the group was
-- invalidated since the lease was taken (its generation moved).
-- A fence hash that is gone (expired, evicted, lost to a restart) or holds
-- foreign bytes proves nothing about this lease's age: the commit is refused
-- rather than trusted, and nothing is written (the next lease seeds the hash
-- again from Redis's clock, above this lease's number). So is a generation
-- that is gone: the group's values went with it.
local issued = redis.call('HGET', KEYS[4], 'next')
local committed = redis.call('HGET', KEYS[4], 'committed') or '0'
local fence = tonumber(ARGV[2])
local stored = 0
local gen = redis.call('GET', KEYS[5])
if plain(issued) and plain(committed) -- fence.lua
    and fence >= tonumber(committed) and fence >= tonumber(issued) and gen == ARGV[9] then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[5])
  if tonumber(ARGV[4]) > 0 then
    redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[4])
  else
    redis.call('DEL', KEYS[2])
  end
  -- This was the newest lease: no other can commit, so the fence hash is
  -- kept as long as the value, and no longer. The generation outlives every
  -- value of its group, and every lease taken under it: never shortened.
  redis.call('HSET', KEYS[4], 'committed', fence)
  redis.call('PEXPIRE', KEYS[4], ARGV[5])
  at_least(KEYS[5], ARGV[5]) -- fence.lua
  redis.call('DEL', KEYS[6])
  stored = 1
end
local held = redis.call('GET', KEYS[3]) == ARGV[1]
if held then
  redis.call('DEL', KEYS[3])
end
if stored == 1 then
  redis.call('PUBLISH', ARGV[6], ARGV[7])
elseif held then
  -- Our waiters would otherwise sleep out a lease nobody holds.
  redis.call('PUBLISH', ARGV[6], ARGV[8])
end
return stored
