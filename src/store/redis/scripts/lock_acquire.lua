-- Take a lock, or keep a place in its queue of waiters. Waiters are served in
-- the order they arrived (first come, first served), so nobody starves while
-- others re-acquire. A waiter refreshes its place on every attempt; one that
-- stops (its process died or is paused, or it gave up) drops out of the queue
-- when its heartbeat lapses, and the others are told, so a dead head never
-- holds back a free lock for longer than one heartbeat.
--
-- Each hold records the attempt that took it, so an attempt that is retried
-- (its first reply never came) is answered again instead of counted twice,
-- and an attempt abandoned without an answer can be undone by its id
-- (lock_leave.lua).
--
-- KEYS[1] lock     hash {owner = token, count = holds, fence = fencing number,
--                        a:<attempt> = 1 for each hold}
-- KEYS[2] fence    counter of fencing numbers issued
-- KEYS[3] queue    sorted set: waiter token -> arrival ticket
-- KEYS[4] beats    hash: waiter token -> heartbeat deadline (Redis time, ms)
-- KEYS[5] tickets  counter of arrival tickets
-- KEYS[6] tombs    sorted set: abandoned attempt id -> until when (Redis
--                  time, ms) it takes nothing (lock_leave.lua)
-- ARGV[1] token    the caller's owner token
-- ARGV[2] lease    lock lease in milliseconds
-- ARGV[3] beat     0: do not queue; otherwise the heartbeat lifetime in ms
-- ARGV[4] keep     lifetime of the counters in milliseconds
-- ARGV[5] reenter  1 if the same owner may hold the lock more than once
-- ARGV[6] attempt  the attempt's random id
-- ARGV[7] channel  the namespace's event channel
-- ARGV[8] message  the release notice for this lock
-- ARGV[9] judge    1: refuse on a server that may evict the lock's key
--
-- Returns {1, fence, holds, seen} when the lock is ours,
--         {0, lock_pttl, position, seen} when it is not (position 0: not
--         queued), where seen is 0 (not judged), 1 (keeps every key) or 2
--         (the policy could not be read: INFO refused);
--         {2, 0, 0, policy, maxmemory} when this server may evict the
--         lock's key: nothing is taken, and the caller's place in the queue
--         is given up.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token = ARGV[1]
local attempt = 'a:' .. ARGV[6]

-- Redis cannot exempt a key from eviction: under a maxmemory limit every
-- policy but noeviction may evict a key with a TTL, and an evicted hold is
-- a free lock while its holder still works. Judged here, by the server
-- that would grant the lock, at the moment it would: a policy set at
-- runtime, a failover or a moved slot is seen by the next attempt.
local seen = 0
if ARGV[9] == '1' then
  seen = 2
  local info = redis.pcall('INFO', 'memory')
  if type(info) == 'string' then
    local maxmemory = string.match(info, '\nmaxmemory:(%d+)')
    local policy = string.match(info, '\nmaxmemory_policy:([%w%-]+)')
    if maxmemory and policy then
      seen = 1
      if tonumber(maxmemory) > 0 and policy ~= 'noeviction' then
        -- Out of the queue at once: the others are not held back by a
        -- place nobody will take.
        if redis.call('ZREM', KEYS[3], token) == 1 then
          redis.call('HDEL', KEYS[4], token)
          redis.call('PUBLISH', ARGV[7], ARGV[8])
        end
        return {2, 0, 0, policy, maxmemory}
      end
    end
  end
end

-- An attempt its caller already undid (lock_leave.lua) takes nothing: it
-- reached Redis late, and nobody would release what it took.
local abandoned = tonumber(redis.call('ZSCORE', KEYS[6], ARGV[6]) or '0')
if abandoned > 0 then
  if abandoned >= now then
    return {0, redis.call('PTTL', KEYS[1]), 0, seen}
  end
  redis.call('ZREM', KEYS[6], ARGV[6])
end

local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == token then
  if redis.call('HEXISTS', KEYS[1], attempt) == 1 then
    -- This attempt already took its hold: the caller is asking again.
    return {1, tonumber(redis.call('HGET', KEYS[1], 'fence')),
            tonumber(redis.call('HGET', KEYS[1], 'count')), seen}
  end
  if ARGV[5] == '1' then
    local holds = redis.call('HINCRBY', KEYS[1], 'count', 1)
    redis.call('HSET', KEYS[1], attempt, 1)
    -- Never shorten the hold: the first guard's watchdog counts on its own
    -- lease, and a reentrant hold with a shorter one must not cut it.
    if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
    end
    return {1, tonumber(redis.call('HGET', KEYS[1], 'fence')), holds, seen}
  end
end

-- Drop waiters at the head whose heartbeat lapsed, and tell the others: the
-- next in line may be able to take the lock now.
local head = nil
local dropped = false
while true do
  local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not first then break end
  local beat = tonumber(redis.call('HGET', KEYS[4], first) or '0')
  if beat >= now or first == token then head = first break end
  redis.call('ZREM', KEYS[3], first)
  redis.call('HDEL', KEYS[4], first)
  dropped = true
end
if dropped then
  redis.call('PUBLISH', ARGV[7], ARGV[8])
end

if not owner and (head == nil or head == token) then
  redis.call('ZREM', KEYS[3], token)
  redis.call('HDEL', KEYS[4], token)
  -- Fencing numbers only go up: a counter lost to a restart, eviction or
  -- expiry starts again from Redis's clock in microseconds, above every
  -- number issued before it.
  if redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('SET', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
  end
  local fence = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  redis.call('HSET', KEYS[1], 'owner', token, 'count', 1, 'fence', fence, attempt, 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, fence, 1, seen}
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
return {0, redis.call('PTTL', KEYS[1]), position, seen}
