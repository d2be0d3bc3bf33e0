-- Drop an entry everywhere: from Redis, and (through the message) from every
-- instance's in-process tier. A rebuild already running was started from the
-- old data, so its commit is fenced off: only a lease taken after this call
-- can store the key again.
--
-- KEYS[1] value   the encoded entry
-- KEYS[2] fresh   freshness marker
-- KEYS[3] fence   hash {next, committed}
-- ARGV[1] channel the namespace's event channel
-- ARGV[2] message the invalidation notice for this key
-- ARGV[3] fkeep   fence hash lifetime in milliseconds
--
-- Returns the number of entry keys removed.
local removed = redis.call('DEL', KEYS[1], KEYS[2])
-- Every fence issued so far is below this: a rebuild that began before the
-- invalidation cannot commit, even if Redis lost the hash in between.
seed_fence(KEYS[3]) -- fence.lua, prepended
local next = redis.call('HINCRBY', KEYS[3], 'next', 1)
redis.call('HSET', KEYS[3], 'committed', next)
redis.call('PEXPIRE', KEYS[3], ARGV[3])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return removed
