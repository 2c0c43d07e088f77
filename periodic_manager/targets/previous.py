"""``options.overlap`` for targets that claim in Redis and publish apart (arq, Celery): the last
task of each schedule, kept beside the claims, and a compare-and-set claim.

One key per schedule with overlap skip or hold::

    <prefix>:prev:<name>   "<task id>|<enqueued ms>|<flag>"   flag 0: being published, 1: published

Whether that task has finished is the worker system's business (an :data:`Oracle`: arq's job
keys, Celery's result backend), read before the claim. The claim then takes the slot only if the
key still holds what was read (compare-and-set, in one script with the claim), and writes the
new task with flag 0; the publish follows, then flag 1. So two managers never both find the
schedule free: the second one's compare fails (busy), and while a publish is under way (flag 0,
younger than ``publish_window``) the new task counts as queued even if the worker system does not
know it yet. A publish that fails puts the key back and releases the claim.

The key expires after ``PREV_TTL`` (or ``overlap_timeout`` plus a day, if longer): that bounds
what deleted schedules leave behind.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from redis.exceptions import RedisError

from periodic_manager.errors import TargetError
from periodic_manager.targets.base import (
    FINISHED,
    NONE,
    QUEUED,
    UNFINISHED,
    EnqueueResult,
    Previous,
    Task,
    overlap_timeout_ms,
)
from periodic_manager.targets.claims import RedisClaims
from periodic_manager.targets.stream_overlap import overlap_fields

# The states of previous tasks, by task id (queued, running, unfinished or finished).
Oracle = Callable[[Sequence[str]], Awaitable[list[str]]]

# ARGV[1] = JSON list of [claim key, task id, claim TTL ms, prev key, expected value ("" =
# absent), new value, prev TTL ms]. Per task: 0 the slot is claimed already (duplicate), 2 the
# previous task changed since it was read (busy), 1 claimed and the new task recorded.
_CLAIM_AFTER = """
local out = {}
for i, t in ipairs(cjson.decode(ARGV[1])) do
  if redis.call('EXISTS', t[1]) == 1 then
    out[i] = 0
  else
    local prev = redis.call('GET', t[4]) or ''
    if prev ~= t[5] then
      out[i] = 2
    else
      redis.call('SET', t[1], t[2], 'PX', t[3])
      redis.call('SET', t[4], t[6], 'PX', t[7])
      out[i] = 1
    end
  end
end
return out
"""

# ARGV[1] = JSON list of [prev key, expected value, new value ("" = delete), prev TTL ms]: set
# each key that still holds what this manager wrote (flag 0 -> 1, or back to what it was).
_SWAP = """
for _, t in ipairs(cjson.decode(ARGV[1])) do
  if redis.call('GET', t[1]) == t[2] then
    if t[3] == '' then
      redis.call('DEL', t[1])
    else
      redis.call('SET', t[1], t[3], 'PX', t[4])
    end
  end
end
return 1
"""


@dataclass(slots=True)
class Decided:
    """The overlap decision of a batch: results of the tasks not to publish, and the claimed."""

    results: dict[int, EnqueueResult]
    claimed: list[int]
    written: dict[int, tuple[str, str, str, int]]  # index -> (key, value read, written, TTL)
    previous: dict[int, Previous]


class PreviousTasks:
    """The previous-task keys of one target, in the Redis of its claims."""

    def __init__(self, claims: RedisClaims, oracle: Oracle, *, publish_window_s: float) -> None:
        self.claims = claims
        self.oracle = oracle
        self.publish_window_ms = round(publish_window_s * 1000)
        self._claim = claims.client.register_script(_CLAIM_AFTER)
        self._swap = claims.client.register_script(_SWAP)

    def key(self, name: str) -> str:
        return f"{self.claims.prefix}:prev:{name}"

    async def decide(self, tasks: Sequence[Task], indices: Sequence[int], now: datetime) -> Decided:
        """Read the previous task of each ``tasks[i]``, ask the oracle, and claim the slots of the
        schedules found free (compare-and-set). Raises TargetError when Redis or the oracle fails
        (nothing is claimed then)."""
        now_ms = round(now.timestamp() * 1000)
        decided = Decided({}, [], {}, {})
        keys = [self.key(tasks[i].name) for i in indices]
        keys += [self.claims.key(tasks[i].idempotency_key) for i in indices]
        try:
            values = await self.claims.client.mget(keys)
        except (RedisError, OSError, TimeoutError) as exc:
            raise TargetError(f"overlap: {type(exc).__name__}: {exc}") from exc
        # A slot claimed already is a duplicate, whatever its schedule's previous task does (a
        # retry, or a second manager, must not hold a slot that was sent).
        read = {i: _text(v) for i, v in zip(indices, values, strict=False)}
        for i, claim in zip(indices, values[len(indices) :], strict=True):
            if claim is not None:
                decided.results[i] = EnqueueResult(tasks[i], "duplicate", tasks[i].id)
        indices = [i for i in indices if i not in decided.results]
        parsed = {i: _parse(read[i]) for i in indices if read[i]}
        ids = sorted({p[0] for p in parsed.values() if p is not None})
        try:
            states = dict(zip(ids, await self.oracle(ids), strict=True)) if ids else {}
        except TargetError:
            raise
        except Exception as exc:  # noqa: BLE001 - a backend's own errors: this batch fails
            raise TargetError(
                f"overlap: cannot read task states: {type(exc).__name__}: {exc}"
            ) from exc
        rows = []
        for i in indices:
            task = tasks[i]
            previous = self._previous(parsed.get(i), states, now_ms, task)
            decided.previous[i] = previous
            if previous.state not in (FINISHED, NONE) and not previous.timed_out:
                decided.results[i] = EnqueueResult(task, "busy", previous=previous)
                continue
            _, ttl = overlap_fields(task)
            new = f"{task.id}|{now_ms}|0"
            decided.written[i] = (self.key(task.name), read[i], new, ttl)
            rows.append(
                [self.claims.key(task.idempotency_key), task.id, self.claims.ttl_ms(task, now),
                 self.key(task.name), read[i], new, ttl]
            )  # fmt: skip
        free = [i for i in indices if i in decided.written]
        if not free:
            return decided
        try:
            flags = await self._claim(args=[json.dumps(rows)])
        except (RedisError, OSError, TimeoutError) as exc:
            raise TargetError(f"overlap: claims: {type(exc).__name__}: {exc}") from exc
        for i, flag in zip(free, flags, strict=True):
            task = tasks[i]
            if int(flag) == 1:
                decided.claimed.append(i)
                continue
            del decided.written[i]
            if int(flag) == 0:
                decided.results[i] = EnqueueResult(task, "duplicate", task.id)
            else:  # another manager sent a task of this schedule since it was read
                decided.results[i] = EnqueueResult(task, "busy", previous=Previous(None, QUEUED))
        return decided

    def _previous(
        self, parsed: tuple[str, int, str] | None, states: dict[str, str], now_ms: int, task: Task
    ) -> Previous:
        if parsed is None:
            return Previous(None, NONE)
        task_id, at_ms, flag = parsed
        state = states.get(task_id, UNFINISHED)
        if state == FINISHED and flag == "0" and now_ms - at_ms < self.publish_window_ms:
            state = QUEUED  # written by a publish under way: the worker system may not know it
        previous = Previous(task_id, state)
        timeout = overlap_timeout_ms(task)
        if state != FINISHED and timeout and now_ms - at_ms >= timeout:
            previous.timed_out = True
        return previous

    async def published(self, decided: Decided, indices: Sequence[int]) -> None:
        """Mark the tasks of ``indices`` published (flag 1). Raises TargetError; a mark that
        fails leaves flag 0, which counts as queued only for the publish window."""
        rows = []
        for i in indices:
            key, _, new, ttl = decided.written[i]
            rows.append([key, new, new[:-1] + "1", ttl])
        await self._swap_rows(rows)

    async def unpublished(self, decided: Decided, indices: Sequence[int]) -> None:
        """Put back the previous task of schedules whose publish failed (raises TargetError)."""
        rows = []
        for i in indices:
            key, old, new, ttl = decided.written[i]
            rows.append([key, new, old, ttl])
        await self._swap_rows(rows)

    async def _swap_rows(self, rows: list[list[object]]) -> None:
        if not rows:
            return
        try:
            await self._swap(args=[json.dumps(rows)])
        except (RedisError, OSError, TimeoutError) as exc:
            raise TargetError(f"overlap: {type(exc).__name__}: {exc}") from exc


def _text(value: object) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def _parse(value: str) -> tuple[str, int, str] | None:
    """``(task id, enqueued ms, flag)`` of a stored value; None for anything else (a value that
    cannot be read counts as no previous task)."""
    task_id, _, rest = value.partition("|")
    at, _, flag = rest.partition("|")
    if not task_id or not at.isdigit() or flag not in ("0", "1"):
        return None
    return task_id, int(at), flag
