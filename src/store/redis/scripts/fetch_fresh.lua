
-- Read a fresh entry, and nothing else: the fallback of fetch_or_lease.lua
-- while the entry's slot migrates. That script names the lease key, which a
-- fresh entry does not have, so a node whose slot is MIGRATING answers it
-- with TRYAGAIN; this one names only keys a fresh entry has, so the node
-- serves it until they move (and redirects it once they have). It writes
-- nothing.
--
-- KEYS[1] value   the encoded entry, `<gen>|` first
-- KEYS[2] fresh   freshness marker
-- KEYS[3] gen     the group's generation
--
-- Returns {1, value, fresh_pttl, value_pttl} for a fresh entry of the
-- current generation, {0, '', 0, 0} otherwise.
local value = current(redis.call('GET', KEYS[1]), redis.call('GET', KEYS[3]))
local fresh_pttl = redis.call('PTTL', KEYS[2])
if value and fresh_pttl > 0 then
  return {1, value, fresh_pttl, redis.call('PTTL', KEYS[1])}
end
return {0, '', 0, 0}
