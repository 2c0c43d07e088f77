-- Pending claims (claims.py): take a pending claim of every task's slot where it is free, or
-- take it again where it is this owner's or abandoned.
--
-- ARGV[1] = the claim-key prefix, ARGV[2] = JSON [[idempotency key, task id, ttl ms], ...],
-- ARGV[3] = owner, ARGV[4] = stale ms. Returns one flag per task (redis/flags.py): SENT already,
-- NEW (claimed now), RESEND (a pending claim of this owner's or an abandoned one: publish
-- again), ELSEWHERE (another publisher's pending claim younger than stale ms: wait). Redis's own
-- clock dates a pending claim, so managers with different clocks agree on its age.
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
    redis.call('SET', key, pending, 'PX', row[3])
    out[i] = NEW
  elseif string.sub(value, 1, 2) ~= 'p|' then
    out[i] = SENT
  else
    local who, since = string.match(value, '^p|[^|]*|([^|]*)|(%d+)$')
    if who == owner or since == nil or now - tonumber(since) >= stale then
      redis.call('SET', key, pending, 'KEEPTTL')
      out[i] = RESEND
    else
      out[i] = ELSEWHERE
    end
  end
end
return out
