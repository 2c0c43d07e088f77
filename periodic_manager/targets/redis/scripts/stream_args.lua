-- The start of the two scripts that add tasks to a stream (included): the stream's type checked,
-- the arguments they share read.
--#include prelude.lua
local stream = KEYS[1]
local refused = refusal(stream, 'stream')
if refused then return refused end
local maxlen = tonumber(ARGV[1])
local claim_prefix = ARGV[2]
local enqueued_at = ARGV[3]
local tasks = cjson.decode(ARGV[4])
local traceparent_at = 10  -- where a task's traceparent is, when it has one
