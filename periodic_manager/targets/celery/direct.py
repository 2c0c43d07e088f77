"""The Redis writer's way: Celery messages the manager writes to a Redis broker itself, each
claimed and pushed in one script (:mod:`~periodic_manager.targets.celery.writer`), so a slot is
claimed only with its message.

The script's flags become results here. Two cases need more than one call:

- a slot another publisher holds pending (a publish through kombu under way, on another manager
  or a path of this one) is asked about again until that publish is settled or abandoned;
- ``options.overlap`` skip and hold: the previous tasks are read from the result backend first
  (:class:`~periodic_manager.targets.redis.previous.PreviousTasks`), then each free slot is
  claimed and written by the script that compares its schedule's previous-task key with what
  was read, so two managers never both start a task of one schedule.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from periodic_manager.contracts import QUEUED, EnqueueResult, Previous, Task, refused
from periodic_manager.targets.celery.message import celery_message
from periodic_manager.targets.celery.wire import Delivery
from periodic_manager.targets.celery.writer import RedisWriter, ScriptCall
from periodic_manager.targets.redis.claims import RedisClaims
from periodic_manager.targets.redis.flags import (
    BUSY,
    ELSEWHERE,
    NEW,
    RESEND,
    SENT,
    WRONGTYPE,
    wrong_type,
)
from periodic_manager.targets.redis.previous import Decided, PreviousTasks

# A task's send_task arguments and where they go, by its index in the batch.
Chosen = Mapping[int, tuple[dict[str, Any], Delivery]]


class DirectWay:
    """Sends what the Redis writer prepared and fills in each task's result."""

    def __init__(
        self, writer: RedisWriter, claims: RedisClaims, previous: PreviousTasks | None
    ) -> None:
        self.writer = writer
        self.claims = claims
        self.previous = previous  # None: no result backend (overlap tasks are refused earlier)

    async def send(
        self,
        tasks: Sequence[Task],
        calls: list[ScriptCall],
        written: list[tuple[int, Delivery]],
        results: list[EnqueueResult | None],
        now: datetime,
        started: list[asyncio.Future[Any]] | None,
    ) -> None:
        """Run ``calls`` (or await them, ``started`` already) for the tasks ``written`` (index,
        delivery, in call order); a slot held pending elsewhere is written once it is free."""
        flags = await self.writer.results(started or self.writer.start(calls))
        waiting: dict[int, tuple[dict[str, Any], Delivery]] = {}
        for (index, delivery), flag in zip(written, flags, strict=True):
            if flag == ELSEWHERE:
                waiting[index] = (celery_message(tasks[index], now), delivery)
            else:
                results[index] = self._result(tasks[index], delivery, flag)
        if waiting:

            async def again(ask: list[int]) -> list[int]:
                return await self._write(tasks, waiting, ask, now, results)

            for index in await self.claims.until_free(again, list(waiting)):
                results[index] = EnqueueResult(
                    tasks[index], "failed", error=self.claims.held_error("celery")
                )

    async def send_after(
        self,
        tasks: Sequence[Task],
        after: list[tuple[int, Delivery]],
        results: list[EnqueueResult | None],
        now: datetime,
    ) -> None:
        """options.overlap: read the previous tasks of ``after`` (index, delivery), then claim
        and write each free slot with the compare-and-set of its schedule's previous-task key.
        Their messages are built here, at ``now`` (a relative expiry counts from the send)."""
        assert self.previous is not None
        decided = await self.previous.read(tasks, [i for i, _ in after], now, flag="1")
        for index, result in decided.results.items():
            results[index] = result
        where = dict(after)
        chosen = {i: (celery_message(tasks[i], now), where[i]) for i in decided.free}

        async def write(ask: list[int]) -> list[int]:
            return await self._write(tasks, chosen, ask, now, results, decided)

        for index in await self.claims.until_free(write, decided.free):
            results[index] = EnqueueResult(
                tasks[index], "failed", error=self.claims.held_error("celery")
            )

    async def _write(
        self,
        tasks: Sequence[Task],
        chosen: Chosen,
        indices: list[int],
        now: datetime,
        results: list[EnqueueResult | None],
        decided: Decided | None = None,
    ) -> list[int]:
        """Write the tasks of ``indices`` (with ``decided``, the compare-and-set of their
        previous-task keys) and set their results; returns those a publish through kombu holds
        pending (ask again)."""
        items = [(tasks[i], *chosen[i]) for i in indices]
        prevs = [decided.written[i] for i in indices] if decided is not None else None
        writer = self.writer
        flags = await writer.results(writer.start(writer.prepare(items, now, prevs)))
        waiting = []
        for index, flag in zip(indices, flags, strict=True):
            if flag == ELSEWHERE:
                waiting.append(index)
                continue
            prev_key = decided.written[index][0] if decided is not None else None
            result = self._result(tasks[index], chosen[index][1], flag, prev_key)
            if decided is not None and result.status != "busy":
                result.previous = decided.previous.get(index)
            results[index] = result
        return waiting

    def _result(
        self, task: Task, delivery: Delivery, flag: int, prev_key: str | None = None
    ) -> EnqueueResult:
        """The result of a task the script took (its flag, redis/flags.py); ``prev_key``: its
        schedule's previous-task key (options.overlap)."""
        if flag == NEW:
            return EnqueueResult(task, "enqueued", task.id)
        if flag == SENT:
            return EnqueueResult(task, "duplicate", task.id)
        if flag == RESEND:
            return EnqueueResult(task, "resent", task.id)
        if flag == BUSY:  # another manager sent a task of this schedule since it was read
            return EnqueueResult(task, "busy", previous=Previous(None, QUEUED))
        if flag == WRONGTYPE:
            keys = [self.claims.key(task.idempotency_key), *([prev_key] if prev_key else [])]
            return refused(task, wrong_type("celery", *keys))
        error = (
            f"celery: no queue is bound to exchange {delivery.exchange!r} with routing key "
            f"{delivery.routing_key!r}"
        )
        return EnqueueResult(task, "failed", error=error)
