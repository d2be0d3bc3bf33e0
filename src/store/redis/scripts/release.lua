-- Give up a lease without storing anything (the rebuild failed or its answer
-- cannot be shared), and tell the waiters so they retry at once instead of
-- sleeping out the lease.
--
-- KEYS[1] lease   the rebuild lease
-- ARGV[1] token   our lease token
-- ARGV[2] channel the namespace's event channel
-- ARGV[3] message the failure notice for this key
--
-- Returns 1 if the lease was ours, 0 if it had expired or passed to another owner.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
