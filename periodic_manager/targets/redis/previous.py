"""``options.overlap`` for targets that claim in Redis (arq, Celery): the last task of each
schedule, kept beside the claims, and a compare-and-set of it with the claim.

One key per schedule with overlap skip or hold::

    <prefix>:prev:<name>   "<task id>|<enqueued ms>|<flag>"   flag 0: being published, 1: published

Whether that task has finished is the worker system's business (an :data:`Oracle`: arq's job
keys, Celery's result backend), read first (:meth:`PreviousTasks.read`). The slot is then taken
only if the key still holds what was read, so two managers never both find the schedule free:

- where the queue lives in the claims' Redis (arq, Celery on a Redis broker), one script
  compares the key, claims the slot, enqueues the task and records it with flag 1;
- elsewhere (Celery through kombu), the pending claim's script (``claim.lua``, through
  :meth:`~periodic_manager.targets.redis.claims.RedisClaims.claim`) compares, takes a pending
  claim and records the task with flag 0; the publish follows, then flag 1. While a publish is
  under way (flag 0, younger than ``publish_window``) the new task counts as queued
  even if the worker system does not know it yet. A publish that was never started puts the key
  back and frees its claim.

The key expires after ``base.PREV_TTL`` (or ``overlap_timeout`` plus a day, if longer): that bounds
what deleted schedules leave behind.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from periodic_manager.contracts import (
    FINISHED,
    NONE,
    QUEUED,
    UNFINISHED,
    EnqueueResult,
    Previous,
    Task,
)
from periodic_manager.errors import TargetError
from periodic_manager.targets.base import overlap_fields, overlap_timeout_ms
from periodic_manager.targets.redis import lua
from periodic_manager.targets.redis.claims import RedisClaims, is_pending
from periodic_manager.targets.redis.errors import redis_errors
from periodic_manager.targets.redis.lua import text

# The states of previous tasks, by task id (queued, running, unfinished or finished).
Oracle = Callable[[Sequence[str]], Awaitable[list[str]]]

# The script that marks or puts back previous-task keys (its arguments are written at its top).
SWAP = lua.script("periodic_manager.targets.redis", "swap_previous.lua")


@dataclass(slots=True)
class Decided:
    """The overlap decision of a batch: the results of the tasks not to send (duplicate, busy),
    and for the others (``free``, in order) what their previous-task key holds and becomes."""

    results: dict[int, EnqueueResult]
    free: list[int]
    written: dict[int, tuple[str, str, str, int]]  # index -> (key, value read, written, TTL)
    previous: dict[int, Previous]


class PreviousTasks:
    """The previous-task keys of one target, in the Redis of its claims."""

    def __init__(self, claims: RedisClaims, oracle: Oracle, *, publish_window_s: float) -> None:
        self.claims = claims
        self.oracle = oracle
        self.publish_window_ms = round(publish_window_s * 1000)
        self._swap = claims.client.register_script(SWAP)

    def key(self, name: str) -> str:
        return f"{self.claims.prefix}:prev:{name}"

    async def read(
        self, tasks: Sequence[Task], indices: Sequence[int], now: datetime, *, flag: str
    ) -> Decided:
        """Read the previous task of each ``tasks[i]`` and ask the oracle whether it finished:
        busy where it has not, free where it has, duplicate where the slot was sent already.
        A free task's key is to become ``<task id>|<now ms>|<flag>`` (``"1"``: the caller sends
        it in the same Redis step as the claim; ``"0"``: it publishes after, under a pending
        claim). Writes nothing; raises TargetError when Redis or the oracle fails."""
        now_ms = round(now.timestamp() * 1000)
        decided = Decided({}, [], {}, {})
        keys = [self.key(tasks[i].name) for i in indices]
        keys += [self.claims.key(tasks[i].idempotency_key) for i in indices]
        with redis_errors("overlap"):
            values = await self.claims.client.mget(keys)
        read = {i: text(v) for i, v in zip(indices, values, strict=False)}
        # A slot claimed already is a duplicate, whatever its schedule's previous task does (a
        # retry, or a second manager, must not hold a slot that was sent). A pending claim was
        # maybe published: it is sent again, whatever the previous task does.
        again = set()
        for i, claim in zip(indices, values[len(indices) :], strict=True):
            if is_pending(claim):
                again.add(i)
            elif claim is not None:
                decided.results[i] = EnqueueResult(tasks[i], "duplicate", tasks[i].id)
        indices = [i for i in indices if i not in decided.results]
        parsed = {i: _parse(read[i]) for i in indices if read[i] and i not in again}
        ids = sorted({p[0] for p in parsed.values() if p is not None})
        try:
            states = dict(zip(ids, await self.oracle(ids), strict=True)) if ids else {}
        except TargetError:
            raise
        except Exception as exc:  # noqa: BLE001 - a backend's own errors: this batch fails
            raise TargetError(
                f"overlap: cannot read task states: {type(exc).__name__}: {exc}"
            ) from exc
        for i in indices:
            task = tasks[i]
            if i not in again:
                previous = self._previous(parsed.get(i), states, now_ms, task)
                decided.previous[i] = previous
                if previous.state not in (FINISHED, NONE) and not previous.timed_out:
                    decided.results[i] = EnqueueResult(task, "busy", previous=previous)
                    continue
            _, ttl = overlap_fields(task)
            decided.written[i] = (self.key(task.name), read[i], f"{task.id}|{now_ms}|{flag}", ttl)
            decided.free.append(i)
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
        with redis_errors("overlap"):
            await self._swap(args=[json.dumps(rows)])


def _parse(value: str) -> tuple[str, int, str] | None:
    """``(task id, enqueued ms, flag)`` of a stored value; None for anything else (a value that
    cannot be read counts as no previous task)."""
    task_id, _, rest = value.partition("|")
    at, _, flag = rest.partition("|")
    if not task_id or not at.isdigit() or flag not in ("0", "1"):
        return None
    return task_id, int(at), flag
