"""An in-process target for code and tests: keeps messages in lists, dedupes by idempotency key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from periodic_manager.contracts import EnqueueResult, Task
from periodic_manager.errors import TargetError
from periodic_manager.targets.base import no_signal


class MemoryTarget:
    """Records every enqueued task; ``fail_with`` makes the next enqueues raise TargetError."""

    name = "memory"

    def __init__(self) -> None:
        self.messages: list[tuple[Task, datetime]] = []
        self.batches: list[list[Task]] = []
        self._keys: dict[str, str] = {}
        self.fail_with: str | None = None

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        if self.fail_with is not None:
            raise TargetError(self.fail_with)
        self.batches.append(list(tasks))
        results: list[EnqueueResult] = []
        for task in tasks:
            existing = self._keys.get(task.idempotency_key)
            if existing is not None:
                results.append(EnqueueResult(task, "duplicate", existing))
                continue
            msg_id = str(len(self.messages) + 1)
            self._keys[task.idempotency_key] = msg_id
            self.messages.append((task, now))
            results.append(EnqueueResult(task, "enqueued", msg_id))
        return results

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        return no_signal(options)

    def forget(self) -> None:
        """Lose every claim, as a broker restarted without persistence does (messages stay)."""
        self._keys.clear()

    def slots(self, name: str) -> list[datetime]:
        return [t.scheduled_at for t, _ in self.messages if t.name == name]

    async def close(self) -> None:
        return None
