-- Extend a lock that is still the caller's (the watchdog): the same owner
-- token and the same fencing number, so a guard from an earlier tenure of the
-- same owner cannot keep alive a hold that is not its own.
--
-- KEYS[1] lock     hash {owner, count, fence, a:<attempt> per hold}
-- ARGV[1] token    the caller's owner token
-- ARGV[2] fence    the guard's fencing number
-- ARGV[3] lease    new lease in milliseconds
--
-- Returns 1 if renewed, 0 if the lock is no longer the caller's.
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1]
    and redis.call('HGET', KEYS[1], 'fence') == ARGV[2] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 0
