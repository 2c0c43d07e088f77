-- asynq (targets/asynq/target.py): claim each task's slot and enqueue the task as asynq's client
-- enqueues one (the task hash asynq:{<queue>}:t:<id> with msg, state pending and pending_since,
-- its id pushed on asynq:{<queue>}:pending; with options.unique_ttl, asynq's uniqueness lock
-- taken first and named in the hash), in one atomic step. Every key a call touches carries the
-- queue's hash tag when the claims do (a Redis Cluster: one slot per call).
--
-- KEYS[1] = the queue's pending list. ARGV: the claim-key prefix, the queue's task-key prefix,
-- the tasks (one JSON array), the enqueue instant (Unix ns, pending_since), then the encoded
-- TaskMessage of each task, in order.
--   task: [idempotency key, task id, claim TTL ms, unique key ('' none), unique TTL s] and, for
--         options.overlap, [prev key, value read, new value, prev TTL ms]
-- Returns one flag per task (redis/flags.py, and UNIQUE here): NEW (written), SENT already
-- (claimed, or asynq holds the task id: its hash exists, whatever its state), BUSY (the schedule's
-- previous task changed since it was read; nothing written), WRONGTYPE (the schedule's
-- previous-task key holds another Redis type: nothing written for that task, the others go on),
-- UNIQUE (asynq's uniqueness lock is held by another task: asynq's client would not enqueue it
-- either; nothing written, no claim).
--
-- A script is atomic, not transactional: a command that fails half-way leaves the tasks written
-- before it. So the pending list's type is checked before anything is written (the one refusal
-- of the whole call, redis/errors.py); the previous-task key is read with redis.pcall, a task's
-- hash is written only where EXISTS found none, and SET never fails on a key's type: no command
-- fails once the first task is written.
--#include periodic_manager.targets.redis:prelude.lua
local pending = KEYS[1]
local refused = refusal(pending, 'list')
if refused then return refused end
local claim_prefix, task_prefix, now_ns = ARGV[1], ARGV[2], ARGV[4]
local out = {}
for i, r in ipairs(cjson.decode(ARGV[3])) do
  local claim = claim_prefix .. r[1]
  local id = r[2]
  local task = task_prefix .. id
  local flag = taken(claim, r[6], r[7])
  if flag then
    out[i] = flag
  elseif redis.call('EXISTS', task) == 1 then
    redis.call('SET', claim, 's|' .. id, 'PX', r[3])
    out[i] = SENT
  elseif r[4] ~= '' and not redis.call('SET', r[4], id, 'NX', 'EX', r[5]) then
    out[i] = UNIQUE
  else
    if r[4] ~= '' then
      redis.call('HSET', task, 'msg', ARGV[4 + i], 'state', 'pending',
                 'pending_since', now_ns, 'unique_key', r[4])
    else
      redis.call('HSET', task, 'msg', ARGV[4 + i], 'state', 'pending', 'pending_since', now_ns)
    end
    redis.call('LPUSH', pending, id)
    out[i] = claimed(claim, id, r[3], r[6], r[8], r[9])
  end
end
return out
