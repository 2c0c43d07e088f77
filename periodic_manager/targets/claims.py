"""Per-slot claims in Redis for targets whose enqueue is not one atomic Redis step (Celery, arq).

A claim is ``SET <prefix>:claim:<idempotency_key> <task id> NX PX <ttl>``, taken *before* the
message is handed to the broker: the manager that wins the claim publishes, every other attempt
at the slot (a second manager, a restart, a retry) finds the claim and reports ``duplicate``. A
claim whose publish failed is deleted again, so a retry within grace can still publish the slot.

The TTL is the one of the Redis Streams target, ``(expires_at - now) + margin`` (at least 1 s):
past ``expires_at`` no manager may enqueue the slot, so claims alive at any moment are the slots
enqueued in the last ``grace + margin`` seconds, whatever the uptime.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from periodic_manager.errors import TargetError
from periodic_manager.targets.base import Task


class RedisClaims:
    """Claims of idempotency keys under ``<prefix>:claim:``; every call bounded by ``timeout``."""

    def __init__(self, client: aioredis.Redis, *, prefix: str = "pm", margin: float = 60.0) -> None:
        if not prefix:
            raise ValueError("prefix must be non-empty")
        if margin < 0:
            raise ValueError("margin must be >= 0")
        self.client = client
        self.prefix = prefix
        self.margin = margin

    async def ping(self) -> None:
        """Raise unless the claims' Redis answers (a readiness check)."""
        await self.client.ping()

    def key(self, idempotency_key: str) -> str:
        return f"{self.prefix}:claim:{idempotency_key}"

    def ttl_ms(self, task: Task, now: datetime) -> int:
        # In UTC: two datetimes of one zone subtract as wall-clock times, wrong across DST.
        left = task.expires_at.astimezone(UTC) - now.astimezone(UTC)
        return max(1000, math.ceil((left.total_seconds() + self.margin) * 1000))

    async def claim(self, tasks: Sequence[Task], now: datetime) -> list[bool]:
        """Claim every task's key in one pipeline; True where this call won the claim.

        A key repeated within ``tasks`` is won once (its first occurrence).
        """
        if not tasks:
            return []
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for task in tasks:
                    pipe.set(
                        self.key(task.idempotency_key), task.id, nx=True, px=self.ttl_ms(task, now)
                    )
                replies = await pipe.execute()
        except (RedisError, OSError, TimeoutError) as exc:
            raise TargetError(f"claims: {type(exc).__name__}: {exc}") from exc
        return [bool(reply) for reply in replies]

    async def release(self, tasks: Sequence[Task]) -> None:
        """Delete the claims of tasks that were not published (raises TargetError on failure)."""
        if not tasks:
            return
        try:
            await self.client.delete(*(self.key(t.idempotency_key) for t in tasks))
        except (RedisError, OSError, TimeoutError) as exc:
            raise TargetError(f"claims: {type(exc).__name__}: {exc}") from exc


def split_payload(payload: object) -> tuple[list[object], dict[str, object]]:
    """A schedule's payload as call arguments: object -> kwargs, array -> args, null -> none,
    anything else -> one positional argument."""
    if isinstance(payload, dict):
        return [], dict(payload)
    if isinstance(payload, list | tuple):
        return list(payload), {}
    if payload is None:
        return [], {}
    return [payload], {}


def utc_instant(instant: datetime) -> datetime:
    """``instant`` in UTC; naive datetimes are refused."""
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"naive datetime {instant!r}; pass an aware instant")
    return instant.astimezone(UTC)
