-- Redis Streams: claim each task's slot and add its message, in one atomic step.
--
-- KEYS[1] = the queue's stream; ARGV = MAXLEN (0: no trimming), the claim-key prefix, the
-- enqueue instant, and the queue's tasks as ONE argument: a JSON array decoded here (cjson).
--   task: ttl_ms, id, type, payload, queue, name, idempotency_key, scheduled_at, options
--         and, with PM_OTEL, the traceparent (added to the message as its last field)
-- Claim keys are built here from the queue's hash-tagged prefix, so they always share the
-- stream's cluster slot.
-- Returns a flat array: per task NEW + the new entry id, or SENT + the entry id already claimed
-- (flags: redis/flags.py).
--
-- A script is atomic but not transactional: if a command fails half-way, earlier effects stay.
-- So the stream's type is checked first, and a task's claim is written only after its XADD
-- succeeded: a claim never exists without its message.
--#include stream_args.lua
local out = {}
for i = 1, #tasks do
  local t = tasks[i]
  local claim = claim_prefix .. t[7]
  -- Check, add, then claim (one write of the claim, with the entry id).
  if redis.call('EXISTS', claim) == 0 then
--#include xadd_task.lua
    redis.call('SET', claim, res, 'PX', t[1])
    out[#out + 1] = NEW
    out[#out + 1] = res
  else
    out[#out + 1] = SENT
    out[#out + 1] = redis.call('GET', claim)
  end
end
return out
