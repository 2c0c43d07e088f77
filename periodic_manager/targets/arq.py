"""arq target: each slot becomes an arq job, as ``enqueue_job(task_type, ..., _job_id=<task id>)``
would write it, claimed and written in one Redis script.

Needs the ``arq`` extra (``pip install 'periodic-manager[arq]'``); arq is imported only when a
target is built, so the core runs without it.

- payload -> arguments: a JSON object becomes keyword arguments, an array positional arguments,
  ``null`` no arguments, any other value one positional argument (after arq's ``ctx``);
- ``_job_id`` = the task id (uuid5 of the idempotency key: the same on every manager), so the
  worker sees it as ``ctx["job_id"]``;
- ``options.queue`` -> the queue (without it: the pool's default queue, ``arq:queue``);
  ``options.extra.expires`` (seconds after the slot) -> the job's expiry (arq drops a job not
  started by then). ``timeout``, ``max_retry`` and ``unique_ttl`` are set on the worker's
  functions in arq and are not sent.

Exactly once per slot: the job is written the way arq's ``enqueue_job`` writes it (the job key
with arq's serializer and expiry, the job id in the queue's sorted set), by a script that first
claims the slot (``<prefix>:claim:<key>``, for ``(expires_at - now) + margin``) and refuses a job
id arq already holds (queued, or its result kept). Claim and job are one step: a lost reply, a
retry or a second manager finds both or neither, so a slot is never taken for sent without its
job (which a claim taken before the publish allowed, when the publish failed).

``options.overlap`` skip and hold: the previous job of a schedule is finished when arq holds
neither its job key (queued, deferred, or waiting for a retry) nor its in-progress key (running):
arq's own job status, read from the same Redis. The same script then compares the schedule's
previous-job key (:mod:`~periodic_manager.targets.redis.previous`) with what was read, so two
managers never both start a job of one schedule.
"""

from __future__ import annotations

import json
import math
import pickletools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from periodic_manager.contracts import FINISHED, QUEUED, RUNNING, Task
from periodic_manager.plugins.task_rules import TaskProblem
from periodic_manager.schedules.failures import FAILED, PENDING, SUCCEEDED, UNKNOWN
from periodic_manager.targets.base import split_payload
from periodic_manager.targets.builtin.redis_queues import ARQ
from periodic_manager.targets.redis import lua
from periodic_manager.targets.redis.errors import redis_errors
from periodic_manager.targets.redis.job_target import RedisJobTarget
from periodic_manager.targets.redis.previous import Decided

# Keyword names enqueue_job keeps for itself; a payload key among them would be swallowed.
RESERVED_KWARGS = frozenset(
    {"function", "_job_id", "_queue_name", "_defer_until", "_defer_by", "_expires", "_job_try"}
)
# A JSON text that may hold one of them as a key (task_problem parses only such a text).
_MAY_RESERVE = re.compile("|".join([*map(re.escape, sorted(RESERVED_KWARGS)), r"\\u"]))


_RESULT_MAX = 1 << 20  # bytes of a result read for its flag (arq writes small results)
_NO_PUSH = frozenset({"MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "FRAME"})


def result_success(raw: bytes) -> bool | None:
    """The success flag of an arq job result, read from the pickle's opcodes without unpickling
    (a result is data anyone with Redis access may write, and unpickling runs code). arq pickles
    one dict whose items are pushed between one MARK and SETITEMS; the flag is the item of key
    ``s`` there, a bool followed by the next key. The stack is counted, not built, so a nested
    ``{"s": ...}`` (one level deeper, or taken by SETITEM) is not mistaken for it. None when there
    is no such flag or the bytes are no pickle of that shape."""
    length = 0
    marks: list[int] = []
    key: bool = False  # the previous opcode pushed a top-level key "s"
    flag: bool | None = None  # ...and this one its bool
    found: bool | None = None
    memo: dict[object, object] = {}
    pushed: object = None
    try:
        for op, arg, _ in pickletools.genops(raw[:_RESULT_MAX]):
            name = op.name
            if flag is not None and name not in _NO_PUSH:
                if name != "SETITEM" and len(marks) == 1:
                    found = flag
                flag = None
            if key and name in ("NEWTRUE", "NEWFALSE"):
                flag = name == "NEWTRUE"
            at_key = len(marks) == 1 and (length - marks[0]) % 2 == 0
            if "UNICODE" in name or "STRING" in name:
                pushed = arg
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                pushed = memo.get(arg)
            elif name == "MEMOIZE":
                memo[len(memo)] = pushed
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = pushed
            if name not in _NO_PUSH:  # a memo write or a frame leaves the stack as it is
                key = (
                    at_key
                    and pushed == "s"
                    and ("UNICODE" in name or "STRING" in name or name.endswith("GET"))
                )
            if pickletools.markobject in op.stack_before:
                length = marks.pop() - op.stack_before.index(pickletools.markobject)
            else:
                length -= len(op.stack_before)
            if name == "MARK":
                marks.append(length)
            else:
                length += len(op.stack_after)
    except (ValueError, IndexError, KeyError, TypeError):  # no pickle, or one cut off
        return None
    return found


def _import_arq() -> Any:
    return ARQ.load("arq.connections")


def arq_call(task: Task, now: datetime) -> tuple[list[Any], dict[str, Any]]:
    """Positional and keyword arguments of ``enqueue_job`` for ``task`` (ValueError if bad)."""
    args, kwargs = split_payload(task.payload)
    reserved = sorted(RESERVED_KWARGS & kwargs.keys())
    if reserved:
        raise ValueError(f"payload key(s) {', '.join(reserved)} are reserved by arq's enqueue_job")
    call: dict[str, Any] = dict(kwargs)
    call["_job_id"] = task.id
    if "queue" in task.options:
        call["_queue_name"] = task.queue
    extra = task.options.get("extra") or {}
    expires = extra.get("expires") if isinstance(extra, dict) else None
    if expires is not None:
        if isinstance(expires, bool) or not isinstance(expires, int | float):
            raise ValueError("options.extra.expires must be a number of seconds")
        if not math.isfinite(expires) or expires <= 0:
            raise ValueError("options.extra.expires must be > 0")
        end = task.scheduled_at.astimezone(UTC) + timedelta(seconds=expires)
        # arq counts _expires from the enqueue; 0 would mean "the default", so at least 1 ms.
        call["_expires"] = max(timedelta(milliseconds=1), end - now.astimezone(UTC))
    return [task.task_type, *args], call


# Claims each job's slot and writes the job (its arguments and flags are written at its top).
CLAIM_AND_WRITE = lua.script("periodic_manager.targets", "arq_claim_and_write.lua")
CHUNK = 1000  # jobs per script call


@dataclass(frozen=True, slots=True)
class ArqJob:
    """One job as arq's ``enqueue_job`` would write it."""

    queue: str
    body: bytes  # the job serialized with the pool's serializer
    score_ms: int  # when it may start (now: no deferral)
    expires_ms: int


class ArqTarget(RedisJobTarget):
    """Enqueues tasks as arq jobs, once per idempotency key.

    ``pool``: an ``arq.connections.ArqRedis`` (its serializer, default queue and expiry are the
    workers'; the claims live in the same Redis). At most ``concurrency`` script calls run at
    once, each bounded by ``timeout`` seconds.
    """

    name = "arq"
    chunk = CHUNK

    def __init__(
        self,
        pool: Any,
        *,
        prefix: str = "pm",
        claim_margin: float = 60.0,
        timeout: float = 5.0,
        concurrency: int = 8,
    ) -> None:
        self._share(
            pool,
            CLAIM_AND_WRITE,
            prefix=prefix,
            claim_margin=claim_margin,
            timeout=timeout,
            concurrency=concurrency,
        )

    @classmethod
    def _client_on(cls, pool: Any) -> Any:
        return _import_arq().ArqRedis(pool)

    def job(self, task: Task, now: datetime) -> ArqJob:
        """The job arq's ``enqueue_job`` would write for ``task`` at ``now`` (ValueError if the
        task cannot be one)."""
        from arq.jobs import SerializationError, serialize_job

        args, call = arq_call(task, now)
        function, *positional = args
        queue = call.pop("_queue_name", None) or self.client.default_queue_name
        expires = call.pop("_expires", None)
        call.pop("_job_id")
        enqueued_ms = round(now.timestamp() * 1000)
        try:
            body = serialize_job(
                function,
                tuple(positional),
                call,
                None,
                enqueued_ms,
                serializer=self.client.job_serializer,
            )
        except SerializationError as exc:
            raise ValueError(f"{exc}: {exc.__cause__}") from None
        if expires is not None:
            expires_ms = max(1, round(expires / timedelta(milliseconds=1)))
        else:
            expires_ms = int(self.client.expires_extra_ms)
        return ArqJob(str(queue), bytes(body), enqueued_ms, expires_ms)

    async def _call(
        self,
        queue: str,
        part: list[int],
        tasks: Sequence[Task],
        jobs: dict[int, ArqJob],
        decided: Decided | None,
        now: datetime,
    ) -> list[Any]:
        """One script call for the jobs ``part`` of ``queue``: a flag per job."""
        from arq.constants import job_key_prefix, result_key_prefix

        rows = self._rows(
            part,
            tasks,
            decided,
            now,
            lambda i: [jobs[i].score_ms, jobs[i].expires_ms, len(jobs[i].body)],
        )
        args = [
            self.claims.key(""),
            job_key_prefix,
            result_key_prefix,
            json.dumps(rows),
            b"".join(jobs[i].body for i in part),
        ]
        return list(await self._script(keys=[queue], args=args))

    async def _states(self, job_ids: Sequence[str]) -> list[str]:
        """arq's status of each job: running (in progress), queued (its job key exists: queued,
        deferred or waiting for a retry), else finished (done, or never enqueued)."""
        from arq.constants import in_progress_key_prefix, job_key_prefix

        with redis_errors("arq: job status"):
            async with self.client.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.exists(in_progress_key_prefix + job_id)
                    pipe.exists(job_key_prefix + job_id)
                replies = await pipe.execute()
        states = []
        for k in range(len(job_ids)):
            running, queued = replies[2 * k], replies[2 * k + 1]
            states.append(RUNNING if running else QUEUED if queued else FINISHED)
        return states

    async def outcomes(self, options: Mapping[str, Any], task_ids: Sequence[str]) -> list[str]:
        """Pending while the job is queued or running (:meth:`_states`); then its result's
        success flag, while arq keeps the result (``keep_result``); unknown once it is gone or
        cannot be read."""
        from arq.constants import result_key_prefix

        states = await self._states(task_ids)
        with redis_errors("arq: job result"):
            results = (
                await self.client.mget([result_key_prefix + i for i in task_ids])
                if task_ids
                else []
            )
        out = []
        for state, raw in zip(states, results, strict=True):
            if state != FINISHED:
                out.append(PENDING)
                continue
            success = result_success(raw) if isinstance(raw, bytes) else None
            out.append(UNKNOWN if success is None else SUCCEEDED if success is True else FAILED)
        return out


def task_problem(
    task_type: str, payload_json: str, options: Mapping[str, Any]
) -> TaskProblem | None:
    """What arq refuses whenever the task is sent (:mod:`~periodic_manager.plugins.task_rules`):
    a payload object with a key ``enqueue_job`` keeps for itself (:data:`RESERVED_KWARGS`), as
    :func:`arq_call` refuses it. The text is parsed only when it may hold one."""
    if _MAY_RESERVE.search(payload_json) is None:  # no such name, not even escaped
        return None
    payload = json.loads(payload_json)
    reserved = sorted(RESERVED_KWARGS & payload.keys()) if isinstance(payload, dict) else []
    if reserved:
        return TaskProblem(
            "payload",
            f"key(s) {', '.join(reserved)} are reserved by arq's enqueue_job (an object's keys "
            "become the job's keyword arguments)",
        )
    return None
