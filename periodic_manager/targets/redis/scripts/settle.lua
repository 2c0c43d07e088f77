-- Pending claims (claims.py): settle this owner's pending claims after a publish.
--
-- ARGV[1] = prefix, ARGV[2] = owner, ARGV[3] = JSON [[idempotency key, task id, new value], ...]:
-- where the claim is still this owner's pending claim of that task, set it to the new value
-- (KEEPTTL), or delete it when the new value is "".
local prefix, owner = ARGV[1], ARGV[2]
for _, row in ipairs(cjson.decode(ARGV[3])) do
  local key = prefix .. row[1]
  local mine = 'p|' .. row[2] .. '|' .. owner .. '|'
  local value = redis.call('GET', key)
  if value and string.sub(value, 1, #mine) == mine then
    if row[3] == '' then
      redis.call('DEL', key)
    else
      redis.call('SET', key, row[3], 'KEEPTTL')
    end
  end
end
return 1
