-- Fetch an entry, and take the rebuild lease when it is not fresh.
-- One round trip for both: a fresh hit, and a miss that wins the lease.
--
-- KEYS[1] value   the encoded entry; its PX runs to the end of the last stale window
-- KEYS[2] fresh   marker whose PX is the remaining freshness (Redis's clock decides)
-- KEYS[3] lease   the rebuild lease: holds the owner's token
-- KEYS[4] fence   hash {next = last fencing number issued, committed = number of the stored value}
-- KEYS[5] gen     the group's generation; values carry it as a prefix, `<gen>|`
-- ARGV[1] token   random owner token for the lease
-- ARGV[2] lease   lease time in milliseconds
-- ARGV[3] early   -1, or take the lease even when the entry is fresh if at most
--                 this many milliseconds of freshness are left (early refresh;
--                 a newer entry than the caller's has more left and is returned)
-- KEYS[6] failed  the failure marker (see release.lua): `<gen>:<code>:<step>`
-- ARGV[4] memory  how long a marker outlives its backoff, in milliseconds
-- ARGV[5] inline  the longest value returned in the reply; a longer one is
--                 withheld (returned as '')
-- KEYS[7] answer  the origin's answer to the failed rebuild (see release.lua)
--
-- Returns {status, value, a, b, gen, foreign, withheld, answer}:
--   {1, value, fresh_pttl, value_pttl, ""}   fresh hit
--   {2, value or "", fence, value_pttl, gen}  lease taken: rebuild, then commit with this fence and generation
--   {3, value or "", lease_pttl, value_pttl, holder}  another owner holds the
--       lease; holder is `<fence>:<sha1 of its token>`: the commit's wake-up
--       that reveals the token (and names the fence) is that lease's
--   {4, value or "", backoff_pttl, value_pttl, code}  the last rebuild failed and
--       its backoff runs: share that failure, do not call the origin;
--       answer is the origin's answer to that failure, if it kept one
-- foreign is 1 when the value key held bytes with no generation prefix at
-- all (not ours, or written before values carried one): they are none too,
-- and the caller counts them as unreadable. withheld is '' or, for a
-- value longer than `inline` left out of the reply, `<size>:<generation>`:
-- the caller reads it with a plain GET (see entries.rs), under a time limit
-- that allows for its size, and takes it only if it still carries that
-- generation (as if read here).
-- A value of an older generation of its group was invalidated: it is none.
-- A value longer than `inline` is not even read whole: its first bytes say
-- its generation (copying megabytes into the script would hold every other
-- client of the server back meanwhile).
local size = redis.call('STRLEN', KEYS[1])
local raw
if size > tonumber(ARGV[5]) then
  raw = redis.call('GETRANGE', KEYS[1], 0, 23)
else
  raw = redis.call('GET', KEYS[1])
end
local group = redis.call('GET', KEYS[5])
local value = current(raw, group) or ''
local foreign = 0
if raw and value == '' and not string.find(string.sub(raw, 1, 24), '^%d+|') then
  foreign = 1
end
local value_pttl = redis.call('PTTL', KEYS[1])
local withheld = ''
local sent = value
if size > tonumber(ARGV[5]) and value ~= '' then
  withheld = size .. ':' .. group
  sent = ''
end
local fresh_pttl = redis.call('PTTL', KEYS[2])
local early = tonumber(ARGV[3])
if value ~= '' and fresh_pttl > 0 and (early < 0 or fresh_pttl > early) then
  return {1, sent, fresh_pttl, value_pttl, '', foreign, withheld, ''}
end
-- A failure marker of this generation whose backoff still runs: it lives
-- `memory` past its backoff, so the backoff runs while more than that is
-- left. A marker of an older generation (the group was invalidated since),
-- one with no TTL or a TTL no backoff gives, or bytes that do not parse, is
-- not ours: ignored, and replaced by the next failure.
local marker = redis.call('GET', KEYS[6])
if marker then
  local mgen, code = string.match(marker, '^(%d+):(%d+):%d+$')
  local left = redis.call('PTTL', KEYS[6]) - tonumber(ARGV[4])
  if mgen and #code <= 3 and mgen == redis.call('GET', KEYS[5])
    and left > 0 and left <= tonumber(ARGV[4]) then
    if value ~= '' and fresh_pttl > 0 then
      -- An early refresh during a failure episode: keep the fresh entry.
      return {1, sent, fresh_pttl, value_pttl, '', foreign, withheld, ''}
    end
    -- The origin's answer to that failure, if kept under this generation.
    local answer = redis.call('GET', KEYS[7]) or ''
    if string.sub(answer, 1, #mgen + 1) == mgen .. '|' then
      answer = string.sub(answer, #mgen + 2)
    else
      answer = ''
    end
    return {4, sent, left, value_pttl, code, foreign, withheld, answer}
  end
end
if redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[2]) then
  -- The fence hash and the generation last the lease at least (renew.lua
  -- keeps them as long as the lease; the commit as long as the value).
  seed_fence(KEYS[4]) -- fence.lua, prepended
  local fence = redis.call('HINCRBY', KEYS[4], 'next', 1)
  at_least(KEYS[4], ARGV[2]) -- fence.lua
  local gen = generation(KEYS[5], ARGV[2]) -- fence.lua
  return {2, sent, fence, value_pttl, gen, foreign, withheld, ''}
end
local token = redis.pcall('GET', KEYS[3])
local holder = ''
if type(token) == 'string' then
  holder = (redis.call('HGET', KEYS[4], 'next') or '0') .. ':' .. redis.sha1hex(token)
end
return {3, sent, redis.call('PTTL', KEYS[3]), value_pttl, holder, foreign, withheld, ''}
