-- Extend a lease that is still ours (the watchdog, while a rebuild runs).
--
-- KEYS[1] lease   the rebuild lease
-- ARGV[1] token   our lease token
-- ARGV[2] lease   new lease time in milliseconds
--
-- Returns 1 if renewed, 0 if the lease is no longer ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
