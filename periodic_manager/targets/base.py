"""The Target protocol: where due slots are enqueued for workers.

A target receives one batch per instant (every slot due at that instant) and must enqueue each
task at most once per ``idempotency_key``, atomically with the claim of that key, so that two
managers, a restart or a retry never enqueue a slot twice.

Staging: the scheduler builds the next instant's tasks before the instant and hands them to
``prepare`` (pure work: encoding, script arguments); at the instant it only calls ``send``. A
target without its own ``prepare``/``send`` gets the default (:class:`TargetBase`, or
:func:`staged` for any object with ``enqueue``): prepare keeps the tasks, send enqueues them.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from periodic_manager.schedules.definition import PeriodicTaskConfig, canonical_json

TASK_ID_NAMESPACE = uuid.UUID("6f1c1a52-5d0e-4d43-9b8e-2f1d8c0b7a11")


_NAMESPACE_BYTES = TASK_ID_NAMESPACE.bytes


def task_id_for(idempotency_key: str) -> str:
    """Deterministic task id: the uuid5 of the idempotency key (every replica derives the same id).

    Equal to ``str(uuid.uuid5(TASK_ID_NAMESPACE, key))``, built without UUID objects because it
    runs once per enqueued slot.
    """
    raw = bytearray(hashlib.sha1(_NAMESPACE_BYTES + idempotency_key.encode()).digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x50  # version 5
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_UNPARSED: Any = object()


class Task:
    """One enqueue: a slot of a schedule, ready for a worker.

    ``expires_at``: after this instant no manager may still enqueue the slot (scheduled_at +
    grace, or the catch-up window); targets keep their claim of the key at least until then.
    ``payload_json``/``options_json``: canonical JSON when the caller has it already (a burst
    never serializes a payload per slot); ``payload`` is then parsed only if a target asks for it
    (the Redis and outbox targets send the text as it is).
    """

    __slots__ = (
        "id", "name", "task_type", "_payload", "queue", "options", "idempotency_key",
        "scheduled_at", "expires_at", "schedule_id", "extra", "payload_json", "options_json",
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

    @property
    def payload(self) -> Any:
        if self._payload is _UNPARSED:
            self._payload = json.loads(self.payload_json)  # type: ignore[arg-type]
        return self._payload

    def payload_text(self) -> str:
        """The payload as canonical JSON text."""
        return self.payload_json if self.payload_json is not None else canonical_json(self.payload)

    def options_text(self) -> str:
        """The options as canonical JSON text."""
        return self.options_json if self.options_json is not None else canonical_json(dict(self.options))

    def replace(self, **changes: Any) -> Task:
        """A copy with ``changes`` applied."""
        values = {name: getattr(self, name) for name in _TASK_FIELDS}
        values.update(changes)
        return Task(**values)

    def __repr__(self) -> str:
        return f"Task(name={self.name!r}, idempotency_key={self.idempotency_key!r}, queue={self.queue!r})"


_TASK_FIELDS = (
    "id", "name", "task_type", "payload", "queue", "options", "idempotency_key", "scheduled_at",
    "expires_at", "schedule_id", "extra", "payload_json", "options_json",
)


def task_for(config: PeriodicTaskConfig, key: str, scheduled_at: datetime, expires_at: datetime) -> Task:
    """The task a schedule sends under idempotency key ``key`` (a slot, or a manual trigger)."""
    return Task(
        id=task_id_for(key),
        name=config.name,
        task_type=config.task_type,
        payload=_UNPARSED,
        queue=config.queue,
        options=config.options,
        idempotency_key=key,
        scheduled_at=scheduled_at,
        expires_at=expires_at,
        schedule_id=config.schedule_id,
        payload_json=config.payload_json,
        options_json=config.options_json,
    )


# States of a schedule's previous task, as a target with a completion signal sees them.
QUEUED = "queued"  # enqueued, not taken by a worker yet
RUNNING = "running"  # taken by a worker, not finished
UNFINISHED = "unfinished"  # queued or running (the target cannot tell which)
FINISHED = "finished"  # done (or gone: nothing of it is left to wait for)
NONE = "none"  # the schedule has no previous task (none known)


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
    :class:`~periodic_manager.targets.routing.RoutingTarget`); ``error`` says why.

    ``resent``: enqueued again with the same task id because an earlier publish of this slot was
    never confirmed by the broker (it may have arrived: workers may see the task twice).

    ``busy``: the task's schedule asks for ``options.overlap`` skip or hold and its previous task
    is not finished, so nothing was enqueued and nothing claimed. ``previous`` (set only for such
    schedules) is what the target saw of that previous task.
    """

    task: Task
    status: Literal["enqueued", "duplicate", "resent", "failed", "busy"]
    message_id: str | None = None  # stream entry id, outbox row id, ...
    error: str | None = None
    previous: Previous | None = None


def overlap_of(task: Task) -> str:
    """The task's ``options.overlap`` (``allow`` when absent)."""
    return str(task.options.get("overlap", "allow"))


def overlap_timeout_ms(task: Task) -> int:
    """``options.overlap_timeout`` in milliseconds (0: none)."""
    seconds = task.options.get("overlap_timeout")
    return 0 if seconds is None else max(1, round(float(seconds) * 1000))


def no_completion(target: object, task: Task) -> str | None:
    """Why ``target`` cannot honour the task's ``options.overlap`` (None: it can, or the task
    does not ask). A target declares it can with ``completion = True``; one that cannot says why
    in ``completion_off``."""
    why = completion_off(target, task.options)
    if why is None:
        return None
    name = getattr(target, "name", "target")
    return (
        f"options.overlap {overlap_of(task)!r}: the {name} target cannot tell when a task "
        f"finished ({why})"
    )


def completion_off(target: object, options: Mapping[str, Any]) -> str | None:
    """Why ``target`` (for a router: the one ``options`` pick) cannot tell when a task of a
    schedule with these options finished; None when it can or the schedule uses ``allow``."""
    if options.get("overlap", "allow") == "allow":
        return None
    pick = getattr(target, "target_for", None)
    if callable(pick):
        target = pick(options)
        if target is None:
            return "its target is not configured"
    if getattr(target, "completion", False):
        return None
    return getattr(target, "completion_off", None) or "it has no completion signal"


@dataclass(slots=True)
class Prepared:
    """A batch made ready before its instant: the tasks, and what the target built from them."""

    tasks: list[Task]
    data: Any = None  # None: nothing was prepared (the tasks are enqueued as they are)


class Target(Protocol):
    """Enqueues batches of tasks; each idempotency key at most once.

    Optional: ``async def ping(self) -> None`` raises unless the broker answers; ``/readyz``
    calls it (a target without it counts as reachable).
    """

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


class Forgetful(Protocol):
    """A target whose broker can lose its data while it keeps answering (a Redis restarted
    without persistence): it can tell, through a sentinel key (:mod:`sentinel`)."""

    async def forgotten(self) -> list[str]:
        """The brokers (described for a log line) that lost their data since the previous call;
        raises TargetError when one cannot be asked."""
        ...


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


class TargetBase:
    """Default staging for a target that only knows ``enqueue``: nothing is built ahead."""

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        raise NotImplementedError

    def prepare(self, tasks: Sequence[Task]) -> Prepared:
        return Prepared(list(tasks))

    async def send(self, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
        return await self.enqueue(prepared.tasks, now)


class _Staged:
    """Adapts an object with ``enqueue`` (and maybe ``prepare``/``send``) to StagedTarget."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.name = target.name

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        return await self.target.enqueue(tasks, now)

    def prepare(self, tasks: Sequence[Task]) -> Prepared:
        return Prepared(list(tasks))

    async def send(self, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
        return await self.target.enqueue(prepared.tasks, now)

    async def close(self) -> None:
        await self.target.close()


async def send_prepared(target: Target, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
    """Send ``prepared`` through ``target``; a batch that was not prepared (``data`` None: the
    default, or a ``prepare`` that failed) is enqueued as it is."""
    if prepared.data is None:
        return await target.enqueue(prepared.tasks, now)
    return await staged(target).send(prepared, now)


def staged(target: Target) -> StagedTarget:
    """``target`` itself when it stages, else an adapter doing both steps at the instant."""
    if callable(getattr(target, "prepare", None)) and callable(getattr(target, "send", None)):
        return target  # type: ignore[return-value]
    return _Staged(target)
