-- Redis Streams, options.overlap skip and hold: the schedule's previous message is checked and
-- replaced in the same step that claims the slot and adds its message (see streams.py).
--
-- KEYS[1] = the queue's stream. ARGV: MAXLEN (0: none), claim-key prefix, enqueue instant (text),
-- the tasks (one JSON array), the consumer group, the prev-key prefix, now in Unix ms.
--   task: ttl_ms, id, type, payload, queue, name, idempotency_key, scheduled_at, options,
--         overlap timeout in ms (0: none), prev-key TTL in ms, and with PM_OTEL the traceparent
-- Returns 4 values per task: flag, entry id, previous task id, previous state, where flag
-- (redis/flags.py) is NEW (enqueued), SENT (duplicate: the claim's entry id) or BUSY (nothing
-- added, nothing claimed); the state is queued, running, finished or none, prefixed with
-- "timeout:" when an unfinished previous message counted as finished because it was older than
-- the overlap timeout.
--#include stream_args.lua
local group = ARGV[5]
local prev_prefix = ARGV[6]
local now_ms = tonumber(ARGV[7])
traceparent_at = 12  -- after the two overlap items

-- Stream ids are '<ms>-<seq>' without leading zeros: compare by length, then as text.
local function less(x, y)
  if #x ~= #y then return #x < #y end
  return x < y
end
local function before(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if not am or not bm then return true end
  if am ~= bm then return less(am, bm) end
  return less(as, bs)
end

local delivered, looked = nil, false
local function last_delivered()
  if not looked then
    looked = true
    local groups = redis.pcall('XINFO', 'GROUPS', stream)
    if type(groups) == 'table' and not groups.err then
      for _, g in ipairs(groups) do
        local name, last = nil, nil
        for j = 1, #g, 2 do
          if g[j] == 'name' then name = g[j + 1] end
          if g[j] == 'last-delivered-id' then last = g[j + 1] end
        end
        if name == group then delivered = last end
      end
    end
  end
  return delivered
end

local function state_of(entry_id)
  local pending = redis.pcall('XPENDING', stream, group, entry_id, entry_id, 1)
  if type(pending) == 'table' and not pending.err and #pending > 0 then
    return 'running'
  end
  local last = last_delivered()
  if last ~= nil and not before(last, entry_id) then
    return 'finished'
  end
  if #redis.call('XRANGE', stream, entry_id, entry_id) == 0 then
    return 'finished'
  end
  return 'queued'
end

local out = {}
for i = 1, #tasks do
  local t = tasks[i]
  local claim = claim_prefix .. t[7]
  local prev_key = prev_prefix .. t[6]
  if redis.call('EXISTS', claim) == 1 then
    out[#out + 1] = SENT
    out[#out + 1] = redis.call('GET', claim)
    out[#out + 1] = ''
    out[#out + 1] = ''
  else
    local prev_task, state, busy = '', 'none', false
    local prev = redis.call('GET', prev_key)
    local entry_id, at_ms, task_id = nil, nil, nil
    if prev then
      entry_id, at_ms, task_id = string.match(prev, '^(%d+%-%d+)|(%d+)|(.*)$')
    end
    if entry_id then
      prev_task = task_id
      state = state_of(entry_id)
      if state ~= 'finished' then
        if t[10] > 0 and now_ms - tonumber(at_ms) >= t[10] then
          state = 'timeout:' .. state
        else
          busy = true
        end
      end
    end
    if busy then
      out[#out + 1] = BUSY
      out[#out + 1] = ''
      out[#out + 1] = prev_task
      out[#out + 1] = state
    else
--#include xadd_task.lua
      redis.call('SET', claim, res, 'PX', t[1])
      redis.call('SET', prev_key, res .. '|' .. now_ms .. '|' .. t[2], 'PX', t[11])
      out[#out + 1] = NEW
      out[#out + 1] = res
      out[#out + 1] = prev_task
      out[#out + 1] = state
    end
  end
end
return out
