"""Task states from a Celery result backend: how the celery target tells that a task finished
(``options.overlap`` skip and hold).

The state of the previous task of a schedule is read by its task id (ours: the uuid5 of its
idempotency key) from the result backend the workers write to (``PM_CELERY_RESULT_BACKEND``, or
the ``result_backend`` of ``PM_CELERY_APP``):

- ``SUCCESS``, ``FAILURE``, ``REVOKED`` (Celery's ready states): finished;
- ``STARTED`` (only written with ``task_track_started``), or a custom state a running task set
  with ``update_state``: running;
- ``RECEIVED``, ``RETRY``: queued (waiting to run, or to run again);
- ``PENDING``: unfinished. Celery says PENDING for every id it knows nothing of: a task queued,
  running without ``task_track_started``, or whose result has expired (``result_expires``, one
  day by default) or was never stored (``ignore_result``). So the workers must store results, and
  keep them longer than the schedule's interval, or ``options.overlap_timeout`` must be set.

Backend calls are blocking in Celery; they run in a worker thread, the batch bounded by
``timeout``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from periodic_manager.contracts import FINISHED, QUEUED, RUNNING, UNFINISHED
from periodic_manager.schedules.failures import FAILED, PENDING, SUCCEEDED, UNKNOWN
from periodic_manager.targets.celery.app import REDIS_SCHEMES, import_celery

_READY = frozenset({"SUCCESS", "FAILURE", "REVOKED"})
_WAITING = frozenset({"RECEIVED", "RETRY"})


def outcome_of(status: object) -> str:
    """options.pause_after_failures: SUCCESS succeeded, FAILURE failed, REVOKED unknown (stopped,
    neither way), any other status pending (PENDING too: a result that expired stays PENDING,
    which the count stops waiting for after ``schedules.failures.UNDECIDED_FOR``)."""
    if status == "SUCCESS":
        return SUCCEEDED
    if status == "FAILURE":
        return FAILED
    if status == "REVOKED":
        return UNKNOWN
    return PENDING


def state_of(status: object) -> str:
    """Our state of a Celery task status (see the module docstring)."""
    if status in _READY:
        return FINISHED
    if status == "PENDING" or not isinstance(status, str):
        return UNFINISHED
    if status in _WAITING:
        return QUEUED
    return RUNNING  # STARTED, or a custom state set by the running task


class ResultStates:
    """Reads task states from the result backend at ``url``; ``settings``: the app's other
    ``result_*`` settings (serializer, transport options, key prefix) are honoured."""

    def __init__(
        self, url: str, settings: Mapping[str, Any] | None = None, *, timeout: float = 5.0
    ) -> None:
        celery = import_celery()
        conf = {k: v for k, v in (settings or {}).items() if k.startswith("result_")}
        conf["result_backend"] = url
        if url.startswith(REDIS_SCHEMES):  # bounded calls, unless the app says otherwise
            conf.setdefault("redis_socket_timeout", timeout)
            conf.setdefault("redis_socket_connect_timeout", timeout)
        app = celery.Celery("periodic_manager_results", set_as_current=False)
        app.conf.update(conf)
        self.app = app
        self.backend = app.backend
        self.timeout = timeout

    async def __call__(self, task_ids: Sequence[str]) -> list[str]:
        """The state of each task; raises TimeoutError past ``timeout``, or the backend's error."""
        return [state_of(status) for status in await self.statuses(task_ids)]

    async def statuses(self, task_ids: Sequence[str]) -> list[object]:
        """Celery's status of each task as the backend holds it (PENDING: unknown to it)."""
        ids = list(task_ids)
        async with asyncio.timeout(self.timeout):
            return await asyncio.to_thread(self._read, ids)

    def _read(self, task_ids: list[str]) -> list[object]:
        return [self.backend.get_task_meta(task_id).get("status") for task_id in task_ids]

    def close(self) -> None:
        self.app.close()
