-- Release one hold on a lock, if it is the caller's. The last hold frees the
-- lock and wakes the waiters.
--
-- KEYS[1] lock     hash {owner, count, fence}
-- ARGV[1] token    the caller's owner token
-- ARGV[2] channel  the namespace's event channel
-- ARGV[3] message  the release notice for this lock
--
-- Returns 1 when the lock was freed, 2 when holds remain, 0 when it was not
-- the caller's (expired, or taken over): a release by a non-owner does nothing.
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 0
end
if redis.call('HINCRBY', KEYS[1], 'count', -1) > 0 then
  return 2
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
