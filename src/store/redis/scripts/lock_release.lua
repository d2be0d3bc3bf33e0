-- Release one hold on a lock, if it is still the caller's: the same owner
-- token, the same fencing number (a guard from an earlier tenure of the same
-- owner, whose lease lapsed, cannot release the owner's newer hold) and a
-- hold its attempt took and has not given back (releasing twice does
-- nothing). The last hold frees the lock and wakes the waiters.
--
-- A release is retried when its reply does not come, and Redis may run the
-- unanswered try after all: it leaves a receipt for the lease's time, so the
-- retry is answered with what the first try did, not with "not yours".
--
-- KEYS[1] lock     hash {owner, count, fence, a:<attempt> per hold}
-- KEYS[2] receipt  the outcome of this attempt's release, if it ran
-- ARGV[1] token    the caller's owner token
-- ARGV[2] fence    the guard's fencing number
-- ARGV[3] attempt  the id of the attempt that took the hold
-- ARGV[4] channel  the namespace's event channel
-- ARGV[5] message  the release notice for this lock
-- ARGV[6] keep     how long the receipt lasts, in milliseconds (the lease)
--
-- Returns 1 when the lock was freed, 2 when holds remain, 0 when the hold
-- was not the caller's (expired, taken over, or already released).
local receipt = redis.call('GET', KEYS[2])
if receipt then
  return tonumber(receipt)
end
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1]
    or redis.call('HGET', KEYS[1], 'fence') ~= ARGV[2]
    or redis.call('HDEL', KEYS[1], 'a:' .. ARGV[3]) == 0 then
  return 0
end
local outcome = 1
if redis.call('HINCRBY', KEYS[1], 'count', -1) > 0 then
  outcome = 2
else
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
redis.call('SET', KEYS[2], outcome, 'PX', ARGV[6])
return outcome
