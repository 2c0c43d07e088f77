"""Tasks out: a :class:`Target` enqueues the tasks of due slots, each idempotency key at most once;
the values that cross it, and the capabilities a target may add (each a Protocol of its own)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from periodic_manager.contracts.clock import Clock
from periodic_manager.schedules.rules import canonical_json

__all__ = [
    "UNPARSED",
    "Task",
    "QUEUED",
    "RUNNING",
    "UNFINISHED",
    "FINISHED",
    "NONE",
    "EnqueueStatus",
    "Previous",
    "EnqueueResult",
    "refused",
    "retryable",
    "Prepared",
    "Target",
    "FailureSignal",
    "NO_FAILURE_SIGNAL",
    "failure_off",
    "Pingable",
    "InManagerDatabase",
    "Forgetful",
    "WorksBeside",
    "CountsDeliveries",
    "StagedTarget",
    "SlotTracer",
    "AnnouncedEntry",
    "EntryAnnouncer",
]


# The payload of a task built from a schedule: parsed from ``payload_json`` only when asked for.
UNPARSED: Any = object()


class Task:
    """One enqueue: a slot of a schedule, ready for a worker.

    ``expires_at``: after this instant no manager may still enqueue the slot (scheduled_at +
    grace, or the catch-up window); targets keep their claim of the key at least until then.
    ``payload_json``/``options_json``: canonical JSON when the caller has it already (a burst
    never serializes a payload per slot); ``payload`` is then parsed only if a target asks for it
    (the Redis and outbox targets send the text as it is).
    ``traceparent``: the slot's W3C trace context (``PM_OTEL``), which a target whose message
    carries headers or metadata puts there so that a worker continues the manager's trace
    (:func:`periodic_manager.tracing.trace_headers`); None when tracing is off.
    """

    __slots__ = (
        "id",
        "name",
        "task_type",
        "_payload",
        "queue",
        "options",
        "idempotency_key",
        "scheduled_at",
        "expires_at",
        "schedule_id",
        "extra",
        "payload_json",
        "options_json",
        "traceparent",
    )

    def __init__(
        self,
        id: str,  # noqa: A002 - the message field's name
        name: str,
        task_type: str,
        payload: Any,
        queue: str,
        options: Mapping[str, Any],
        idempotency_key: str,
        scheduled_at: datetime,
        expires_at: datetime,
        schedule_id: int | str | None = None,
        extra: Mapping[str, Any] | None = None,
        payload_json: str | None = None,
        options_json: str | None = None,
        traceparent: str | None = None,
    ) -> None:
        self.id = id
        self.name = name
        self.task_type = task_type
        self._payload = payload
        self.queue = queue
        self.options = options
        self.idempotency_key = idempotency_key
        self.scheduled_at = scheduled_at
        self.expires_at = expires_at
        self.schedule_id = schedule_id
        self.extra = extra if extra is not None else {}
        self.payload_json = payload_json
        self.options_json = options_json
        self.traceparent = traceparent

    @property
    def payload(self) -> Any:
        if self._payload is UNPARSED:
            self._payload = json.loads(self.payload_json)  # type: ignore[arg-type]
        return self._payload

    def payload_text(self) -> str:
        """The payload as canonical JSON text."""
        return self.payload_json if self.payload_json is not None else canonical_json(self.payload)

    def options_text(self) -> str:
        """The options as canonical JSON text."""
        return (
            self.options_json
            if self.options_json is not None
            else canonical_json(dict(self.options))
        )

    def __repr__(self) -> str:
        return f"Task(name={self.name!r}, idempotency_key={self.idempotency_key!r}, queue={self.queue!r})"


# States of a schedule's previous task, as a target with a completion signal sees them.
QUEUED = "queued"  # enqueued, not taken by a worker yet
RUNNING = "running"  # taken by a worker, not finished
UNFINISHED = "unfinished"  # queued or running (the target cannot tell which)
FINISHED = "finished"  # done (or gone: nothing of it is left to wait for)
NONE = "none"  # the schedule has no previous task (none known)


EnqueueStatus = Literal["enqueued", "duplicate", "resent", "failed", "busy"]


@dataclass(slots=True)
class Previous:
    """The previous task of a schedule with ``options.overlap`` skip or hold, as the target saw
    it when it decided (``task_id`` None: the schedule had none). ``timed_out``: it was not
    finished but older than ``options.overlap_timeout``, so it counted as finished."""

    task_id: str | None
    state: str
    timed_out: bool = False


@dataclass(slots=True)  # not frozen: built once per slot, and frozen __init__ is slow
class EnqueueResult:
    """What happened to one task of a batch.

    ``failed``: this task was not enqueued and holds no claim, while the rest of the batch was
    processed (a task the target cannot encode, or the group of a failed target behind a
    :class:`~periodic_manager.targets.routing.RoutingTarget`); ``error`` says why. ``permanent``
    says whether sending the task again can succeed: True for a refusal that no retry changes (the
    task itself is invalid for the target: a bad name, a bad queue name, a payload of the wrong
    shape, options it cannot honour, a key of another Redis type, an encode error), recorded
    ``failed`` at once; False (the default) for a failure that may pass (a connection lost, a
    timeout, a claim another publisher holds), retried while the slot is within its window.
    Build a refusal with :func:`refused`.

    ``resent``: enqueued again with the same task id because an earlier publish of this slot was
    never confirmed by the broker (it may have arrived: workers may see the task twice).

    ``busy``: the task's schedule asks for ``options.overlap`` skip or hold and its previous task
    is not finished, so nothing was enqueued and nothing claimed. ``previous`` (set only for such
    schedules) is what the target saw of that previous task.
    """

    task: Task
    status: EnqueueStatus
    message_id: str | None = None  # stream entry id, outbox row id, ...
    error: str | None = None
    previous: Previous | None = None
    permanent: bool = False  # failed only: no retry can succeed (see above)


def refused(task: Task, error: str) -> EnqueueResult:
    """The result of a task the target refuses for good (``failed``, ``permanent``): the task is
    not valid for it, so sending it again would fail again (see :class:`EnqueueResult`)."""
    return EnqueueResult(task, "failed", error=error, permanent=True)


def retryable(result: EnqueueResult) -> bool:
    """Whether ``result`` is a failure that a later attempt may turn into a send."""
    return result.status == "failed" and not result.permanent


@dataclass(slots=True)
class Prepared:
    """A batch made ready before its instant: the tasks, and what the target built from them."""

    tasks: list[Task]
    data: Any = None  # None: nothing was prepared (the tasks are enqueued as they are)


class Target(Protocol):
    """Enqueues batches of tasks; each idempotency key at most once, atomically with the claim of
    that key, so that two managers, a restart or a retry never enqueue a slot twice."""

    name: str

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        """Enqueue ``tasks`` (``now`` is the enqueue instant) and report each one's fate.

        Either the whole batch is processed (results in input order) or TargetError is raised and
        no claim of the batch is left behind without its message. A processed batch may report
        single tasks as ``failed`` (not enqueued, no claim left), the others being unaffected.
        """
        ...

    async def close(self) -> None:
        """Release connections."""
        ...

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        """Why this target cannot honour ``options.overlap`` skip or hold for a schedule with
        these options: it cannot tell when the schedule's previous task finished (None: it can,
        or the options ask for ``allow``)."""
        ...


@runtime_checkable
class FailureSignal(Protocol):
    """A target that can tell a failed task from one that succeeded, which
    ``options.pause_after_failures`` needs (schedules/failures.py). A target without it refuses
    the option (``targets.completion`` says why, for the settings' checks)."""

    def failure_off(self, options: Mapping[str, Any]) -> str | None:
        """Why this target cannot tell a failed task of a schedule with these options (None: it
        can, or the options do not ask for it)."""
        ...

    async def outcomes(self, options: Mapping[str, Any], task_ids: Sequence[str]) -> list[str]:
        """The outcome of each task (``schedules.failures.OUTCOMES``: succeeded, failed,
        unknown, pending), in order; raises TargetError when the target cannot be asked."""
        ...


NO_FAILURE_SIGNAL = "it reports no outcome of its tasks"


def failure_off(target: object, options: Mapping[str, Any]) -> str | None:
    """Why ``target`` cannot honour ``options.pause_after_failures`` (None: it can, or the
    options do not ask for it): a target that is no :class:`FailureSignal` cannot tell a failed
    task. The manager's code API and the routing target ask this."""
    if "pause_after_failures" not in options:
        return None
    if not isinstance(target, FailureSignal):
        return NO_FAILURE_SIGNAL
    return target.failure_off(options)


@runtime_checkable
class Pingable(Protocol):
    """A target that can say whether its broker answers (``/readyz``); one that cannot counts as
    reachable."""

    async def ping(self) -> None:
        """Raise unless the broker the target sends to answers within its timeout."""
        ...


@runtime_checkable
class InManagerDatabase(Protocol):
    """A target that writes into the manager's own database (the outbox, procrastinate, on the
    manager's engine): its health is that database's, which every lease round proves, so the
    manager does not ping it apart (:mod:`~periodic_manager.runtime.target_health`)."""

    @property
    def in_manager_database(self) -> bool:
        """True when the target sends through the manager's own engine."""
        ...


@runtime_checkable
class Forgetful(Protocol):
    """A target whose broker can lose its data while it keeps answering (a Redis restarted
    without persistence): it can tell, through a sentinel key (:mod:`targets.redis.sentinel`)."""

    async def forgotten(self) -> list[str]:
        """The brokers (described for a log line) that lost their data since the previous call;
        raises TargetError when one cannot be asked."""
        ...


@runtime_checkable
class WorksBeside(Protocol):
    """A target with work of its own beside the manager's (the http target delivers the rows
    its sends wrote): the manager runs it as one of its supervised loops."""

    async def run_beside(self, clock: Clock, owner: str) -> None:
        """Run until cancelled, reading time from ``clock``; ``owner`` names the manager (a
        lease holder). Returning or raising while the manager runs is its failure."""
        ...


@runtime_checkable
class CountsDeliveries(Protocol):
    """A target whose work beside the manager delivers tasks (the http target): what its
    deliveries came to in this manager, for the metrics."""

    def delivery_counts(self) -> Mapping[str, int]:
        """Deliveries by outcome since start: ``done``, ``retried`` (an attempt that failed and
        will be tried again), ``dead`` (a dead letter)."""
        ...


@runtime_checkable
class StagedTarget(Target, Protocol):
    """A target that can do its per-task work before the instant."""

    def prepare(self, tasks: Sequence[Task]) -> Prepared:
        """Encode ``tasks`` for sending (no I/O, no clock: called before their instant). Raises
        TargetError when the batch cannot be encoded (the scheduler then falls back to
        ``enqueue`` at the instant, which reports the failure)."""
        ...

    async def send(self, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
        """Enqueue a prepared batch at ``now``: the same contract as ``enqueue``. A prepared
        batch may be sent again (a retry); the claims make that safe."""
        ...


class SlotTracer(Protocol):
    """Traces what the scheduler sends (``PM_OTEL``: :mod:`periodic_manager.tracing`)."""

    def wrap(self, target: StagedTarget, clock: Clock) -> StagedTarget:
        """``target`` as the scheduler is to send through it: each batch given a trace (the
        tasks' ``traceparent``) when prepared, and its spans recorded when sent."""
        ...

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Export the spans recorded so far (blocking, at most ``timeout_s`` seconds)."""
        ...


@dataclass(frozen=True, slots=True)
class AnnouncedEntry:
    """A registered entry as an :class:`EntryAnnouncer` publishes it: the schedule's name, its
    timing and task, the next slot and the last one this manager handled (None: none)."""

    name: str
    spec: str
    timezone: str
    task_type: str
    payload_json: str
    options: Mapping[str, Any]
    next_at: datetime | None
    prev_at: datetime | None


@runtime_checkable
class EntryAnnouncer(Protocol):
    """A target whose workers' own tools list the schedules that send to them (asynq's
    scheduler entries, read by ``asynq cron ls`` and asynqmon): the manager announces its
    registered entries every ``announce_every_s`` seconds while it sends (at most
    ``announce_max`` of them), and withdraws them when it stops or stops sending."""

    announce_every_s: float
    announce_max: int

    async def announce(
        self, manager_id: str, entries: Sequence[AnnouncedEntry], now: datetime
    ) -> None:
        """Publish ``entries`` as this manager's, replacing what it announced before (an empty
        sequence withdraws them); raises TargetError when the broker fails."""
        ...

    async def withdraw(self, manager_id: str) -> None:
        """Remove what this manager announced; raises TargetError when the broker fails."""
        ...
