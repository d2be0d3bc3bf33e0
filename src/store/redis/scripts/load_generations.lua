-- Read fields of the namespace's invalidation table. A script calling HGET
-- rather than HGETALL or HMGET: it needs no permission the other scripts do
-- not (an ACL user confined to the crate's commands can run it).
--
-- KEYS[1] table   hash {all = generation, b<n> = generation of tag bucket n}
-- ARGV            the fields to read
--
-- Returns their values in order, nil where absent.
local out = {}
for i, field in ipairs(ARGV) do
  out[i] = redis.call('HGET', KEYS[1], field)
end
return out
