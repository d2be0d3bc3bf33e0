-- A waiter gives up: leave the queue so the next in line is not held back,
-- and wake the others (the head may have changed).
--
-- KEYS[1] queue    sorted set of waiters
-- KEYS[2] beats    waiter heartbeats
-- ARGV[1] token    the waiter's token
-- ARGV[2] channel  the namespace's event channel
-- ARGV[3] message  the release notice for this lock
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if removed == 1 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return removed
