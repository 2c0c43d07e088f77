"""The asynq target: tasks for Go workers running an unmodified ``asynq.Server``.

``message`` (a slot as asynq's client would enqueue it), ``proto``
(asynq's protobuf messages from a schema written here), ``scheduler`` (what asynq's tools read of
a scheduler) and ``target`` (the claim-and-enqueue script, the state signals, the announcements).
The target's write-time rule is here (:func:`task_problem`), light to import: no protobuf.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from periodic_manager.plugins.task_rules import TaskProblem
from periodic_manager.targets.asynq.message import EXTRA_SECONDS, NO_RETENTION, extra_seconds


def task_problem(
    task_type: str, payload_json: str, options: Mapping[str, Any]
) -> TaskProblem | None:
    """What the asynq target refuses whenever the task is sent
    (:mod:`~periodic_manager.plugins.task_rules`): ``options.extra.deadline`` or
    ``options.extra.retention`` that is no number of seconds in range, as
    :func:`~periodic_manager.targets.asynq.message.asynq_fields` refuses it (asynq's queue names are the common rule's, which has no ``{`` or ``}``); and
    ``options.pause_after_failures`` without ``options.extra.retention``, since asynq keeps no
    trace of a task that succeeded without one."""
    for key in EXTRA_SECONDS:
        try:
            extra_seconds(options, key)
        except ValueError as exc:
            return TaskProblem(f"options.extra.{key}", str(exc).split(" ", 1)[1])
    if "pause_after_failures" in options and extra_seconds(options, "retention") is None:
        return TaskProblem("options.pause_after_failures", NO_RETENTION)
    return None
