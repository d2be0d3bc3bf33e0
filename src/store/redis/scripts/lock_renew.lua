-- Extend a lock that is still the caller's (the watchdog).
--
-- KEYS[1] lock     hash {owner, count, fence}
-- ARGV[1] token    the caller's owner token
-- ARGV[2] lease    new lease in milliseconds
--
-- Returns 1 if renewed, 0 if the lock is no longer the caller's.
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
