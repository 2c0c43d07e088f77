-- Pending claims (claims.py): take a pending claim of every task's slot where it is free, or
-- take it again where it is this owner's or abandoned.
--
-- ARGV[1] = the claim-key prefix, ARGV[2] = JSON [[idempotency key, task id, ttl ms], ...],
-- ARGV[3] = owner, ARGV[4] = stale ms. Returns one flag per task: 0 sent already, 1 claimed
-- now, 3 a pending claim of this owner's or an abandoned one (publish again), 4 another
-- publisher's pending claim younger than stale ms (wait). Redis's own clock dates a pending
-- claim, so managers with different clocks agree on its age.
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
    out[i] = 1
  elseif string.sub(value, 1, 2) ~= 'p|' then
    out[i] = 0
  else
    local who, since = string.match(value, '^p|[^|]*|([^|]*)|(%d+)$')
    if who == owner or since == nil or now - tonumber(since) >= stale then
      redis.call('SET', key, pending, 'KEEPTTL')
      out[i] = 3
    else
      out[i] = 4
    end
  end
end
return out
