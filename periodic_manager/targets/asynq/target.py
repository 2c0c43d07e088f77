"""The asynq target: each slot becomes an asynq task, written exactly as asynq's client enqueues
one, so an unmodified ``asynq.Server`` (v0.24 to v0.26) dequeues, runs and completes it.

Needs the ``asynq`` extra (``protobuf``), imported only when a target is built. The task's fields
are :mod:`~periodic_manager.targets.asynq.message`'s mapping; its keys are asynq's own::

    asynq:queues                       SET    every queue's name (asynq's inspector lists them)
    asynq:{<queue>}:pending            LIST   ids waiting for a worker (LPUSH; workers RPOPLPUSH)
    asynq:{<queue>}:t:<id>             HASH   msg (the TaskMessage), state pending, pending_since
                                              (Unix ns) and, with a lock, unique_key
    asynq:{<queue>}:unique:<type>:<md5>       the uniqueness lock (options.unique_ttl)

Exactly once per slot: a script (``scripts/asynq_claim_and_enqueue.lua``) claims the slot
(``<prefix>:claim:<key>``, for ``(expires_at - now) + margin``: the claims of the arq and RQ
targets), refuses a task id asynq holds (its hash exists, whatever its state: asynq's own
``EXISTS`` rule), takes the uniqueness lock where asked, then writes the hash and pushes the id.
Claim and task are one step: a lost reply, a retry, a second manager or a restart finds both or
neither.

On a **Redis Cluster** (``from_url(..., cluster=True)``) every key a call touches carries the
queue's hash tag, so one call is one slot: asynq's keys do, and the claims move beside them,
``<prefix>:{<queue>}:claim:<key>``; every one is declared to the script, so a call on a slot
being moved runs where all its keys are or is answered ASK / TRYAGAIN. ``asynq:queues`` and the
scheduler keys are single keys, written by commands of their own. ``options.overlap`` skip and
hold are refused there (the previous-task key would sit in another slot). The task id is the idempotency key, the same on every manager. The queue joins
``asynq:queues`` before the script, as asynq's client does (a set of names: adding one twice is
harmless).

``options.overlap`` skip and hold: asynq's task state tells (``active`` running; ``pending``,
``scheduled``, ``retry``, ``aggregating`` queued; ``completed``, ``archived`` or the hash gone
finished), read from the same Redis, and the same script compares the schedule's previous-task
key (:mod:`~periodic_manager.targets.redis.previous`), so two managers never both start a task of
one schedule. ``options.pause_after_failures``: ``completed`` succeeded, ``archived`` failed (its
retries ran out, or the handler skipped them), ``retry`` still pending (asynq runs it again);
it needs ``options.extra.retention``, without which asynq deletes a task that succeeded and
leaves no trace of it (refused with that reason).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from periodic_manager.contracts import (
    FINISHED,
    QUEUED,
    RUNNING,
    AnnouncedEntry,
    EnqueueResult,
    Task,
    refused,
)
from periodic_manager.errors import TargetError
from periodic_manager.schedules.failures import FAILED, PENDING, SUCCEEDED, UNKNOWN
from periodic_manager.targets import completion
from periodic_manager.targets.asynq import scheduler
from periodic_manager.targets.asynq.message import (
    NO_RETENTION,
    AsynqTask,
    asynq_task,
    extra_seconds,
    queue_prefix,
)
from periodic_manager.targets.base import overlap_refusals
from periodic_manager.targets.builtin.asynq import NO_CLUSTER_OVERLAP, PROTOBUF
from periodic_manager.targets.redis import lua
from periodic_manager.targets.redis.errors import redis_errors
from periodic_manager.targets.redis.flags import UNIQUE
from periodic_manager.targets.redis.job_target import RedisJobTarget
from periodic_manager.targets.redis.jobs import JobBatch
from periodic_manager.targets.redis.previous import Decided
from periodic_manager.targets.redis.sentinel import ClusterSentinel

log = logging.getLogger(__name__)

CLAIM_AND_ENQUEUE = lua.script("periodic_manager.targets.asynq", "asynq_claim_and_enqueue.lua")
CHUNK = 500  # tasks per script call
ALL_QUEUES = "asynq:queues"
RUNNING_STATES = frozenset({"active"})
DONE_STATES = frozenset({"completed", "archived"})


def _outcome(state: str | None) -> str:
    """options.pause_after_failures: the outcome of a task in asynq state ``state``."""
    if state == "completed":
        return SUCCEEDED
    if state == "archived":
        return FAILED
    if state is None:
        return UNKNOWN  # gone: done without retention, deleted, or its retention ran out
    return PENDING  # pending, active, scheduled, retry, aggregating


def _as_asynq(task: Task) -> Task:
    """``task`` with asynq's task id (its idempotency key) as its id: the claims, the previous
    task of an overlap schedule and the results then name the task as asynq does."""
    return Task(
        task.idempotency_key,
        task.name,
        task.task_type,
        task._payload,
        task.queue,
        task.options,
        task.idempotency_key,
        task.scheduled_at,
        task.expires_at,
        task.schedule_id,
        task.extra,
        task.payload_json,
        task.options_json,
        task.traceparent,
    )


class AsynqBatch(JobBatch[AsynqTask]):
    """A batch of asynq tasks: the job targets' batch, and the uniqueness lock's refusal."""

    def _result(
        self, task: Task, flag: int | str, decided: Decided | None, index: int
    ) -> EnqueueResult:
        if flag == UNIQUE:
            return refused(
                task,
                "asynq: options.unique_ttl: asynq's uniqueness lock of this queue, type and "
                "payload is held by another task (asynq's client would not enqueue it either)",
            )
        return super()._result(task, flag, decided, index)


class AsynqTarget(RedisJobTarget):
    """Enqueues tasks as asynq tasks, once per idempotency key.

    ``client``: a ``redis.asyncio.Redis`` on asynq's Redis (the claims live there too), or a
    ``RedisCluster`` (see the module docstring). At most ``concurrency`` script calls run at once,
    each bounded by ``timeout`` seconds.
    """

    name = "asynq"
    chunk = CHUNK
    announce_every_s = scheduler.ANNOUNCE_EVERY_S
    announce_max = scheduler.ANNOUNCE_MAX

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = "pm",
        claim_margin: float = 60.0,
        timeout: float = 5.0,
        concurrency: int = 8,
    ) -> None:
        proto = PROTOBUF.load("periodic_manager.targets.asynq.proto")
        self._message = proto.TaskMessage
        self._entry = proto.SchedulerEntry
        self._event = proto.SchedulerEnqueueEvent
        self._share(
            client,
            CLAIM_AND_ENQUEUE,
            prefix=prefix,
            claim_margin=claim_margin,
            timeout=timeout,
            concurrency=concurrency,
        )
        from redis.asyncio.cluster import RedisCluster

        self._cluster = isinstance(client, RedisCluster)
        self._cluster_sentinel = (
            ClusterSentinel(client, prefix, timeout=timeout) if self._cluster else None
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        timeout: float = 5.0,
        concurrency: int = 8,
        cluster: bool = False,
        **kwargs: Any,
    ) -> AsynqTarget:
        """A target with its own client on ``url`` (closed by :meth:`close`); ``cluster``: ``url``
        names a node of a Redis Cluster. No I/O until used."""
        if not cluster:
            return super().from_url(url, timeout=timeout, concurrency=concurrency, **kwargs)
        from redis.asyncio.cluster import RedisCluster

        client = RedisCluster.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        target = cls(client, timeout=timeout, concurrency=concurrency, **kwargs)
        target._owns_client = True
        return target

    def claim_prefix(self, queue: str) -> str:
        """Where the claims of ``queue``'s slots are: beside every Redis target's claims, or on a
        cluster under the queue's hash tag, in the slot of asynq's keys of the queue."""
        if self._cluster:
            return f"{self.claims.prefix}:{{{queue}}}:claim:"
        return self.claims.key("")

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        """asynq's task state tells, but on a Redis Cluster the previous-task keys would sit in
        another slot than the queue's."""
        return NO_CLUSTER_OVERLAP if self._cluster and completion.asks(options) else None

    def job(self, task: Task, now: datetime) -> AsynqTask:
        """The task asynq's client would write for ``task`` (ValueError if it cannot be one)."""
        return asynq_task(task, self._message)

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        """Claim and write every task, one script per queue and chunk; report each task in input
        order (``message_id``: asynq's task id). Raises TargetError when Redis fails (what a script
        wrote stays, and a retry finds it claimed)."""
        batch = AsynqBatch(
            self.name,
            self.job,
            self._call,
            None if self._cluster else self.previous,
            self.timeout,
            self.concurrency,
            self.chunk,
        )
        results, send = overlap_refusals(self, tasks)
        sent = await batch.enqueue([_as_asynq(tasks[i]) for i in send], now)
        for index, result in zip(send, sent, strict=True):
            result.task = tasks[index]
            results[index] = result
        await self._record([r.task for r in sent if r.status == "enqueued"], now)
        return [r for r in results if r is not None]

    async def _record(self, sent: Sequence[Task], now: datetime) -> None:
        """Each task sent in its entry's history, as asynq's scheduler records an enqueue (the
        newest :data:`~scheduler.MAX_EVENTS` kept). For asynq's tools only: the tasks are sent
        whatever happens here, so a failure is logged, not raised."""
        if not sent:
            return
        try:
            with redis_errors("asynq: scheduler history", self.timeout):
                async with asyncio.timeout(self.timeout):
                    async with self.client.pipeline(transaction=False) as pipe:
                        for task in sent:
                            key = scheduler.history_key(task.name)
                            event = scheduler.event_bytes(task.idempotency_key, now, self._event)
                            pipe.zremrangebyrank(key, 0, -scheduler.MAX_EVENTS)
                            pipe.zadd(key, {event: int(now.timestamp())})
                        await pipe.execute()
        except TargetError as exc:
            log.warning("%s (the tasks were sent)", exc)

    async def announce(
        self, manager_id: str, entries: Sequence[AnnouncedEntry], now: datetime
    ) -> None:
        """Publish ``entries`` as the scheduler ``manager_id`` (asynq's scheduler heartbeat: the
        entries list replaced, its expiry in ``asynq:schedulers``); none: withdrawn."""
        if not entries:
            await self.withdraw(manager_id)
            return
        key = scheduler.entries_key(manager_id)
        encoded = [scheduler.entry_bytes(e, self._entry) for e in entries]
        ttl = scheduler.ANNOUNCE_TTL_S
        with redis_errors("asynq: scheduler entries", self.timeout):
            async with asyncio.timeout(self.timeout):
                await self.client.zadd(scheduler.ALL_SCHEDULERS, {key: int(now.timestamp()) + ttl})
                if self._cluster:  # for people to read: replaced in three steps will do
                    await self.client.delete(key)
                    await self.client.rpush(key, *encoded)
                    await self.client.expire(key, ttl)
                    return
                async with self.client.pipeline(transaction=True) as pipe:
                    pipe.delete(key)
                    pipe.rpush(key, *encoded)
                    pipe.expire(key, ttl)
                    await pipe.execute()

    async def withdraw(self, manager_id: str) -> None:
        """Remove the scheduler ``manager_id``'s entries, as asynq's scheduler does at its stop."""
        key = scheduler.entries_key(manager_id)
        with redis_errors("asynq: scheduler entries", self.timeout):
            async with asyncio.timeout(self.timeout):
                await self.client.zrem(scheduler.ALL_SCHEDULERS, key)
                await self.client.delete(key)

    async def _call(
        self,
        queue: str,
        part: list[int],
        tasks: Sequence[Task],
        jobs: dict[int, AsynqTask],
        decided: Decided | None,
        now: datetime,
    ) -> list[Any]:
        """One script call for the tasks ``part`` of ``queue``: a flag per task."""
        rows = self._rows(
            part, tasks, decided, now, lambda i: [jobs[i].unique_key, jobs[i].unique_ttl_s]
        )
        await self.client.sadd(ALL_QUEUES, queue)
        claims, task_keys = self.claim_prefix(queue), queue_prefix(queue) + "t:"
        args = [
            claims,
            task_keys,
            json.dumps(rows),
            str(round(now.timestamp() * 1e9)),
            *(jobs[i].msg for i in part),
        ]
        keys = [queue_prefix(queue) + "pending"]
        if self._cluster:
            # Every key the script touches, declared: while the queue's slot moves between
            # masters, Redis runs the call where all of them are or answers ASK / TRYAGAIN.
            keys += [claims + tasks[i].idempotency_key for i in part]
            keys += [task_keys + jobs[i].task_id for i in part]
            keys += list(dict.fromkeys(jobs[i].unique_key for i in part if jobs[i].unique_key))
        return list(await self._script(keys=keys, args=args))

    async def forgotten(self) -> list[str]:
        """``["asynq"]`` when the Redis (any master of a cluster) lost its data since the
        previous call."""
        sentinel = self._cluster_sentinel or self.sentinel
        return [self.name] if await sentinel.lost() else []

    async def close(self) -> None:
        """Close the client if this target created it (:meth:`from_url`)."""
        if self._owns_client and self._cluster:
            await self.client.aclose()
            return
        await super().close()

    async def task_states(self, task_ids: Sequence[str]) -> list[str | None]:
        """asynq's state of each task (None: asynq no longer holds it), looked up in every queue
        asynq knows (an edit may have moved a schedule to another queue)."""
        if not task_ids:
            return []
        with redis_errors("asynq: task state", self.timeout):
            queues = sorted(lua.text(q) for q in await self.client.smembers(ALL_QUEUES))
            async with self.client.pipeline(transaction=False) as pipe:
                for task_id in task_ids:
                    for queue in queues:
                        pipe.hget(f"{queue_prefix(queue)}t:{task_id}", "state")
                replies = await pipe.execute()
        states: list[str | None] = []
        for k in range(len(task_ids)):
            found = [lua.text(r) for r in replies[k * len(queues) : (k + 1) * len(queues)] if r]
            states.append(found[0] if found else None)
        return states

    async def _states(self, job_ids: Sequence[str]) -> list[str]:
        """running (``active``), finished (``completed``, ``archived``, or gone) or queued."""
        out = []
        for state in await self.task_states(job_ids):
            if state is None or state in DONE_STATES:
                out.append(FINISHED)
            elif state in RUNNING_STATES:
                out.append(RUNNING)
            else:
                out.append(QUEUED)
        return out

    def failure_off(self, options: Mapping[str, Any]) -> str | None:
        """A success leaves a trace only with ``options.extra.retention``."""
        if "pause_after_failures" not in options:
            return None
        try:
            kept = extra_seconds(options, "retention")
        except ValueError as exc:
            return str(exc)
        return None if kept is not None else NO_RETENTION

    async def outcomes(self, options: Mapping[str, Any], task_ids: Sequence[str]) -> list[str]:
        """``completed`` succeeded, ``archived`` failed, gone unknown, anything else pending."""
        return [_outcome(state) for state in await self.task_states(task_ids)]
