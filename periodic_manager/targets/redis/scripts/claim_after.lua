-- Previous tasks (previous.py): pending claims, as claim.lua, with the compare-and-set of each
-- schedule's previous-task key.
--
-- ARGV[1] = the claim-key prefix, ARGV[2] = JSON list of [idempotency key, task id, claim TTL
-- ms, prev key, expected value ("" = absent), new value, prev TTL ms], ARGV[3] = the claims'
-- owner, ARGV[4] = stale ms. Per task (redis/flags.py), as claim.lua, with the compare-and-set
-- of the previous task: SENT already (duplicate), NEW (claimed, pending, and the new task
-- recorded), BUSY (the previous task changed since it was read), RESEND (a pending claim re-taken
-- to publish again, same task id; the new task recorded), ELSEWHERE (another publisher's
-- pending claim: wait).
local SENT, NEW, BUSY, RESEND, ELSEWHERE, UNROUTABLE, WRONGTYPE = 0, 1, 2, 3, 4, 5, 6
local prefix, owner, stale = ARGV[1], ARGV[3], tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i, row in ipairs(cjson.decode(ARGV[2])) do
  local key = prefix .. row[1]
  local pending = 'p|' .. row[2] .. '|' .. owner .. '|' .. now
  local value = redis.call('GET', key)
  if not value then
    if (redis.call('GET', row[4]) or '') ~= row[5] then
      out[i] = BUSY
    else
      redis.call('SET', key, pending, 'PX', row[3])
      redis.call('SET', row[4], row[6], 'PX', row[7])
      out[i] = NEW
    end
  elseif string.sub(value, 1, 2) ~= 'p|' then
    out[i] = SENT
  else
    local who, since = string.match(value, '^p|[^|]*|([^|]*)|(%d+)$')
    if who == owner or since == nil or now - tonumber(since) >= stale then
      redis.call('SET', key, pending, 'KEEPTTL')
      redis.call('SET', row[4], row[6], 'PX', row[7])
      out[i] = RESEND
    else
      out[i] = ELSEWHERE
    end
  end
end
return out
