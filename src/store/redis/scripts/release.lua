-- Give up a lease without storing anything (the rebuild failed or its answer
-- cannot be shared), and tell the waiters so they retry at once instead of
-- sleeping out the lease. A failed rebuild also leaves a failure marker, so
-- that no instance calls the failing origin again during its backoff.
--
-- KEYS[1] lease   the rebuild lease
-- KEYS[2] failed  the failure marker: `<gen>:<code>:<step>`
-- KEYS[3] answer  the origin's own answer to the failed rebuild (a 5xx, its
--                 headers and body, encoded as an entry), kept as long as
--                 the marker: what requests get during the backoff. Written
--                 `<gen>|<answer>`: an answer of another generation than the
--                 marker's (the group was invalidated since) is none
-- ARGV[1] token   our lease token
-- ARGV[2] channel the namespace's event channel
-- ARGV[3] message the failure notice for this key
-- ARGV[4] code    the failure's code; empty: no failure, no marker
-- ARGV[5] gen     the group's generation when the lease was taken
-- ARGV[6] base    the first backoff, in milliseconds
-- ARGV[7] cap     the longest backoff, in milliseconds; also how long a
--                 marker outlives its backoff (the episode's memory)
-- ARGV[8] answer  the origin's answer to keep; empty: none (an error, a
--                 timeout, or an answer past the size bound)
--
-- The first failure of an episode starts no backoff: the next request asks
-- the origin again (a failure is no answer a cache may reuse for a later
-- request, RFC 9111 §4), while the requests that waited on the failed
-- rebuild share its failure. A second failure in a row starts the backoff,
-- which doubles with each further one: base, 2 base, ... up to cap. A marker
-- lives cap past its backoff, so a failure soon after the last one
-- continues the episode; a commit or an invalidation (which moves the
-- generation) ends it.
--
-- Returns 1 if the lease was ours, 0 if it had expired or passed to another owner.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[4] ~= '' then
    local step = 1
    local old = redis.call('GET', KEYS[2])
    if old then
      local g, s = string.match(old, '^(%d+):%d+:(%d+)$')
      if g == ARGV[5] and #s <= 2 then
        step = math.min(tonumber(s) + 1, 32)
      end
    end
    local base, cap = tonumber(ARGV[6]), tonumber(ARGV[7])
    local backoff = 0
    if step > 1 then
      backoff = math.min(base * 2 ^ (step - 2), cap)
    end
    redis.call('SET', KEYS[2], ARGV[5] .. ':' .. ARGV[4] .. ':' .. step,
      'PX', math.floor(backoff + cap))
    if ARGV[8] ~= '' then
      redis.call('SET', KEYS[3], ARGV[5] .. '|' .. ARGV[8], 'PX', math.floor(backoff + cap))
    else
      redis.call('DEL', KEYS[3])
    end
  end
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
