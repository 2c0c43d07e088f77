"""The scheduler's target when tracing is on: every batch it prepares is stamped with its trace
(the tasks' ``traceparent``) before the target encodes it, and every call that sends is recorded
as spans once the target answered. Only the scheduler's own sending goes through it; the
manager keeps the target itself for everything else (its capabilities, health, close)."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from periodic_manager.contracts import Clock, EnqueueResult, Prepared, StagedTarget, Task

if TYPE_CHECKING:
    from periodic_manager.tracing.otel import SlotTracing


class TracedTarget:
    """A :class:`~periodic_manager.contracts.StagedTarget` around another one, traced."""

    def __init__(self, target: StagedTarget, tracing: SlotTracing, clock: Clock) -> None:
        self.target = target
        self.tracing = tracing
        self.clock = clock
        self.name = target.name

    def _stamp(self, tasks: Sequence[Task]) -> None:
        # Stamped once: a batch prepared again (a part of it fenced off) keeps its trace.
        if tasks and tasks[0].traceparent is None:
            self.tracing.stamp(tasks)

    def prepare(self, tasks: Sequence[Task]) -> Prepared:
        self._stamp(tasks)
        return self.target.prepare(tasks)

    async def send(self, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
        return await self._traced(self.target.send(prepared, now), prepared.tasks, now)

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        self._stamp(tasks)
        return await self._traced(self.target.enqueue(tasks, now), tasks, now)

    async def _traced(
        self, call: Awaitable[list[EnqueueResult]], tasks: Sequence[Task], now: datetime
    ) -> list[EnqueueResult]:
        self.tracing.enter(tasks)
        try:
            results = await call
        except Exception as exc:
            self.tracing.sent(self.name, tasks, now, self.clock.now(), None, exc)
            raise
        self.tracing.sent(self.name, tasks, now, self.clock.now(), results)
        return results

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        return self.target.completion_off(options)

    async def close(self) -> None:
        await self.target.close()
