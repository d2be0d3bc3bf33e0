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
-- ARGV[3] fkeep   fence hash lifetime in milliseconds
--
-- Returns {entry keys removed, instances that received the message}: the
-- invalidator waits for that many acknowledgements.
local removed = redis.call('DEL', KEYS[1], KEYS[2])
redis.call('DEL', KEYS[5])
-- Every fence issued so far is below this: a rebuild that began before the
-- invalidation cannot commit, even if Redis lost the hash in between.
seed_fence(KEYS[3]) -- fence.lua, prepended
local next = redis.call('HINCRBY', KEYS[3], 'next', 1)
redis.call('HSET', KEYS[3], 'committed', next)
redis.call('PEXPIRE', KEYS[3], ARGV[3])
generation(KEYS[4], ARGV[3]) -- fence.lua, prepended
redis.call('INCR', KEYS[4])
local receivers = redis.call('PUBLISH', ARGV[1], ARGV[2])
return {removed, receivers}
