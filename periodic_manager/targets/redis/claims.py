"""Per-slot claims in Redis for Celery and arq: pending claims for the messages that do not live
in that Redis step for step with the claim (Celery through kombu, to RabbitMQ or any other
broker), and the same keys for those written with their claim in one script (arq, Celery on a
Redis broker).

A claim is a key ``<prefix>:claim:<idempotency key>`` with a TTL of ``(expires_at - now) +
margin`` (at least 1 s): past ``expires_at`` no manager may send the slot, so the claims alive at
any moment are those of the last ``grace + margin`` seconds, whatever the uptime. Its value says
how far the slot got:

- ``p|<task id>|<owner>|<ms>``: **pending**. Taken by ``owner`` (one per target object) at
  ``ms`` (Redis's own clock) before the publish; the broker has not confirmed the message yet.
- ``s|<task id>``: **sent**. The broker confirmed the message, or the claim was written in the
  same Redis step as the message (arq, Celery on a Redis broker). Any other value (the bare task
  id older versions stored) counts as sent too.

A pending claim is never taken for "sent": if its publish failed, timed out or its reply was
lost, the slot is published again with the same task id (``resend``), by its owner at once or by
anyone once the claim is older than ``stale_s`` (its owner died or gave up) or dated more than a
second ahead of Redis's clock (it would never grow old). A re-publish may deliver the task twice
when only the confirmation was lost: it is reported ``resent`` so that it is counted. A slot is
never lost for a claim whose message did not arrive.

arq and Celery on a Redis broker write the claim and the message in one script and never leave a
claim pending: they read pending values only to wait for, or take over, a publish through kombu
of the same slot. Redis Streams keeps claims of its own beside each stream
(``{<prefix>:<queue>}:claim:<idempotency key>``, valued with the stream entry id).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.typing import EncodableT

from periodic_manager.contracts import Task
from periodic_manager.targets.redis import lua
from periodic_manager.targets.redis.errors import redis_errors
from periodic_manager.targets.redis.flags import SENT

# The scripts (their arguments and flags are written at their top).
CLAIM = lua.script("periodic_manager.targets.redis", "claim.lua")
SETTLE = lua.script("periodic_manager.targets.redis", "settle.lua")
# How often a slot held pending by another publisher is looked at again (a duration of I/O).
RECHECK_S = 0.1


def claim_ttl_ms(task: Task, now: datetime, margin: float) -> int:
    """How long the claim of ``task`` taken at ``now`` lives: until the task expires (no manager
    may send its slot after that), plus ``margin`` seconds; at least 1 s. The one rule for every
    claim, these and Redis Streams' own."""
    # In UTC: two datetimes of one zone subtract as wall-clock times, wrong across DST.
    left = task.expires_at.astimezone(UTC) - now.astimezone(UTC)
    return max(1000, math.ceil((left.total_seconds() + margin) * 1000))


def sent_value(task_id: str) -> str:
    """The value of a claim whose message the broker has."""
    return f"s|{task_id}"


def is_pending(value: object) -> bool:
    """Whether a stored claim value is a pending claim (not confirmed by the broker)."""
    if isinstance(value, bytes):
        return value.startswith(b"p|")
    return isinstance(value, str) and value.startswith("p|")


class RedisClaims:
    """Claims of idempotency keys under ``<prefix>:claim:``.

    ``stale_s``: how old another publisher's pending claim must be before it counts as
    abandoned (longer than any publish can take: its publisher has given up by then).
    """

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        prefix: str = "pm",
        margin: float = 60.0,
        stale_s: float = 15.0,
    ) -> None:
        if not prefix:
            raise ValueError("prefix must be non-empty")
        if margin < 0 or stale_s <= 0:
            raise ValueError("margin must be >= 0 and stale_s > 0")
        self.client = client
        self.prefix = prefix
        self.margin = margin
        self.stale_ms = math.ceil(stale_s * 1000)
        self.owner = os.urandom(6).hex()  # this publisher's pending claims
        self._claim = client.register_script(CLAIM)
        self._settle = client.register_script(SETTLE)

    async def ping(self) -> None:
        """Raise unless the claims' Redis answers (a readiness check)."""
        await self.client.ping()

    def key(self, idempotency_key: str) -> str:
        return f"{self.prefix}:claim:{idempotency_key}"

    def ttl_ms(self, task: Task, now: datetime) -> int:
        """How long the claim of ``task`` taken at ``now`` lives (:func:`claim_ttl_ms`)."""
        return claim_ttl_ms(task, now, self.margin)

    async def claim(
        self,
        tasks: Sequence[Task],
        now: datetime,
        prevs: Sequence[Sequence[Any] | None] | None = None,
    ) -> list[int]:
        """Take a pending claim of every task's slot where it is free (or resendable); one flag
        per task (:mod:`~periodic_manager.targets.redis.flags`): NEW, RESEND, SENT, ELSEWHERE or
        WRONGTYPE. A key repeated in ``tasks`` is NEW once.

        ``prevs`` (options.overlap), one per task or None: the compare-and-set of its schedule's
        previous-task key (key, value read, new value, TTL ms); such a task may also be BUSY."""
        if not tasks:
            return []
        rows: list[list[Any]] = [[t.idempotency_key, t.id, self.ttl_ms(t, now)] for t in tasks]
        if prevs is not None:
            for row, prev in zip(rows, prevs, strict=True):
                if prev is not None:
                    row += prev
        args: list[EncodableT] = [self.key(""), json.dumps(rows), self.owner, self.stale_ms]
        flags = await self._run(self._claim, args)
        seen: set[str] = set()
        out = []
        for task, flag in zip(tasks, flags, strict=True):
            flag = int(flag)
            if flag != SENT and task.idempotency_key in seen:
                flag = SENT  # the same slot twice in one batch: once
            seen.add(task.idempotency_key)
            out.append(flag)
        return out

    async def confirm(self, tasks: Sequence[Task]) -> None:
        """The broker confirmed these tasks: their pending claims become sent."""
        await self._update(tasks, sent=True)

    async def release(self, tasks: Sequence[Task]) -> None:
        """These tasks were never handed to the broker: free their pending claims, so that a
        retry claims the slot anew (raises TargetError on failure)."""
        await self._update(tasks, sent=False)

    async def _update(self, tasks: Sequence[Task], *, sent: bool) -> None:
        if not tasks:
            return
        rows = [[t.idempotency_key, t.id, sent_value(t.id) if sent else ""] for t in tasks]
        await self._run(self._settle, [self.key(""), self.owner, json.dumps(rows)])

    async def _run(self, script: AsyncScript, args: list[EncodableT]) -> Any:
        with redis_errors("claims"):
            return await script(keys=[], args=args)

    async def until_free(
        self, ask: Callable[[list[int]], Awaitable[list[int]]], indices: list[int]
    ) -> list[int]:
        """Claim ``indices`` with ``ask`` (it takes what it can and returns those another
        publisher holds pending) and ask again for those until they are sent or abandoned, for at
        most the stale time (a publish elsewhere ends, or is given up, well before) plus 1 s.
        Returns those still held then: the caller reports them failed (:meth:`held_error`), and
        the scheduler retries them; the others were taken by ``ask`` meanwhile."""
        if not indices:
            return []
        waiting = await ask(indices)
        deadline = time.monotonic() + self.wait_s  # a duration, not a slot
        while waiting and time.monotonic() <= deadline:
            await asyncio.sleep(RECHECK_S)  # the other publisher's broker answers meanwhile
            waiting = await ask(waiting)
        return waiting

    @property
    def wait_s(self) -> float:
        """How long :meth:`until_free` waits for slots held by another publisher."""
        return self.stale_ms / 1000 + 1

    def held_error(self, what: str) -> str:
        """The error of a slot :meth:`until_free` gave up on."""
        return f"{what}: another publisher held the slot pending for more than {self.wait_s:g} s"
