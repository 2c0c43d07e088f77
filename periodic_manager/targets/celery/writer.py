"""Celery messages straight into a Redis broker: claim and LPUSH in one Lua script per chunk.

Chunks of ``CHUNK`` tasks, each one script call whose tasks travel as a single JSON argument (and
their messages as one concatenated argument), all chunks in flight at once (each on a connection
of the pool), every call bounded by ``timeout``.

Work is split in two so the manager can do the first part before a slot is due:

- :meth:`RedisWriter.prepare` builds the script arguments of a batch: the message texts, claim
  TTLs and destinations. Pure computation, no I/O.
- :meth:`RedisWriter.send` runs the script calls and returns one flag per task.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import count
from typing import Any

import redis.asyncio as aioredis

from periodic_manager.contracts import Task
from periodic_manager.targets.celery.wire import Delivery, Layout, WireFormat
from periodic_manager.targets.redis.claims import RedisClaims

# ARGV[1] = the claim-key prefix; ARGV[2] = JSON {"d": destinations, "t": tasks} (cjson: one
# argument instead of five per task); ARGV[3] = the tasks' messages, concatenated; ARGV[4] = how
# old (ms, Redis's clock) a pending claim of a publisher through kombu must be to count as
# abandoned (see claims.py).
#   destination: [list, binding set, routing key, declare set, declare member, key prefix,
#                 priority suffix, separator]  ("" where not used)
#   task: [idempotency key, task id, claim TTL in ms, destination (1-based), message length] and,
#         for options.overlap, [prev key, value read, new value, prev TTL in ms]
# Returns one flag per task: 1 enqueued, 0 already sent (duplicate), 2 no queue is bound to the
# task's exchange and routing key (nothing written, no claim), 3 busy (the schedule's previous
# task changed since it was read: nothing written), 4 enqueued again over an abandoned pending
# claim (a publish through kombu the broker never confirmed: resent), 5 a pending claim younger
# than that: a publish through kombu is under way (nothing written: ask again).
#
# A script is atomic but not transactional: a command that fails half-way leaves the earlier
# effects. So every key is type-checked before the first claim, and a claim is written only
# together with its message: a claim never exists without its message.
_CLAIM_AND_PUSH = """
local function wrong(key, want)
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= want and kind ~= 'none' then
    return 'WRONGTYPE ' .. key .. ' is a ' .. kind .. ', not a ' .. want
  end
  return nil
end
local claim_prefix = ARGV[1]
local meta = cjson.decode(ARGV[2])
local blob = ARGV[3]
local stale = tonumber(ARGV[4])
local clock = nil
-- A claim that is already there: 0 sent, 4 pending and abandoned, 5 pending and recent.
local function held(value)
  if string.sub(value, 1, 2) ~= 'p|' then return 0 end
  if clock == nil then
    local t = redis.call('TIME')
    clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local since = string.match(value, '|(%d+)$')
  if since == nil or clock - tonumber(since) >= stale then return 4 end
  return 5
end
for _, d in ipairs(meta.d) do
  for _, key in ipairs({d[2], d[4]}) do
    if key ~= '' then
      local err = wrong(key, 'set')
      if err then return redis.error_reply(err) end
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
    local err = wrong(list, 'list')
    if err then return redis.error_reply(err) end
  end
  lists[i] = found
end
local out, buffers, order, pos = {}, {}, {}, 1
for i, t in ipairs(meta.t) do
  local targets = lists[t[4]]
  local claim, sent = claim_prefix .. t[1], 's|' .. t[2]
  local flag
  if #targets == 0 then
    flag = 2
  elseif t[6] then
    -- options.overlap: the previous task is compared before anything is claimed.
    local value = redis.call('GET', claim)
    if value then
      flag = held(value)
    elseif (redis.call('GET', t[6]) or '') ~= t[7] then
      flag = 3
    else
      flag = 1
    end
    if flag == 1 or flag == 4 then
      redis.call('SET', claim, sent, 'PX', t[3])
      redis.call('SET', t[6], t[8], 'PX', t[9])
    end
  elseif redis.call('SET', claim, sent, 'NX', 'PX', t[3]) then
    flag = 1
  else
    flag = held(redis.call('GET', claim) or '')
    if flag == 4 then
      redis.call('SET', claim, sent, 'PX', t[3])
    end
  end
  out[i] = flag
  if flag == 1 or flag == 4 then
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
"""

CHUNK = 1000  # tasks per script call (also the most values of one LPUSH: far below Lua's limit)


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """The arguments of one script call (a chunk of a batch); ``size`` tasks."""

    args: tuple[bytes, bytes, bytes, bytes]
    size: int


class RedisWriter:
    """Claims and pushes Celery messages with one script call per chunk of tasks."""

    def __init__(
        self,
        client: aioredis.Redis,
        wire: WireFormat,
        *,
        layout: Layout,
        claims: RedisClaims,
        timeout: float,
    ) -> None:
        self.client = client
        self.wire = wire
        self.claims = claims  # their keys and TTLs: a slot has one claim whichever way it went
        self.timeout = timeout
        self._keyprefix = layout.keyprefix
        self._sep = layout.sep
        self._script = client.register_script(_CLAIM_AND_PUSH)
        # kombu tags every message with a fresh uuid4 (its key among unacknowledged messages).
        # A random 72-bit prefix per writer plus a counter is as unique, at a fraction of the cost.
        head = uuid.uuid4().hex
        self._tag_head = f"{head[:8]}-{head[8:12]}-4{head[13:16]}-a{head[17:20]}-"
        self._tags = count()

    def prepare(
        self,
        items: Sequence[tuple[Task, Mapping[str, Any], Delivery]],
        now: datetime | None,
        prevs: Sequence[Sequence[Any] | None] | None = None,
    ) -> list[ScriptCall]:
        """The script calls for ``items`` (task, send_task arguments, delivery). No I/O.

        ``now``: when they will be sent; None: each at its task's slot (staged ahead). Claim TTLs
        and relative expiries count from that instant. ``prevs`` (options.overlap), one per
        item: the compare-and-set of its schedule's previous-task key (key, value read, new
        value, TTL ms), or None."""
        calls = []
        ttl_memo: dict[tuple[datetime, datetime], int] = {}  # a burst shares one slot: one TTL
        for start in range(0, len(items), CHUNK):
            chunk = items[start : start + CHUNK]
            destinations: dict[Delivery, int] = {}
            rows: list[tuple[Any, ...]] = []
            messages = []
            for n, (task, msg, delivery) in enumerate(chunk, start):
                index = destinations.get(delivery)
                if index is None:
                    index = destinations[delivery] = len(destinations) + 1
                at = task.scheduled_at if now is None else now
                ttl = ttl_memo.get((task.expires_at, at))
                if ttl is None:
                    ttl = ttl_memo[(task.expires_at, at)] = self.claims.ttl_ms(task, at)
                tag = f"{self._tag_head}{next(self._tags) & 0xFFFFFFFFFFFF:012x}"
                message = self.wire.envelope(msg, delivery, at, tag)
                messages.append(message)
                # Messages are ASCII (JSON with ensure_ascii): characters are bytes.
                row: tuple[Any, ...] = (task.idempotency_key, task.id, ttl, index, len(message))
                prev = prevs[n] if prevs is not None else None
                rows.append(row if prev is None else (*row, *prev))
            meta = {"d": [self._destination(d) for d in destinations], "t": rows}
            text = json.dumps(meta, ensure_ascii=False, separators=(",", ":"))
            # Encoded once here: redis-py passes bytes through untouched (a resend re-encodes nothing).
            args = (
                self.claims.key("").encode(), text.encode(), "".join(messages).encode("ascii"),
                str(self.claims.stale_ms).encode(),
            )  # fmt: skip
            calls.append(ScriptCall(args, len(chunk)))
        return calls

    def _destination(self, d: Delivery) -> list[str]:
        declare_key, declare_member = d.declare or ("", "")
        return [
            d.queue_list, d.binding_key, d.routing_key if d.binding_key else "", declare_key,
            declare_member, self._keyprefix, d.priority_suffix, self._sep,
        ]  # fmt: skip

    def start(self, calls: Sequence[ScriptCall]) -> list[asyncio.Future[Any]]:
        """Start ``calls``, all at once (each a task of its own: its request goes out at the next
        turn of the event loop, whatever the caller does next)."""
        return [asyncio.ensure_future(self._call(call)) for call in calls]

    async def results(self, started: Sequence[asyncio.Future[Any]]) -> list[int]:
        """The flags of started calls, one per task, in order (1 enqueued, 0 duplicate,
        2 unroutable, 3 busy, 4 resent, 5 being published through kombu). Raises the first failure, a TimeoutError (a call took longer than
        ``timeout``) or the client's errors, once every call has ended; the calls that went
        through keep their effects (each is atomic)."""
        replies = await asyncio.gather(*started, return_exceptions=True)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return [int(flag) for reply in replies for flag in reply]

    async def send(self, calls: Sequence[ScriptCall]) -> list[int]:
        """Run ``calls`` (see :meth:`start` and :meth:`results`)."""
        return await self.results(self.start(calls))

    async def _call(self, call: ScriptCall) -> Any:
        # One EVALSHA per chunk on its own connection: Redis runs them one after the other while
        # the next chunk is being built. The script object loads itself after a NoScriptError
        # (a restarted or flushed server); the claims make a second run harmless.
        async with asyncio.timeout(self.timeout):
            return await self._script(keys=[], args=list(call.args))
