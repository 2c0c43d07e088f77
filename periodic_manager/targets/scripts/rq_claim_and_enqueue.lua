-- RQ (rq.py): claim each job's slot and enqueue the job as RQ's Queue.enqueue_job does (the job
-- hash, its id pushed on the queue's list, the queue in RQ's set of queues), in one atomic step.
--
-- KEYS[1] = the queue's list. ARGV: the claim-key prefix, RQ's job-key prefix, RQ's set of queues,
-- the jobs (one JSON array), then the job hashes' fields and values, job after job.
--   job: [idempotency key, job id, claim TTL ms, job TTL s (-1: none), number of field/value
--        arguments] and, for options.overlap, [prev key, value read, new value, prev TTL ms]
-- Returns one flag per job (redis/flags.py): NEW (written), SENT already (claimed, or RQ holds the
-- job id: its hash exists, queued, running or kept with its result), BUSY (the schedule's previous
-- job changed since it was read; nothing written), WRONGTYPE (the schedule's previous-job key
-- holds another Redis type: nothing written for that job, the others go on).
--
-- A script is atomic, not transactional: a command that fails half-way leaves the jobs written
-- before it. So the queue's and the set's types are checked before anything is written (the one
-- refusal of the whole call, redis/errors.py); the previous-job key is read with redis.pcall, a
-- job's hash is written only where EXISTS found none, and SET never fails on a key's type: no
-- command fails once the first job is written.
--#include periodic_manager.targets.redis:prelude.lua
local queue, queues = KEYS[1], ARGV[3]
local refused = refusal(queue, 'list') or refusal(queues, 'set')
if refused then return refused end
local claim_prefix, job_prefix = ARGV[1], ARGV[2]
local out, pos, added = {}, 5, false
for i, r in ipairs(cjson.decode(ARGV[4])) do
  local claim = claim_prefix .. r[1]
  local job = job_prefix .. r[2]
  local first, last = pos, pos + r[5] - 1
  pos = pos + r[5]
  local flag = taken(claim, r[6], r[7])
  if flag then
    out[i] = flag
  elseif redis.call('EXISTS', job) == 1 then
    redis.call('SET', claim, 's|' .. r[2], 'PX', r[3])
    out[i] = SENT
  else
    redis.call('HSET', job, unpack(ARGV, first, last))
    if r[4] > 0 then
      redis.call('EXPIRE', job, r[4])
    end
    redis.call('RPUSH', queue, r[2])
    added = true
    out[i] = claimed(claim, r[2], r[3], r[6], r[8], r[9])
  end
end
if added then
  redis.call('SADD', queues, queue)
end
return out
