-- A waiter gives up, or an attempt is abandoned without an answer (its
-- deadline passed, its caller was cancelled): leave the queue so the next in
-- line is not held back, and give back the hold the attempt may have taken
-- after its caller stopped waiting. Wakes the others if anything changed.
--
-- KEYS[1] lock     hash {owner, count, fence, a:<attempt> per hold}
-- KEYS[2] queue    sorted set of waiters
-- KEYS[3] beats    waiter heartbeats
-- KEYS[4] tombs    sorted set: abandoned attempt id -> until when (Redis
--                  time, ms) it takes nothing
-- ARGV[1] token    the waiter's owner token
-- ARGV[2] attempt  the abandoned attempt's id
-- ARGV[3] channel  the namespace's event channel
-- ARGV[4] message  the release notice for this lock
-- ARGV[5] tomb     how long (ms) the attempt stays known as abandoned: an
--                  attempt that reaches Redis after its undo (held on a
--                  connection that was since replaced) takes nothing
--
-- Tombstones past their time are swept here, where they are added, so the
-- set holds only those that still count, and goes with the last of them.
--
-- Returns 1 if a place or a hold was given back, 0 if there was none.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. string.format('%.0f', now))
redis.call('ZADD', KEYS[4], string.format('%.0f', now + tonumber(ARGV[5])), ARGV[2])
if redis.call('PTTL', KEYS[4]) < tonumber(ARGV[5]) then
  redis.call('PEXPIRE', KEYS[4], ARGV[5])
end
local changed = redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1]
    and redis.call('HDEL', KEYS[1], 'a:' .. ARGV[2]) == 1 then
  changed = 1
  if redis.call('HINCRBY', KEYS[1], 'count', -1) <= 0 then
    redis.call('DEL', KEYS[1])
  end
end
if changed == 1 then
  redis.call('PUBLISH', ARGV[3], ARGV[4])
end
return changed
