"""Shared by the fault tests of the targets (tests/behaviour/test_lost_replies.py,
test_celery_faults.py): one slot, batches of tasks due in it, and the scheduler's bounded retry.

The throwaway Redis servers these tests break are fixtures of tests/behaviour/conftest.py.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from periodic_manager.contracts import EnqueueResult, Target, Task
from periodic_manager.errors import TargetError
from periodic_manager.targets.base import task_id_for

SLOT = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
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
                id=task_id_for(key), name=f"{prefix}.{name}{i}", task_type=task_type,
                payload={"i": i}, queue=queue, options={"queue": queue}, idempotency_key=key,
                scheduled_at=SLOT, expires_at=SLOT + timedelta(seconds=30),
            )  # fmt: skip
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
