-- Celery on a Redis broker (writer.py): claim each task's slot and LPUSH its message, in one
-- atomic step per chunk.
--
-- ARGV[1] = the claim-key prefix; ARGV[2] = JSON {"d": destinations, "t": tasks} (cjson: one
-- argument instead of five per task); ARGV[3] = the tasks' messages, concatenated; ARGV[4] = how
-- old (ms, Redis's clock) a pending claim of a publisher through kombu must be to count as
-- abandoned (see redis/claims.py); one dated more than `ahead` ms after Redis's clock would never
-- grow old, and counts as abandoned too.
--   destination: [list, binding set, routing key, declare set, declare member, key prefix,
--                 priority suffix, separator]  ("" where not used)
--   task: [idempotency key, task id, claim TTL in ms, destination (1-based), message length] and,
--         for options.overlap, [prev key, value read, new value, prev TTL in ms]
-- Returns one flag per task (redis/flags.py): NEW (claimed and pushed), SENT already (duplicate),
-- UNROUTABLE (no queue is bound to the task's exchange and routing key: nothing written, no
-- claim), BUSY (the schedule's previous task changed since it was read: nothing written), RESEND
-- (pushed again over an abandoned pending claim: a publish through kombu the broker never
-- confirmed), ELSEWHERE (a pending claim younger than that: a publish through kombu is under
-- way; nothing written, ask again), WRONGTYPE (the task's claim key or its schedule's
-- previous-task key holds another Redis type: nothing written for it, the others go on).
--
-- A script is atomic but not transactional: a command that fails half-way leaves the earlier
-- effects, and the messages are pushed after the loop that writes the claims. So no command of
-- that loop may fail: the keys every task shares (lists, binding sets) are type-checked before
-- the first claim, a task's own keys are read with redis.pcall (one of another type fails that
-- task alone), and SET never fails on a key's type. A claim never exists without its message.
--#include periodic_manager.targets.redis:prelude.lua
local claim_prefix = ARGV[1]
local meta = cjson.decode(ARGV[2])
local blob = ARGV[3]
local stale = tonumber(ARGV[4])
local ahead = 1000
local clock = nil
-- A claim that is already there: SENT, RESEND (pending and abandoned) or ELSEWHERE (pending
-- and recent).
local function held(value)
  if string.sub(value, 1, 2) ~= 'p|' then return SENT end
  if clock == nil then
    local t = redis.call('TIME')
    clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local since = string.match(value, '|(%d+)$')
  local age = since and clock - tonumber(since)
  if age == nil or age >= stale or age < -ahead then return RESEND end
  return ELSEWHERE
end
for _, d in ipairs(meta.d) do
  for _, key in ipairs({d[2], d[4]}) do
    if key ~= '' then
      local refused = refusal(key, 'set')
      if refused then return refused end
    end
  end
end
-- kombu declares the routed queue's binding before it publishes; so do we (SADD is idempotent).
for _, d in ipairs(meta.d) do
  if d[4] ~= '' then redis.call('SADD', d[4], d[5]) end
end
local lists = {}
for i, d in ipairs(meta.d) do
  local found, seen = {}, {}
  if d[1] ~= '' then
    found[1] = d[1]
  else
    -- A direct exchange: every queue bound with this routing key (members: key, pattern, queue).
    local sep = d[8]
    for _, member in ipairs(redis.call('SMEMBERS', d[2])) do
      local a = string.find(member, sep, 1, true)
      local b = a and string.find(member, sep, a + #sep, true)
      if b and string.sub(member, 1, a - 1) == d[3] then
        local list = d[6] .. string.sub(member, b + #sep) .. d[7]
        if not seen[list] then
          seen[list] = true
          found[#found + 1] = list
        end
      end
    end
    table.sort(found)
  end
  for _, list in ipairs(found) do
    local refused = refusal(list, 'list')
    if refused then return refused end
  end
  lists[i] = found
end
local out, buffers, order, pos = {}, {}, {}, 1
for i, t in ipairs(meta.t) do
  local targets = lists[t[4]]
  local claim, sent = claim_prefix .. t[1], 's|' .. t[2]
  local flag
  if #targets == 0 then
    flag = UNROUTABLE
  elseif t[6] then
    -- options.overlap: the previous task is compared before anything is claimed.
    local value = redis.pcall('GET', claim)
    if failed(value) then
      flag = WRONGTYPE
    elseif value then
      flag = held(value)
    else
      flag = changed(t[6], t[7]) or NEW
    end
    if flag == NEW or flag == RESEND then
      redis.call('SET', claim, sent, 'PX', t[3])
      redis.call('SET', t[6], t[8], 'PX', t[9])
    end
  elseif redis.call('SET', claim, sent, 'NX', 'PX', t[3]) then
    flag = NEW
  else
    local value = redis.pcall('GET', claim)
    if failed(value) then
      flag = WRONGTYPE
    else
      flag = held(value or '')
      if flag == RESEND then
        redis.call('SET', claim, sent, 'PX', t[3])
      end
    end
  end
  out[i] = flag
  if flag == NEW or flag == RESEND then
    local message = string.sub(blob, pos, pos + t[5] - 1)
    for _, list in ipairs(targets) do
      local buffer = buffers[list]
      if buffer == nil then
        buffer = {}
        buffers[list] = buffer
        order[#order + 1] = list
      end
      buffer[#buffer + 1] = message
    end
  end
  pos = pos + t[5]
end
-- One LPUSH per list, in task order: the same order as one LPUSH per message.
for _, list in ipairs(order) do
  redis.call('LPUSH', list, unpack(buffers[list]))
end
return out
