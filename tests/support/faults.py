"""Shared by the fault tests (tests/behaviour/): one slot and batches of tasks due in it, the
scheduler's bounded retry (test_lost_replies.py, test_celery_faults.py); schedules written with
SQL, the slots they must send, and who leads (test_faults.py, test_broker_forgets.py); the audit
of a Redis stream: how many messages carry each slot's key, and none twice, none missing.

The throwaway Redis servers these tests break are fixtures of tests/behaviour/conftest.py.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from periodic_manager.contracts import EnqueueResult, Target, Task
from periodic_manager.errors import TargetError
from periodic_manager.schedules.definition import PeriodicTaskConfig, idempotency_key
from periodic_manager.targets.base import task_id_for

T0 = datetime(2024, 5, 1, 12, 0, 0, 500000, tzinfo=UTC)  # half a second past a minute
SLOT = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
QUEUE = "default"
RETRIES = 40  # bound of until_sent: 40 tries, 0.25 s apart


def slot_tasks(
    prefix: str, name: str, n: int, *, queue: str = "q", task_type: str = "pmtest.record"
) -> list[Task]:
    """``n`` tasks ``{prefix}.{name}{i}`` due at SLOT on ``queue``, each with its own claim key."""
    out = []
    for i in range(n):
        key = f"{prefix}.{name}{i}:2024-05-01T12:01:00Z"
        out.append(
            Task(
                id=task_id_for(key),
                name=f"{prefix}.{name}{i}",
                task_type=task_type,
                payload={"i": i},
                queue=queue,
                options={"queue": queue},
                idempotency_key=key,
                scheduled_at=SLOT,
                expires_at=SLOT + timedelta(seconds=30),
            )
        )
    return out


async def until_sent(target: Target, tasks: list[Task]) -> list[EnqueueResult]:
    """Retry as the scheduler does while the slot is within grace, until the batch goes through
    (bounded: RETRIES tries)."""
    for _ in range(RETRIES):
        try:
            return await target.enqueue(tasks, SLOT)
        except TargetError:
            await asyncio.sleep(0.25)  # the broker is coming back: a bounded retry, not a slot
    raise AssertionError(f"the batch never went through in {RETRIES} tries")


def dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


async def insert_schedules(
    url: str,
    rows: Iterable[tuple[str, str, dict[str, Any]]],
    effective_at: datetime | None = T0 - timedelta(days=1),
    *,
    task_type: str = "fault.task",
    payload: Any = None,
) -> None:
    """Bulk-insert ``(name, spec, options)`` rows into ``periodic_jobs``, each with ``task_type``
    and ``payload``.

    ``effective_at``: when the schedules began. By default a day before the tests' virtual start
    (they existed long before); None lets the database stamp its own time, as for any SQL insert.
    """
    conn = await asyncpg.connect(dsn(url))
    try:
        await conn.executemany(
            "INSERT INTO periodic_jobs"
            " (name, spec, timezone, task_type, payload, options, enabled, effective_at)"
            " VALUES ($1, $2, 'UTC', $5, $6, $3, true, $4)",
            [
                (name, spec, json.dumps(opts), effective_at, task_type, json.dumps(payload))
                for name, spec, opts in rows
            ],
        )
    finally:
        await conn.close()


def expected_slots(name: str, spec: str, after: datetime, until: datetime) -> list[str]:
    """Idempotency keys of every slot of ``spec`` in ``(after, until]``."""
    schedule = PeriodicTaskConfig.create(name=name, spec=spec, task_type="t").schedule
    out, slot = [], schedule.next_after(after)
    while slot <= until:
        out.append(idempotency_key(name, slot))
        slot = schedule.next_after(slot)
    return out


async def leaders(url: str) -> dict[int, bool]:
    """pid -> is_leader of every manager published in pm_managers."""
    conn = await asyncpg.connect(dsn(url))
    try:
        rows = await conn.fetch("SELECT pid, is_leader FROM pm_managers")
    finally:
        await conn.close()
    return {r["pid"]: r["is_leader"] for r in rows}


async def stream_keys(redis: aioredis.Redis, prefix: str, queue: str = QUEUE) -> Counter[str]:
    """How many messages of the queue's stream carry each idempotency key."""
    key, start, counts = f"{{{prefix}:{queue}}}:stream", "-", Counter[str]()
    while True:
        batch = await redis.xrange(key, min=start, count=10_000)
        for _, fields in batch:
            counts[fields["idempotency_key"]] += 1
        if len(batch) < 10_000:
            return counts
        start = "(" + batch[-1][0]


def assert_exactly_once(counts: Counter[str], expected: Iterable[str]) -> None:
    twice = {k: n for k, n in counts.items() if n > 1}
    assert not twice, (
        f"{len(twice)} slot(s) enqueued more than once, e.g. {list(twice.items())[:5]}"
    )
    missing = [k for k in expected if k not in counts]
    assert not missing, f"{len(missing)} slot(s) missing, e.g. {missing[:5]}"
