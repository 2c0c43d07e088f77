"""Redis Streams target: one stream per queue, claim and XADD in one atomic Lua step.

Keys are hash-tagged by queue, so the stream of a queue and every claim of that queue live in one
Redis Cluster slot and one script can touch them together::

    {<prefix>:<queue>}:stream                    the queue's stream (consumers use XREADGROUP)
    {<prefix>:<queue>}:claim:<idempotency_key>   the claim of a slot; value: its stream entry id

Message fields (all strings): ``id``, ``type``, ``payload`` (canonical JSON text), ``queue``,
``name``, ``idempotency_key``, ``scheduled_at``, ``enqueued_at`` (UTC ISO-8601 with ``Z``,
microseconds only when non-zero), ``options`` (canonical JSON text) and, with ``PM_OTEL``,
``traceparent`` (the W3C trace context a worker continues).

``options.overlap`` skip and hold: the previous message of a schedule is checked and replaced in
the same script that claims the slot and adds its message. Each such schedule has one key beside
its queue's stream (same hash tag, so the same Redis Cluster slot)::

    {<prefix>:<queue>}:prev:<name>   "<entry id>|<enqueued ms>|<task id>" of its last message

A message is finished once the consumer group (``PM_REDIS_GROUP``, the group your workers read
with) has acknowledged it: it is not pending in the group and the group has delivered it (its
last-delivered id is at or past it). A message gone from the stream without being pending
(trimmed by ``MAXLEN``, deleted) counts as finished too: nothing of it is left to wait for. No
group yet: nothing has been delivered, so the message is queued. Deciding and adding in one
script means two managers can never both find the schedule free and both add a message. The key
expires after ``base.PREV_TTL`` (or ``overlap_timeout`` plus a day, if longer), which bounds what
deleted schedules leave behind.

**Redis Cluster** (a :class:`~redis.asyncio.cluster.RedisCluster` client, ``from_url(...,
cluster=True)``): every script call touches the keys of one queue, so of one hash slot.
redis-py's cluster pipeline sends each EVALSHA to the master of its stream key's slot, one
pipeline per master, the masters at once, and follows MOVED and ASK (a resharding) command by
command. Each call declares every key it touches (stream, claims, previous-task keys; the
scripts read KEYS[1] only), so while its slot migrates Redis answers ASK or TRYAGAIN rather than
run it where a claim is not. A master that does not know the scripts (first use, a restart)
gets them (``SCRIPT LOAD`` on every master) and only its calls run again. The sentinel is one key per master
(:class:`~periodic_manager.targets.redis.sentinel.ClusterSentinel`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from periodic_manager.contracts import EnqueueResult, Prepared, Previous, Task
from periodic_manager.contracts import refused as refused_result
from periodic_manager.schedules.instants import slot_text
from periodic_manager.targets import completion
from periodic_manager.targets.base import overlap_fields, overlap_refused
from periodic_manager.targets.builtin.redis import no_completion
from periodic_manager.targets.redis import lua
from periodic_manager.targets.redis.claims import claim_ttl_ms
from periodic_manager.targets.redis.errors import KeyTypeError, key_type_refusal, redis_errors
from periodic_manager.targets.redis.flags import BUSY, NEW, SENT
from periodic_manager.targets.redis.lua import text
from periodic_manager.targets.redis.sentinel import ClusterSentinel, Sentinel

# The scripts (their arguments and replies are written at their top): claim and add, and the same
# after the schedule's previous message (options.overlap). The queue's tasks travel as ONE JSON
# argument decoded by the script: redis-py encodes every argument separately, which at ten
# arguments a task cost more than Redis's own work.
CLAIM_AND_ADD = lua.script("periodic_manager.targets.redis", "claim_and_add.lua")
CLAIM_AND_ADD_AFTER = lua.script("periodic_manager.targets.redis", "claim_and_add_after.lua")

CHUNK = 1000  # tasks per script call: Redis stays responsive between calls
# The first call of a queue is small: Redis reads and decodes a call whole before its first XADD,
# so a burst's first task lands sooner.
FIRST_CHUNK = 100
PARALLEL = 4  # pipelines in flight at once (connections of the pool)
PLAIN, AFTER = 0, 1  # the two scripts: claim and add; the same after the previous message
# One script call: the tasks' indices in the batch, (keys, arguments), which script.
Call = tuple[list[int], tuple[list[str], list[Any]], int]


def _chunk_bounds(n: int) -> list[tuple[int, int]]:
    """Slices of a queue's ``n`` tasks: one of FIRST_CHUNK, then CHUNK each."""
    bounds = [(0, min(n, FIRST_CHUNK))]
    bounds += [(i, min(n, i + CHUNK)) for i in range(FIRST_CHUNK, n, CHUNK)]
    return bounds


class RedisStreamsTarget:
    """Enqueues each task to the stream of its queue, once per idempotency key.

    A claim lives ``(task.expires_at - now) + claim_margin`` seconds (at least 1 s): past
    ``expires_at`` no manager may enqueue the slot any more, so the claim is no longer needed.
    Memory stays bounded: the claims alive at any moment are about the number of slots enqueued
    in the last ``grace + claim_margin`` seconds (each a small string key), whatever the uptime.

    ``maxlen`` (or ``maxlen_by_queue[queue]``) trims a stream approximately (``MAXLEN ~``).
    Every call is bounded by ``timeout`` seconds; any Redis failure is raised as TargetError.

    ``group``: the consumer group the workers read with. With it the target knows when a message
    is finished (acknowledged), which ``options.overlap`` skip and hold need (see the module
    docstring); without it such tasks are refused (``failed``).
    """

    name = "redis"

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        *,
        prefix: str = "pm",
        maxlen: int | None = None,
        maxlen_by_queue: Mapping[str, int] | None = None,
        claim_margin: float = 60.0,
        timeout: float = 5.0,
        group: str | None = None,
    ) -> None:
        if not prefix or "{" in prefix or "}" in prefix:
            raise ValueError("prefix must be non-empty and contain no '{' or '}' (hash tags)")
        for value in [maxlen, *(maxlen_by_queue or {}).values()]:
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ValueError(f"maxlen must be an integer >= 1, got {value!r}")
        if claim_margin < 0 or timeout <= 0:
            raise ValueError("claim_margin must be >= 0 and timeout > 0")
        self._client = client
        self._cluster = isinstance(client, RedisCluster)
        self._owns_client = False
        self.prefix = prefix
        self.maxlen = maxlen
        self.maxlen_by_queue = dict(maxlen_by_queue or {})
        self.claim_margin = claim_margin
        self.timeout = timeout
        self.group = group
        self._scripts = (CLAIM_AND_ADD, CLAIM_AND_ADD_AFTER)
        self.sentinel: Sentinel | ClusterSentinel
        if isinstance(client, aioredis.Redis):
            self.sentinel = Sentinel(client, f"{{{prefix}}}:sentinel", timeout=timeout)
        else:
            self.sentinel = ClusterSentinel(client, prefix, timeout=timeout)
        self._shas = tuple(hashlib.sha1(text.encode()).hexdigest() for text in self._scripts)

    @classmethod
    def from_url(
        cls, url: str, *, max_connections: int = 10, cluster: bool = False, **kwargs: Any
    ) -> RedisStreamsTarget:
        """A target with its own client (closed by :meth:`close`).

        The client waits for a free connection (blocking pool) instead of failing with "Too many
        connections", and its socket timeouts match the target's ``timeout``.

        ``cluster``: ``url`` names any node of a Redis Cluster; the client reads the topology from
        it (redis-py's cluster client: no blocking pool, a connection per master opened as needed: at most ``PARALLEL`` pipelines of one send
        and a sentinel look use one each at once).
        """
        timeout = float(kwargs.get("timeout", 5.0))
        if cluster:
            client = RedisCluster.from_url(
                url, socket_timeout=timeout, socket_connect_timeout=timeout
            )
            target = cls(client, **kwargs)
            target._owns_client = True
            return target
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
        )
        target = cls(aioredis.Redis.from_pool(pool), **kwargs)
        target._owns_client = True
        return target

    def stream_key(self, queue: str) -> str:
        return f"{{{self.prefix}:{queue}}}:stream"

    def claim_key(self, queue: str, idempotency_key: str) -> str:
        return f"{{{self.prefix}:{queue}}}:claim:{idempotency_key}"

    def prev_key(self, queue: str, name: str) -> str:
        """Where the last message of schedule ``name`` is kept (options.overlap)."""
        return f"{{{self.prefix}:{queue}}}:prev:{name}"

    def claim_ttl_ms(self, task: Task, now: datetime) -> int:
        """How long the claim of ``task`` lives: until it expires, plus the margin (>= 1 s)."""
        return claim_ttl_ms(task, now, self.claim_margin)

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        """Claim and add every task (prepared now, claims living from ``now``)."""
        return await self.send(self._prepare(tasks, now), now)

    def prepare(self, tasks: Sequence[Task]) -> Prepared:
        """Build the script arguments: per queue, chunks of at most ``CHUNK`` tasks as one JSON
        argument each, spread over ``PARALLEL`` pipelines. Claim TTLs count from each task's slot
        (a staged batch is sent at its slot; sent later, a claim lives that much longer)."""
        return self._prepare(tasks, None)

    def _prepare(self, tasks: Sequence[Task], now: datetime | None) -> Prepared:
        groups: dict[tuple[str, int], list[int]] = {}
        refused: dict[int, str] = {}
        for index, task in enumerate(tasks):
            if "{" in task.queue or "}" in task.queue:  # a hash tag: refused for good, alone
                refused[index] = f"redis: queue {task.queue!r} contains '{{' or '}}'"
                continue
            kind = PLAIN
            # options.overlap (inline: once per task of every burst): a few schedules, own calls
            if task.options.get("overlap", "allow") != "allow":
                why = overlap_refused(self, task)
                if why is not None:
                    refused[index] = why
                    continue
                kind = AFTER
            groups.setdefault((task.queue, kind), []).append(index)
        chunks = [
            (queue, kind, indices[start:end])
            for (queue, kind), indices in groups.items()
            for start, end in _chunk_bounds(len(indices))
        ]
        memo: dict[tuple[datetime, datetime], tuple[str, int]] = {}
        calls: list[Call] = []
        for queue, kind, indices in chunks:
            part = [tasks[i] for i in indices]
            try:
                calls.append((indices, self._script_call(queue, part, now, memo, kind), kind))
            except (TypeError, ValueError):
                # One task cannot be encoded: found by encoding each alone; it alone is refused.
                for i in indices:
                    try:
                        calls.append(
                            ([i], self._script_call(queue, [tasks[i]], now, memo, kind), kind)
                        )
                    except (TypeError, ValueError) as exc:
                        refused[i] = f"redis: cannot encode the task: {exc}"
        parts = [calls[i::PARALLEL] for i in range(min(PARALLEL, len(calls)))]
        return Prepared(list(tasks), (parts, refused))

    async def send(self, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
        """Run the prepared script calls, ``PARALLEL`` pipelines at once; each round trip is
        bounded by ``timeout``; any Redis failure is raised as TargetError."""
        tasks = prepared.tasks
        if not tasks:
            return []
        parts: list[list[Call]]
        parts, refused = prepared.data
        enqueued_at = slot_text(now)
        now_ms = round(now.timestamp() * 1000)
        with redis_errors("redis", self.timeout):
            replies = await asyncio.gather(
                *(self._run_part(part, enqueued_at, now_ms) for part in parts)
            )
        results: list[EnqueueResult | None] = [None] * len(tasks)
        for index, why in refused.items():
            results[index] = refused_result(tasks[index], why)
        for part, part_replies in zip(parts, replies, strict=True):
            for (indices, _, kind), reply in zip(part, part_replies, strict=True):
                if isinstance(reply, KeyTypeError):  # this queue's stream: refused for good
                    for index in indices:
                        results[index] = refused_result(tasks[index], str(reply))
                    continue
                if kind == AFTER:
                    _after_results(tasks, indices, reply, results)
                    continue
                for pos, index in enumerate(indices):
                    flag, message_id = reply[2 * pos], reply[2 * pos + 1]
                    entry = None if message_id is None else text(message_id)
                    status: Literal["enqueued", "duplicate"] = (
                        "enqueued" if int(flag) == NEW else "duplicate"
                    )
                    results[index] = EnqueueResult(tasks[index], status, entry)
        return [r for r in results if r is not None]

    async def _run_part(self, part: list[Call], enqueued_at: str, now_ms: int) -> list[Any]:
        """One pipeline of script calls; each round trip is bounded by ``timeout``. A call
        refused because its stream's key holds another type replies its KeyTypeError (its
        tasks fail alone); any other failure is raised."""
        calls = []
        for _, (keys, args), kind in part:
            full = [args[0], args[1], enqueued_at, *args[2:]]
            if kind == AFTER:
                full.append(now_ms)
            calls.append((keys, full, kind))
        async with asyncio.timeout(self.timeout):
            if isinstance(self._client, RedisCluster):
                replies = await self._run_cluster(self._client, calls)
            else:
                replies = await self._run(calls)
                again = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
                if again:
                    # First use, or a SCRIPT FLUSH / restart since: load them and run those
                    # calls again (the others are done).
                    for text in self._scripts:
                        await self._client.script_load(text)
                    for i, reply in zip(
                        again, await self._run([calls[i] for i in again]), strict=True
                    ):
                        replies[i] = reply
        for i, reply in enumerate(replies):
            if isinstance(reply, Exception):
                refusal = key_type_refusal("redis", reply)
                if refusal is None:
                    raise reply
                replies[i] = refusal
        return replies

    async def _run(self, calls: list[tuple[list[str], list[Any], int]]) -> Any:
        # EVALSHA straight away: redis-py's Script objects ask SCRIPT EXISTS before every
        # pipeline, one more round trip in front of every burst. Errors come back in place.
        async with self._client.pipeline(transaction=False) as pipe:
            for keys, args, kind in calls:
                pipe.execute_command("EVALSHA", self._shas[kind], len(keys), *keys, *args)
            return await pipe.execute(raise_on_error=False)

    async def _run_cluster(
        self, client: RedisCluster, calls: list[tuple[list[str], list[Any], int]]
    ) -> list[Any]:
        """The calls on a cluster: one pipeline per master, the masters at once (redis-py routes
        each EVALSHA by its key and follows MOVED / ASK). Calls a master refused for want of the
        scripts run again once they are loaded, and only those: the others are done. Errors are
        returned in place as Redis raised them (redis-py's pipeline would add the whole command,
        a batch of tasks, to the message)."""
        replies = await self._pipeline_cluster(client, calls)
        again = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if again:
            for script in self._scripts:
                await client.script_load(script)  # every master
            for i, reply in zip(
                again, await self._pipeline_cluster(client, [calls[i] for i in again]), strict=True
            ):
                replies[i] = reply
        return replies

    async def _pipeline_cluster(
        self, client: RedisCluster, calls: list[tuple[list[str], list[Any], int]]
    ) -> list[Any]:
        pipe = client.pipeline()
        for keys, args, kind in calls:
            pipe.execute_command("EVALSHA", self._shas[kind], len(keys), *keys, *args)
        stack = list(pipe._command_stack)
        try:
            return await pipe.execute(raise_on_error=False)
        except AttributeError:
            # redis-py 5.x: when a redirected command made the client re-read the topology (every
            # few MOVED, a lost connection), the pipeline's last step reads the default node,
            # None until the next command. The replies are all in by then: take them.
            if client.get_default_node() is not None:
                raise
            return [cmd.result for cmd in stack]

    def _script_call(
        self,
        queue: str,
        tasks: list[Task],
        now: datetime | None,
        memo: dict[tuple[datetime, datetime], tuple[str, int]],
        kind: int,
    ) -> tuple[list[str], list[Any]]:
        """One script call's keys and arguments; ``memo`` holds the batch's formatted slots."""
        items: list[tuple[Any, ...]] = []
        for task in tasks:
            # A burst shares one slot: format its instant and claim TTL once.
            cached = memo.get((task.scheduled_at, task.expires_at))
            if cached is None:
                ttl = self.claim_ttl_ms(task, now if now is not None else task.scheduled_at)
                cached = (slot_text(task.scheduled_at), ttl)
                memo[(task.scheduled_at, task.expires_at)] = cached
            item: tuple[Any, ...] = (
                cached[1],
                task.id,
                task.task_type,
                task.payload_text(),
                task.queue,
                task.name,
                task.idempotency_key,
                cached[0],
                task.options_text(),
            )
            items.append(item + overlap_fields(task) if kind == AFTER else item)
        if tasks[0].traceparent is not None:  # PM_OTEL (every task of a batch, or none)
            items = [item + (task.traceparent,) for item, task in zip(items, tasks, strict=True)]
        keys = [self.stream_key(queue)]
        if self._cluster:
            # Every key the script touches, declared (the script reads KEYS[1] only): while the
            # queue's slot moves between masters, Redis then runs the call where all of them are
            # or answers ASK / TRYAGAIN, never a call that finds the stream on the new master and
            # takes a claim still on the old one for free (the slot sent twice).
            keys += [self.claim_key(queue, t.idempotency_key) for t in tasks]
            if kind == AFTER:
                keys += dict.fromkeys(self.prev_key(queue, t.name) for t in tasks)
        maxlen = self.maxlen_by_queue.get(queue, self.maxlen) or 0
        # Encoded once here: redis-py passes bytes through untouched.
        blob = json.dumps(items, ensure_ascii=False, separators=(",", ":")).encode()
        args: list[Any] = [maxlen, self.claim_key(queue, ""), blob]
        if kind == AFTER:
            args += [self.group, self.prev_key(queue, "")]
        return keys, args

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        """Messages are finished once the workers' consumer group acknowledged them: that needs
        the group (see the module docstring)."""
        return no_completion(self.group) if completion.asks(options) else None

    async def ping(self) -> None:
        """Raise unless Redis answers within ``timeout`` (a readiness check)."""
        async with asyncio.timeout(self.timeout):
            if isinstance(self._client, RedisCluster):
                await self._client.ping(target_nodes=RedisCluster.PRIMARIES)  # every master
            else:
                await self._client.ping()

    async def forgotten(self) -> list[str]:
        """``["redis"]`` when the streams' Redis lost its data since the previous call."""
        return [self.name] if await self.sentinel.lost() else []

    async def close(self) -> None:
        """Close the client if this target created it (:meth:`from_url`)."""
        if self._owns_client:
            await self._client.aclose()


def _after_results(
    tasks: Sequence[Task], indices: list[int], reply: list[Any], results: list[EnqueueResult | None]
) -> None:
    """Results of a call of the overlap script: 4 values per task (see its script)."""
    for pos, index in enumerate(indices):
        flag, message_id, prev_task, state = reply[4 * pos : 4 * pos + 4]
        flag = int(flag)
        if flag == SENT:
            entry = None if message_id is None else text(message_id)
            results[index] = EnqueueResult(tasks[index], "duplicate", entry)
            continue
        state = text(state)
        timed_out = state.startswith("timeout:")
        previous = Previous(
            text(prev_task) or None, state.removeprefix("timeout:"), timed_out=timed_out
        )
        if flag == BUSY:
            results[index] = EnqueueResult(tasks[index], "busy", previous=previous)
        else:
            results[index] = EnqueueResult(
                tasks[index], "enqueued", text(message_id), previous=previous
            )
