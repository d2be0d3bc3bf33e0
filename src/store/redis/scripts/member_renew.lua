-- Keep this instance in the fleet's membership for one subscription lease
-- from now (Redis's clock). Called only once the instance's subscription was
-- just confirmed live, so one that stops hearing the channel stops renewing,
-- and drops out of the set when its own lease in the process has lapsed.
--
-- KEYS[1] members  sorted set: instance -> end of its lease, ms on Redis's clock
-- ARGV[1] instance
-- ARGV[2] lease    milliseconds
--
-- The set also holds `born`, scored with when this life of the set began:
-- a set that was lost (deleted, evicted, flushed, Redis restarted empty)
-- starts a new life, and until it is one lease old it may miss an instance
-- whose lease is still running (see members.lua).
--
-- Returns 1.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
local born = tonumber(redis.call('ZSCORE', KEYS[1], 'born') or '')
if born == nil or born > now then
  born = now
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
redis.call('ZADD', KEYS[1], string.format('%.0f', now + lease), ARGV[1])
redis.call('ZADD', KEYS[1], string.format('%.0f', born), 'born')
-- No member written by an instance outlives this: the set goes with the
-- last instance.
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', 2 * lease))
return 1
