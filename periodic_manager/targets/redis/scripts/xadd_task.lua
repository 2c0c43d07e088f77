-- Shared by claim_and_add.lua and claim_and_add_after.lua (spliced where it is included):
-- add task t to stream (trimmed to maxlen when > 0), leaving the new entry id in res; a failed
-- XADD (e.g. a full Redis) is returned as the script's error before anything is claimed.
local fields = {
  'id', t[2], 'type', t[3], 'payload', t[4], 'queue', t[5], 'name', t[6],
  'idempotency_key', t[7], 'scheduled_at', t[8], 'enqueued_at', enqueued_at, 'options', t[9]
}
if t[traceparent_at] then  -- PM_OTEL: the W3C trace context, the task's last item
  fields[#fields + 1] = 'traceparent'
  fields[#fields + 1] = t[traceparent_at]
end
local res
if maxlen > 0 then
  res = redis.pcall('XADD', stream, 'MAXLEN', '~', maxlen, '*', unpack(fields))
else
  res = redis.pcall('XADD', stream, '*', unpack(fields))
end
if type(res) == 'table' and res.err then
  return res
end
