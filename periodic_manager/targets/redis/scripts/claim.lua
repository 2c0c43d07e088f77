-- Pending claims (claims.py): take a pending claim of every task's slot where it is free, or
-- take it again where it is this owner's or abandoned. A row that carries a previous-task key
-- (options.overlap, previous.py) is claimed only if that key still holds the value read, and
-- then records the new task in it (compare-and-set).
--
-- ARGV[1] = the claim-key prefix, ARGV[2] = JSON list of rows [idempotency key, task id, claim
-- TTL ms] or, for options.overlap, [idempotency key, task id, claim TTL ms, prev key, value read
-- ("" = absent), new value, prev TTL ms], ARGV[3] = owner, ARGV[4] = stale ms.
-- Returns one flag per row (redis/flags.py): SENT already (duplicate), NEW (claimed now, pending;
-- the new task recorded), BUSY (the previous task changed since it was read: nothing written),
-- RESEND (a pending claim of this owner's or an abandoned one, taken again: publish again with
-- the same task id; the new task recorded), ELSEWHERE (another publisher's pending claim younger
-- than stale ms: wait), WRONGTYPE (the claim key or the previous-task key holds another Redis
-- type: nothing written for that row, the others go on).
--
-- Redis's own clock dates a pending claim, so managers with different clocks agree on its age. A
-- pending claim dated more than `ahead` ms after that clock (a hand-written value, a clock that
-- stepped back, another server's clock after a failover) would never grow old: it counts as
-- abandoned.
-- A claim is re-taken with the row's TTL (never KEEPTTL: a claim without one would live forever).
-- A script is atomic, not transactional: the keys are read with redis.pcall and SET never fails
-- on a key's type, so no command fails once the first claim is written.
--#include prelude.lua
local prefix, owner, stale = ARGV[1], ARGV[3], tonumber(ARGV[4])
local ahead = 1000
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i, row in ipairs(cjson.decode(ARGV[2])) do
  local key = prefix .. row[1]
  local pending = 'p|' .. row[2] .. '|' .. owner .. '|' .. now
  local value = redis.pcall('GET', key)
  local flag
  if failed(value) then
    flag = WRONGTYPE
  elseif not value then
    flag = changed(row[4], row[5]) or NEW
  elseif string.sub(value, 1, 2) ~= 'p|' then
    flag = SENT
  else
    local who, since = string.match(value, '^p|[^|]*|([^|]*)|(%d+)$')
    local age = since and now - tonumber(since)
    if who == owner or age == nil or age >= stale or age < -ahead then
      flag = RESEND
    else
      flag = ELSEWHERE
    end
  end
  if flag == NEW or flag == RESEND then
    redis.call('SET', key, pending, 'PX', row[3])
    if row[4] then
      redis.call('SET', row[4], row[6], 'PX', row[7])
    end
  end
  out[i] = flag
end
return out
