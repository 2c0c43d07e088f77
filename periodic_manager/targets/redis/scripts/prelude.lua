-- The start of every claim script, included by each (lua.py): the flags of redis/flags.py and
-- the checks they share.
local SENT, NEW, BUSY, RESEND, ELSEWHERE, UNROUTABLE, WRONGTYPE, UNIQUE = 0, 1, 2, 3, 4, 5, 6, 7
local NOUNS = {zset = 'sorted set'}
-- The refusal of the whole call (an error reply) when `key` holds a Redis type other than `want`
-- (as TYPE names it); nil when it holds that type or nothing.
local function refusal(key, want)
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= want and kind ~= 'none' then
    local noun = NOUNS[want] or want
    return redis.error_reply('WRONGTYPE ' .. key .. ' is a ' .. kind .. ', not a ' .. noun)
  end
  return nil
end
-- Whether a redis.pcall reply is an error (a key of another type).
local function failed(reply)
  return type(reply) == 'table' and reply.err ~= nil
end
-- options.overlap's compare-and-set read: WRONGTYPE when the schedule's previous-task key holds
-- another type, BUSY when it no longer holds the value read ('' = absent), nil when it still
-- does or there is no such key (the schedule has no options.overlap).
local function changed(prev_key, read)
  if not prev_key then return nil end
  local prev = redis.pcall('GET', prev_key)
  if failed(prev) then return WRONGTYPE end
  if (prev or '') ~= read then return BUSY end
  return nil
end
-- The claim of a task written now (it names the task's id, ``s|<id>``) and, with
-- options.overlap, the schedule's previous-task key now naming this task; returns NEW.
local function claimed(claim, id, ttl, prev_key, value, prev_ttl)
  redis.call('SET', claim, 's|' .. id, 'PX', ttl)
  if prev_key then
    redis.call('SET', prev_key, value, 'PX', prev_ttl)
  end
  return NEW
end
-- What becomes of a task whose slot is claimed already (SENT), or whose schedule's previous task
-- changed since it was read (options.overlap: WRONGTYPE or BUSY, see changed); nil: write it.
local function taken(claim, prev_key, read)
  if redis.call('EXISTS', claim) == 1 then return SENT end
  return changed(prev_key, read)
end
