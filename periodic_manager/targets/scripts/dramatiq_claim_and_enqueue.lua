-- Dramatiq on Redis (dramatiq.py): claim each message's slot and enqueue the message as Dramatiq's
-- RedisBroker does (its "enqueue" command of dispatch.lua: the encoded message stored in the
-- queue's hash under its redis_message_id, that id pushed on the queue's list), in one atomic step.
--
-- KEYS[1] = the queue's list (<namespace>:<queue>), KEYS[2] = its messages' hash
-- (<namespace>:<queue>.msgs). ARGV: the claim-key prefix, the messages (one JSON array), then the
-- encoded messages, one per message, in order.
--   message: [idempotency key, redis_message_id, claim TTL ms]
-- Returns one flag per message (redis/flags.py): NEW (written) or SENT already (claimed, or the
-- queue's hash holds the id: enqueued and not yet acknowledged by a worker).
--
-- A script is atomic, not transactional: the two keys' types are checked before anything is
-- written (the one refusal of the whole call, redis/errors.py); after that no command can fail.
--#include periodic_manager.targets.redis:prelude.lua
local queue, messages = KEYS[1], KEYS[2]
local refused = refusal(queue, 'list') or refusal(messages, 'hash')
if refused then return refused end
local claim_prefix = ARGV[1]
local out = {}
for i, r in ipairs(cjson.decode(ARGV[2])) do
  local claim = claim_prefix .. r[1]
  if redis.call('EXISTS', claim) == 1 then
    out[i] = SENT
  elseif redis.call('HEXISTS', messages, r[2]) == 1 then
    redis.call('SET', claim, 's|' .. r[2], 'PX', r[3])
    out[i] = SENT
  else
    redis.call('HSET', messages, r[2], ARGV[2 + i])
    redis.call('RPUSH', queue, r[2])
    redis.call('SET', claim, 's|' .. r[2], 'PX', r[3])
    out[i] = NEW
  end
end
return out
