"""Targets: Redis Streams (native) and the database outbox (embedded default)."""

from periodic_manager.contracts import EnqueueResult, Target, Task
from periodic_manager.targets.base import task_id_for

__all__ = ["EnqueueResult", "Target", "Task", "task_id_for"]
