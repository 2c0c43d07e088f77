"""A slot as the arguments of Celery's ``app.send_task``: what the message says, whichever way it
goes to the broker.

- payload -> arguments: a JSON object becomes keyword arguments, an array positional arguments,
  ``null`` no arguments, any other value one positional argument;
- ``task_id`` = the task id (uuid5 of the idempotency key: the same on every manager);
- headers ``idempotency_key``, ``scheduled_at`` (UTC ISO-8601 with ``Z``), ``periodic_name``
  (the schedule's name) and, with ``PM_OTEL``, ``traceparent``; a Celery task reads them as
  ``self.request.idempotency_key`` etc.;
- ``options.queue`` -> ``queue`` (without it the app routes as usual: its ``task_routes``, then
  its ``task_default_queue``); ``options.timeout`` -> ``time_limit``; ``options.extra``:
  ``routing_key``, ``exchange``, ``priority`` (0-255), ``soft_time_limit`` (seconds) and
  ``expires`` (seconds after the slot; the worker discards the task after that).
  ``max_retry`` and ``unique_ttl`` have no per-message equivalent in Celery and are not sent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from periodic_manager.contracts import Task
from periodic_manager.schedules.instants import slot_text
from periodic_manager.targets.base import split_payload
from periodic_manager.tracing import trace_headers


def celery_message(task: Task, now: datetime, scheduled_text: str | None = None) -> dict[str, Any]:
    """The keyword arguments of ``app.send_task`` for ``task`` (ValueError if options are bad).

    ``scheduled_text``: ``slot_text(task.scheduled_at)`` when the caller has it already."""
    options = task.options
    extra = options.get("extra") or {}
    if not isinstance(extra, Mapping):
        raise ValueError("options.extra must be a JSON object")
    args, kwargs = split_payload(task.payload)
    msg: dict[str, Any] = {
        "name": task.task_type,
        "args": args,
        "kwargs": kwargs,
        "task_id": task.id,
        "headers": {
            "idempotency_key": task.idempotency_key,
            "scheduled_at": scheduled_text or slot_text(task.scheduled_at),
            "periodic_name": task.name,
            **trace_headers(task),
        },
        "add_to_parent": False,
    }
    if "queue" in options:
        msg["queue"] = task.queue
    if options.get("timeout") is not None:
        msg["time_limit"] = float(options["timeout"])
    if extra:
        _extra(msg, extra, task, now)
    return msg


def _extra(msg: dict[str, Any], extra: Mapping[str, Any], task: Task, now: datetime) -> None:
    """``options.extra`` into the send_task arguments ``msg``."""
    for key in ("routing_key", "exchange"):
        value = _text(extra, key)
        if value is not None:
            msg[key] = value
    priority = extra.get("priority")
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 255:
            raise ValueError("options.extra.priority must be an integer from 0 to 255")
        msg["priority"] = priority
    soft = _seconds(extra, "soft_time_limit")
    if soft is not None:
        msg["soft_time_limit"] = soft
    expires = _seconds(extra, "expires")
    if expires is not None:
        # Relative seconds, counted on the manager's clock from the slot; Celery turns them into
        # an absolute instant when it builds the message.
        end = task.scheduled_at.astimezone(UTC) + timedelta(seconds=expires)
        msg["expires"] = max(0.0, (end - now.astimezone(UTC)).total_seconds())


def _seconds(extra: Mapping[str, Any], key: str) -> float | None:
    value = extra.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"options.extra.{key} must be a number of seconds")
    if value <= 0:
        raise ValueError(f"options.extra.{key} must be > 0")
    return float(value)


def _text(extra: Mapping[str, Any], key: str) -> str | None:
    value = extra.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"options.extra.{key} must be a non-empty string")
    return value
