"""Traces of the slots (``PM_OTEL``): what every target reads, and the switch that starts them.

With ``PM_OTEL=true`` the manager exports OpenTelemetry spans of what it sends (OTLP, the SDK's
own ``OTEL_*`` variables) and puts a W3C ``traceparent`` into every task
(:attr:`~periodic_manager.contracts.Task.traceparent`) that names one of those spans, so a worker
that continues the trace shows schedule -> enqueue -> run as one trace. The spans:

- one trace per sub-batch sent (up to ``engine.dispatch.SEND_CHUNK`` slots of one instant): its
  root span ``pm.send`` is the first attempt to send it (target, slot, size,
  outcomes, the first schedules' names and queues as attributes); every retry of some of its
  tasks is a ``pm.retry`` child;
- one ``pm.slot`` span per slot, child of its batch, from the slot's instant to its
  outcome (schedule, slot, target, queue, task id, status; the error when it failed), for the
  first ``otel.SLOT_SPANS`` slots of each batch and for up to as many more whose outcome was not
  ``enqueued``. A task whose slot has no span of its own carries the batch span as its parent.

Ids and the sampling decision (``OTEL_TRACES_SAMPLER``) are decided when the batch is prepared,
before its instant, so the task's message is built with its ``traceparent``; the spans are made
after the target answered, with their explicit timestamps, so the instant itself pays nothing
but carrying the header. With tracing off nothing of OpenTelemetry is imported and no code of
this package runs in the send path (the scheduler's target is not wrapped).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from periodic_manager.contracts import Task
    from periodic_manager.tracing.otel import SlotTracing

__all__ = ["TRACEPARENT", "start_tracing", "trace_headers", "traceparent_of"]

TRACEPARENT = "traceparent"  # the W3C header's name, also the field name in messages


def traceparent_of(task: Task) -> str | None:
    """The W3C ``traceparent`` of ``task`` (None: tracing is off): the one thing a target
    reads to carry the trace."""
    return task.traceparent


def trace_headers(task: Task) -> dict[str, str]:
    """``{"traceparent": ...}`` for a message's headers, or ``{}`` when tracing is off."""
    tp = task.traceparent
    return {} if tp is None else {TRACEPARENT: tp}


def start_tracing(service_name: str = "periodic-manager") -> SlotTracing:
    """Start exporting spans as the ``OTEL_*`` variables say (needs the ``otel`` extra); the
    caller shuts the result down. Raises ConfigError naming the variable that is wrong."""
    from periodic_manager.tracing.otel import SlotTracing

    return SlotTracing.from_env(service_name)
