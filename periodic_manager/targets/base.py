"""What every target shares: the task of a slot, its payload as call arguments, the overlap
options it carries, and the staging adapter.

A target (:class:`~periodic_manager.contracts.Target`) receives one batch per instant and enqueues
each task at most once per ``idempotency_key``, atomically with the claim of that key. Staging:
the scheduler builds the next instant's tasks before the instant and hands them to ``prepare``
(pure work: encoding, script arguments); at the instant it only calls ``send``. A target that does
not stage (:class:`~periodic_manager.contracts.StagedTarget`) is adapted by :func:`staged`:
prepare keeps the tasks, send enqueues them.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from periodic_manager.contracts import (
    UNPARSED,
    EnqueueResult,
    Prepared,
    StagedTarget,
    Target,
    Task,
    refused,
)
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.targets import completion

NO_SIGNAL = "it has no completion signal"
TASK_ID_NAMESPACE = uuid.UUID("6f1c1a52-5d0e-4d43-9b8e-2f1d8c0b7a11")
_NAMESPACE_BYTES = TASK_ID_NAMESPACE.bytes
# How long a schedule's previous-task key outlives its last write (options.overlap): what a
# deleted schedule leaves behind expires after this, or after its overlap_timeout plus a day.
PREV_TTL = timedelta(days=30)
_DAY_MS = 86_400_000


def task_id_for(idempotency_key: str) -> str:
    """Deterministic task id: the uuid5 of the idempotency key (every replica derives the same id).

    Equal to ``str(uuid.uuid5(TASK_ID_NAMESPACE, key))``, built without UUID objects because it
    runs once per enqueued slot.
    """
    raw = bytearray(hashlib.sha1(_NAMESPACE_BYTES + idempotency_key.encode()).digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x50  # version 5
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def task_for(
    config: PeriodicTaskConfig, key: str, scheduled_at: datetime, expires_at: datetime
) -> Task:
    """The task a schedule sends under idempotency key ``key`` (a slot, or a manual trigger)."""
    return Task(
        id=task_id_for(key),
        name=config.name,
        task_type=config.task_type,
        payload=UNPARSED,
        queue=config.queue,
        options=config.options,
        idempotency_key=key,
        scheduled_at=scheduled_at,
        expires_at=expires_at,
        schedule_id=config.schedule_id,
        payload_json=config.payload_json,
        options_json=config.options_json,
    )


def split_payload(payload: object) -> tuple[list[object], dict[str, object]]:
    """A schedule's payload as call arguments (Celery, arq): object -> kwargs, array -> args,
    null -> none, anything else -> one positional argument."""
    if isinstance(payload, dict):
        return [], dict(payload)
    if isinstance(payload, list | tuple):
        return list(payload), {}
    if payload is None:
        return [], {}
    return [payload], {}


def overlap_of(task: Task) -> str:
    """The task's ``options.overlap`` (``allow`` when absent)."""
    return str(task.options.get("overlap", "allow"))


def overlap_timeout_ms(task: Task) -> int:
    """``options.overlap_timeout`` in milliseconds (0: none)."""
    seconds = task.options.get("overlap_timeout")
    return 0 if seconds is None else max(1, round(float(seconds) * 1000))


def overlap_fields(task: Task) -> tuple[int, int]:
    """The overlap timeout (ms, 0: none) and the previous-task key's TTL (ms) of ``task``."""
    timeout = overlap_timeout_ms(task)
    ttl = max(int(PREV_TTL.total_seconds() * 1000), timeout + _DAY_MS)
    return timeout, ttl


def no_signal(options: Mapping[str, Any]) -> str | None:
    """``completion_off`` of a target that cannot tell when a task finished."""
    return NO_SIGNAL if completion.asks(options) else None


def overlap_refused(target: Target, task: Task) -> str | None:
    """Why ``target`` refuses the task (its ``options.overlap`` needs a completion signal the
    target lacks), as a task's error; None when it does not."""
    why = target.completion_off(task.options)
    if why is None:
        return None
    return (
        f"options.overlap {overlap_of(task)!r}: the {target.name} target cannot tell when a task "
        f"finished ({why})"
    )


def overlap_refusals(
    target: Target, tasks: Sequence[Task]
) -> tuple[list[EnqueueResult | None], list[int]]:
    """The results of a batch with those of the tasks ``target`` refuses for their
    options.overlap (:func:`overlap_refused`) filled in, and the indices of the others, to send."""
    results: list[EnqueueResult | None] = [None] * len(tasks)
    send: list[int] = []
    for index, task in enumerate(tasks):
        why = overlap_refused(target, task)
        if why is not None:
            results[index] = refused(task, why)
        else:
            send.append(index)
    return results, send


class _Staged:
    """Adapts a target that does not stage to StagedTarget: nothing is built ahead."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.name = target.name

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        return await self.target.enqueue(tasks, now)

    def prepare(self, tasks: Sequence[Task]) -> Prepared:
        return Prepared(list(tasks))

    async def send(self, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
        return await self.target.enqueue(prepared.tasks, now)

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        return self.target.completion_off(options)

    async def close(self) -> None:
        await self.target.close()


async def send_prepared(target: Target, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
    """Send ``prepared`` through ``target``; a batch that was not prepared (``data`` None: the
    default, or a ``prepare`` that failed) is enqueued as it is."""
    if prepared.data is None:
        return await target.enqueue(prepared.tasks, now)
    return await staged(target).send(prepared, now)


def staged(target: Target) -> StagedTarget:
    """``target`` itself when it stages, else an adapter doing both steps at the instant."""
    if isinstance(target, StagedTarget):
        return target
    return _Staged(target)
