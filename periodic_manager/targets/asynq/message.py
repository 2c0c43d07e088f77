"""How a slot becomes an asynq task: the ``TaskMessage`` asynq's client would build for it, and
the uniqueness lock it would take (asynq v0.24 to v0.26: ``client.go`` ``EnqueueContext`` and
``composeOptions``, ``internal/base`` ``UniqueKey``).

- ``task_type`` -> ``type``; the payload -> ``payload``: its JSON text as bytes, except a JSON
  string, whose own text is sent (``"abc"`` -> ``abc``), and ``null``, sent as no payload;
- the task id -> ``id``: the idempotency key itself (``<name>:<slot UTC>``);
- ``options.queue`` -> ``queue`` (``default``); ``options.max_retry`` -> ``retry`` (asynq's
  default, 25, when unset);
- ``options.timeout`` -> ``timeout`` in whole seconds, rounded up; ``options.extra.deadline``
  (seconds after the slot) -> ``deadline`` (Unix seconds); neither: asynq's client default, a
  timeout of 30 minutes;
- ``options.extra.retention`` -> ``retention`` (whole seconds, rounded up): how long asynq keeps a
  completed task;
- ``options.unique_ttl`` -> ``unique_key`` and the lock: the key asynq computes from queue, type
  and payload (``asynq:{<queue>}:unique:<type>:<md5 of the payload>``), held by the task id for
  that many whole seconds (rounded up; asynq's minimum is 1 s);
- with ``PM_OTEL``, ``headers`` (field 15, asynq >= v0.25) ``{"traceparent": ...}``: the W3C
  trace context a handler continues (``task.Headers()``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from periodic_manager.contracts import Task
from periodic_manager.schedules.rules import MAX_DURATION_S
from periodic_manager.tracing import trace_headers

DEFAULT_MAX_RETRY = 25  # asynq's client: defaultMaxRetry
DEFAULT_TIMEOUT_S = 30 * 60  # asynq's client: defaultTimeout, when neither timeout nor deadline
# Keys of options.extra the asynq target reads: seconds after the slot, and seconds kept.
EXTRA_SECONDS = ("deadline", "retention")
NO_RETENTION = (
    "asynq deletes a task that succeeded unless options.extra.retention keeps it: set "
    "options.extra.retention (seconds) so that success leaves a trace"
)


def queue_prefix(queue: str) -> str:
    """Every key of ``queue`` starts with this (asynq's ``QueueKeyPrefix``): the queue's name is
    the hash tag, so one queue is one Redis Cluster slot."""
    return f"asynq:{{{queue}}}:"


def payload_bytes(payload_json: str) -> bytes:
    """The ``payload`` of the task: the JSON text's bytes, a string's own text, or none for
    ``null``."""
    if payload_json == "null":
        return b""
    if payload_json.startswith('"'):
        text: str = json.loads(payload_json)
        return text.encode()
    return payload_json.encode()


def unique_key(queue: str, task_type: str, payload: bytes) -> str:
    """asynq's uniqueness lock of a task (``base.UniqueKey``): no checksum for no payload."""
    checksum = hashlib.md5(payload, usedforsecurity=False).hexdigest() if payload else ""
    return f"{queue_prefix(queue)}unique:{task_type}:{checksum}"


def _duration(value: Any, field: str) -> float | None:
    """``value`` as a number of seconds > 0 and at most 366 days, or None when unset;
    ValueError naming ``field`` when it is anything else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        value = math.nan
    if not 0 < value <= MAX_DURATION_S:
        raise ValueError(
            f"{field} must be a number of seconds > 0 and at most {MAX_DURATION_S} (366 days)"
        )
    return float(value)


def extra_seconds(options: Mapping[str, Any], key: str) -> float | None:
    """``options.extra.<key>`` (a number of seconds, > 0 and at most 366 days), or None when
    unset; ValueError naming the field when it is anything else."""
    extra = options.get("extra")
    return _duration(extra.get(key) if isinstance(extra, dict) else None, f"options.extra.{key}")


def _seconds(options: Mapping[str, Any], key: str) -> int | None:
    """``options.<key>`` (checked by the common rules) in whole seconds, rounded up."""
    value = _duration(options.get(key), f"options.{key}")
    return None if value is None else math.ceil(value)


@dataclass(frozen=True, slots=True)
class AsynqTask:
    """One task as asynq's client would write it."""

    queue: str
    task_id: str
    msg: bytes  # the encoded TaskMessage
    unique_key: str  # "" : no uniqueness lock
    unique_ttl_s: int  # 0: none


def asynq_fields(task: Task) -> dict[str, Any]:
    """The fields of the task's ``TaskMessage`` (ValueError if the task cannot be one)."""
    options = task.options
    if not task.task_type.strip():
        raise ValueError("task_type must not be blank (asynq refuses an empty type)")
    retry = options.get("max_retry")
    if retry is None:
        retry = DEFAULT_MAX_RETRY
    timeout = _seconds(options, "timeout") or 0
    deadline = 0  # asynq's "no deadline": time.Unix(0, 0)
    after = extra_seconds(options, "deadline")
    if after is not None:
        deadline = math.floor(task.scheduled_at.astimezone(UTC).timestamp() + after)
    if not timeout and not deadline:
        timeout = DEFAULT_TIMEOUT_S
    retention = extra_seconds(options, "retention")
    payload = payload_bytes(task.payload_text())
    fields: dict[str, Any] = {
        "type": task.task_type,
        "payload": payload,
        "id": task.idempotency_key,
        "queue": task.queue,
        "retry": int(retry),
        "timeout": timeout,
        "deadline": deadline,
        "retention": math.ceil(retention) if retention is not None else 0,
    }
    if options.get("unique_ttl") is not None:
        fields["unique_key"] = unique_key(task.queue, task.task_type, payload)
    if task.traceparent is not None:  # PM_OTEL: asynq >= v0.25 hands headers to the handler
        fields["headers"] = trace_headers(task)
    return fields


def asynq_task(task: Task, message_class: Any) -> AsynqTask:
    """``task`` as asynq's client would write it, its message encoded with ``message_class``
    (:data:`~periodic_manager.targets.asynq.proto.TaskMessage`)."""
    fields = asynq_fields(task)
    msg: bytes = message_class(**fields).SerializeToString()
    ttl = _seconds(task.options, "unique_ttl") or 0
    return AsynqTask(task.queue, task.idempotency_key, msg, fields.get("unique_key", ""), ttl)
