-- arq (arq.py): claim each job's slot and write the job as arq's enqueue_job does, in one
-- atomic step.
--
-- KEYS[1] = the queue's sorted set. ARGV: the claim-key prefix, arq's job-key and result-key
-- prefixes, the jobs (one JSON array), their serialized bodies concatenated.
--   job: [idempotency key, job id, claim TTL ms, score ms, job expiry ms, body length] and, for
--        options.overlap, [prev key, value read, new value, prev TTL ms]
-- Returns one flag per job (redis/flags.py): NEW (written), SENT already (claimed, or arq holds
-- the job id: its job or its result), BUSY (the schedule's previous job changed since it was
-- read; nothing written), WRONGTYPE (the schedule's previous-job key holds another Redis type:
-- nothing written for that job, the others go on).
--
-- A script is atomic, not transactional: a command that fails half-way leaves the jobs written
-- before it. So the queue's type is checked before anything is written (the one refusal of the
-- whole call, redis/errors.py), a job's own keys are read with redis.pcall or EXISTS, and SET
-- never fails on a key's type: no command fails once the first job is written.
--#include periodic_manager.targets.redis:prelude.lua
local queue = KEYS[1]
local refused = refusal(queue, 'zset')
if refused then return refused end
local claim_prefix, job_prefix, result_prefix = ARGV[1], ARGV[2], ARGV[3]
local blob = ARGV[5]
local out, pos = {}, 1
for i, r in ipairs(cjson.decode(ARGV[4])) do
  local claim = claim_prefix .. r[1]
  local body = string.sub(blob, pos, pos + r[6] - 1)
  pos = pos + r[6]
  local flag = taken(claim, r[7], r[8])
  if flag then
    out[i] = flag
  elseif redis.call('EXISTS', job_prefix .. r[2], result_prefix .. r[2]) > 0 then
    redis.call('SET', claim, 's|' .. r[2], 'PX', r[3])
    out[i] = SENT
  else
    redis.call('SET', job_prefix .. r[2], body, 'PX', r[5])
    redis.call('ZADD', queue, r[4], r[2])
    out[i] = claimed(claim, r[2], r[3], r[7], r[9], r[10])
  end
end
return out
