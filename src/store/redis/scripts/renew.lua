-- Extend a lease that is still ours (the watchdog, while a rebuild runs),
-- and the fence hash and generation its commit needs: they last as long as
-- the lease at least, never shortened (a value or another lease of the
-- group may need the generation longer). One that is gone stays gone: the
-- commit is refused (commit.lua).
--
-- KEYS[1] lease   the rebuild lease
-- KEYS[2] fence   the key's fence hash
-- KEYS[3] gen     the group's generation
-- ARGV[1] token   our lease token
-- ARGV[2] lease   new lease time in milliseconds
--
-- Returns 1 if renewed, 0 if the lease is no longer ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local lease = tonumber(ARGV[2])
  for i = 2, 3 do
    local pttl = redis.call('PTTL', KEYS[i])
    if pttl ~= -2 and pttl < lease then
      redis.call('PEXPIRE', KEYS[i], ARGV[2])
    end
  end
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
