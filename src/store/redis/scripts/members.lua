-- The instances an invalidation must hear from: every member of the fleet
-- whose lease has not run out (Redis's clock). Expired members are removed,
-- and so is any score further ahead than an instance ever writes (a forged
-- or corrupt entry), so it does not hold invalidations up.
--
-- KEYS[1] members  sorted set: instance -> end of its lease, ms on Redis's clock
--                  and `born` -> when this life of the set began
-- ARGV[1] lease    milliseconds
-- ARGV[2] most     the most members returned
--
-- A set less than one lease old (or gone) may miss an instance whose lease
-- began before the set was lost and still runs: its renewal went to the
-- lost set. Such an instance has lapsed once the set is one lease old.
--
-- Returns {milliseconds until the set is one lease old (0: it is), the
-- members, as stored}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
local born = tonumber(redis.call('ZSCORE', KEYS[1], 'born') or '')
if born ~= nil and born > now then
  born = now
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
redis.call('ZREMRANGEBYSCORE', KEYS[1], '(' .. string.format('%.0f', now + 2 * lease), '+inf')
local young = lease
if born ~= nil then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    redis.call('ZADD', KEYS[1], string.format('%.0f', born), 'born')
  end
  young = math.max(0, born + lease - now)
end
local out = {string.format('%.0f', young)}
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], '0', tostring(tonumber(ARGV[2])))) do
  if m ~= 'born' and #out <= tonumber(ARGV[2]) then
    out[#out + 1] = m
  end
end
return out
