-- Drop an entry's whole group (every variant of a URL) everywhere: from
-- Redis, and (through the message) from every instance's in-process tier. A
-- rebuild already running for any key of the group was started from the old
-- data, so its commit is fenced off: only a lease taken after this call can
-- store the group's keys again. O(1) however many variants there are: the
-- group's generation moves, and every value carrying an older one is gone.
--
-- KEYS[1] value   the encoded entry
-- KEYS[2] fresh   freshness marker
-- KEYS[3] fence   hash {next, committed}
-- KEYS[4] gen     the group's generation
-- KEYS[5] failed  the key's failure marker (a variant's markers carry the
--                 old generation, and are void once it moves)
-- ARGV[1] channel the namespace's event channel
-- ARGV[2] message the invalidation notice for this key
--
-- Returns {entry keys removed, instances that received the message}: the
-- invalidator waits for that many acknowledgements.
--
-- It creates nothing: a fence hash or a generation that is gone already
-- refuses every lease issued before (commit.lua), and the next lease seeds
-- it again from Redis's clock, above every number issued before. One that
-- is there is moved and keeps its TTL (the lease or value that set it is
-- what needs it); one without a TTL, or with foreign bytes, is not one
-- these scripts left, and is dropped as lost.
local removed = redis.call('DEL', KEYS[1], KEYS[2])
redis.call('DEL', KEYS[5])
-- Every fence issued so far is below this: a rebuild that began before the
-- invalidation cannot commit.
if redis.call('PTTL', KEYS[3]) > 0 then
  seed_fence(KEYS[3]) -- fence.lua, prepended
  local next = redis.call('HINCRBY', KEYS[3], 'next', 1)
  redis.call('HSET', KEYS[3], 'committed', next)
else
  redis.call('DEL', KEYS[3])
end
-- Every value of the group, and every lease taken under the old
-- generation, is void.
if plain(redis.call('GET', KEYS[4])) and redis.call('PTTL', KEYS[4]) > 0 then -- fence.lua
  redis.call('INCR', KEYS[4])
else
  redis.call('DEL', KEYS[4])
end
local receivers = redis.call('PUBLISH', ARGV[1], ARGV[2])
return {removed, receivers}
