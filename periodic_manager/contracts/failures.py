"""``options.pause_after_failures``: what a runtime store offers to count a schedule's failed
tasks, and who pauses the schedule once they are too many (``runtime.failures``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

__all__ = [
    "FailureCount",
    "FailureStore",
    "Pauser",
]


@dataclass(frozen=True, slots=True)
class FailureCount:
    """``options.pause_after_failures``: a schedule's consecutive failed tasks as stored, and the
    sent runs after the last one counted (slot, message id), oldest first."""

    failures: int
    checked_at: datetime | None
    runs: list[tuple[datetime, str | None]]


@runtime_checkable
class FailureStore(Protocol):
    """What a runtime store offers to count failed tasks (``DatabaseRuntimeStore`` does)."""

    async def failure_count(self, schedule_key: str, limit: int) -> FailureCount:
        """The stored count of ``schedule_key`` and at most ``limit`` sent runs after it."""
        ...

    async def save_failure_count(
        self, schedule_key: str, failures: int, checked_at: datetime
    ) -> None:
        """Store the count up to the run of slot ``checked_at``, unless one at a later slot is
        stored already (two managers never move it back)."""
        ...

    async def reset_failure_count(self, schedule_key: str) -> None:
        """Count from 0 again (the manager paused the schedule for its failures)."""
        ...


class Pauser(Protocol):
    """Pauses a schedule by the manager (``options.pause_after_failures``), through the one
    schedule writer: the change history records the source ``manager``."""

    async def pause(self, schedule_key: str, note: str, manager_id: str) -> bool:
        """Pause the schedule with ``note`` unless it is gone or paused already (False)."""
        ...
