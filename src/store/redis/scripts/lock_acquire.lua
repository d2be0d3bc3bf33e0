-- Take a lock, or join its queue of waiters. Waiters are served in the order
-- they arrived (first come, first served), so nobody starves while others
-- re-acquire; a waiter that stops refreshing its place (its process died, or
-- it gave up) drops out of the queue when its heartbeat lapses.
--
-- KEYS[1] lock     hash {owner = token, count = holds, fence = fencing number}
-- KEYS[2] fence    counter of fencing numbers issued
-- KEYS[3] queue    sorted set: waiter token -> arrival ticket
-- KEYS[4] beats    hash: waiter token -> heartbeat deadline (Redis time, ms)
-- KEYS[5] tickets  counter of arrival tickets
-- ARGV[1] token    the caller's owner token
-- ARGV[2] lease    lock lease in milliseconds
-- ARGV[3] wait     0: do not queue; otherwise the heartbeat lifetime in ms
-- ARGV[4] keep     lifetime of the counters in milliseconds
-- ARGV[5] reenter  1 if the same owner may hold the lock more than once
--
-- Returns {1, fence, holds} when the lock is ours,
--         {0, lock_pttl, position} when it is not (position 0: not queued).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token = ARGV[1]

local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == token and ARGV[5] == '1' then
  local holds = redis.call('HINCRBY', KEYS[1], 'count', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('HGET', KEYS[1], 'fence')), holds}
end

-- Drop waiters at the head whose heartbeat lapsed.
local head = nil
while true do
  local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not first then break end
  local beat = tonumber(redis.call('HGET', KEYS[4], first) or '0')
  if beat >= now then head = first break end
  redis.call('ZREM', KEYS[3], first)
  redis.call('HDEL', KEYS[4], first)
end

if not owner and (head == nil or head == token) then
  redis.call('ZREM', KEYS[3], token)
  redis.call('HDEL', KEYS[4], token)
  -- Fencing numbers only go up: a counter lost to a restart, eviction or
  -- expiry starts again from Redis's clock in microseconds, above every
  -- number issued before it.
  if redis.call('EXISTS', KEYS[2]) == 0 then
    local t = redis.call('TIME')
    redis.call('SET', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
  end
  local fence = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  redis.call('HSET', KEYS[1], 'owner', token, 'count', 1, 'fence', fence)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, fence, 1}
end

local position = 0
if ARGV[3] ~= '0' then
  if not redis.call('ZSCORE', KEYS[3], token) then
    local ticket = redis.call('INCR', KEYS[5])
    redis.call('PEXPIRE', KEYS[5], ARGV[4])
    redis.call('ZADD', KEYS[3], ticket, token)
  end
  redis.call('HSET', KEYS[4], token, now + tonumber(ARGV[3]))
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
  redis.call('PEXPIRE', KEYS[4], ARGV[4])
  position = redis.call('ZRANK', KEYS[3], token) + 1
end
return {0, redis.call('PTTL', KEYS[1]), position}
