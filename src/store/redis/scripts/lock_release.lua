-- Release one hold on a lock, if it is still the caller's: the same owner
-- token, the same fencing number (a guard from an earlier tenure of the same
-- owner, whose lease lapsed, cannot release the owner's newer hold) and a
-- hold its attempt took and has not given back (releasing twice does
-- nothing). The last hold frees the lock and wakes the waiters.
--
-- KEYS[1] lock     hash {owner, count, fence, a:<attempt> per hold}
-- ARGV[1] token    the caller's owner token
-- ARGV[2] fence    the guard's fencing number
-- ARGV[3] attempt  the id of the attempt that took the hold
-- ARGV[4] channel  the namespace's event channel
-- ARGV[5] message  the release notice for this lock
--
-- Returns 1 when the lock was freed, 2 when holds remain, 0 when the hold
-- was not the caller's (expired, taken over, or already released).
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1]
    or redis.call('HGET', KEYS[1], 'fence') ~= ARGV[2]
    or redis.call('HDEL', KEYS[1], 'a:' .. ARGV[3]) == 0 then
  return 0
end
if redis.call('HINCRBY', KEYS[1], 'count', -1) > 0 then
  return 2
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
