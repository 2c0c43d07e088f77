"""Targets: Redis Streams (native) and the database outbox (embedded default)."""

from periodic_manager.targets.base import EnqueueResult, Target, Task, task_id_for

__all__ = ["EnqueueResult", "Target", "Task", "task_id_for"]
