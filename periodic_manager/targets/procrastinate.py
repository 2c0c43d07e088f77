"""Procrastinate target: each slot a row of procrastinate's ``procrastinate_jobs``, inserted in
the manager's own PostgreSQL database, in one transaction with the slot's idempotency key.

A job is what ``app.defer`` would insert (procrastinate's ``procrastinate_defer_jobs_v1`` is a
plain INSERT of the same columns): ``task_name`` the task's ``task_type`` (the name the worker
registered the task under: by default its dotted path), ``args`` the payload (a JSON object of
keyword arguments; null means none), ``queue_name`` ``options.queue`` (``default`` otherwise),
``priority`` 0, no ``lock`` or ``queueing_lock``, no ``scheduled_at`` (due now). Procrastinate's
triggers on the table record the ``deferred`` event and notify listening workers as for any job.

Exactly once without Redis: the idempotency key goes into ``pm_procrastinate_sent`` (primary key
on the key, migration 0008) in the same statement that inserts the job, ``ON CONFLICT DO
NOTHING``: a key that comes back was sent now, one that does not was sent before (its job id is
looked up in the same transaction). Job ids are drawn from procrastinate's own sequence first, so
each key knows its job without relying on the order of RETURNING. Two managers sending the same
slot wait on each other's key and one of them inserts nothing. Keys whose ``expires_at`` passed
(no manager may send that slot again) are pruned as batches are sent.

``procrastinate_jobs.queueing_lock`` is not used: it only blocks a second job while the first is
queued, not once it ran. PostgreSQL only: procrastinate is.

``options.overlap`` skip and hold: the previous task of a schedule is its newest job in
``pm_procrastinate_sent`` (by job id, whatever its key: a manual trigger counts too); its
``procrastinate_jobs.status`` tells: ``todo`` queued, ``doing`` running, any other (``succeeded``,
``failed``, ``cancelled``, ``aborted``), or no job row left (deleted by ``--delete-jobs`` or
``remove_old_jobs``), finished. A job waiting for a retry is ``todo`` again: queued. Such tasks
are inserted one by one after the batch, each behind a transaction-level advisory lock on its
schedule's name, so two managers never both find the schedule free. Pruning keeps each
schedule's newest key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.contracts import (
    FINISHED,
    NONE,
    QUEUED,
    RUNNING,
    EnqueueResult,
    Prepared,
    Previous,
    Task,
)
from periodic_manager.errors import TargetError
from periodic_manager.plugins.task_rules import TaskProblem
from periodic_manager.schedules.failures import FAILED, PENDING, SUCCEEDED, UNKNOWN
from periodic_manager.targets.base import overlap_of, overlap_timeout_ms
from periodic_manager.targets.builtin.procrastinate import POSTGRESQL_ONLY
from periodic_manager.targets.database import DatabaseTarget, batch_results

NAME_MAX = 128  # procrastinate_jobs.queue_name and task_name: character varying(128)
PRUNE_ROWS = 1000  # expired keys deleted per batch sent

_COLUMNS = ("key", "queue", "task", "args", "expires", "name", "task_id")
_SEND = text(
    "WITH input AS ("
    " SELECT * FROM unnest(CAST(:key AS text[]), CAST(:queue AS text[]), CAST(:task AS text[]),"
    " CAST(:args AS text[]), CAST(:expires AS timestamptz[]), CAST(:name AS text[]),"
    " CAST(:task_id AS text[]))"
    " AS t(key, queue, task, args, expires, name, task_id)),"
    " numbered AS MATERIALIZED ("
    " SELECT input.*, nextval(pg_get_serial_sequence('procrastinate_jobs', 'id')) AS job_id"
    " FROM input),"
    " claimed AS ("
    " INSERT INTO pm_procrastinate_sent"
    " (idempotency_key, job_id, name, task_id, enqueued_at, expires_at)"
    " SELECT key, job_id, name, task_id, CAST(:now AS timestamptz), expires FROM numbered"
    " ON CONFLICT (idempotency_key) DO NOTHING RETURNING idempotency_key, job_id),"
    " jobs AS ("
    " INSERT INTO procrastinate_jobs (id, queue_name, task_name, priority, lock, queueing_lock,"
    " args, scheduled_at)"
    " SELECT n.job_id, n.queue, n.task, 0, NULL, NULL, CAST(n.args AS jsonb), NULL"
    " FROM claimed c JOIN numbered n ON n.job_id = c.job_id RETURNING id)"
    " SELECT c.idempotency_key, c.job_id FROM claimed c JOIN jobs j ON j.id = c.job_id"
)
_LOOKUP = text(
    "SELECT idempotency_key, job_id FROM pm_procrastinate_sent "
    "WHERE idempotency_key = ANY(CAST(:keys AS text[]))"
)
# Expired keys, each schedule's newest kept (the previous task options.overlap looks at).
_PRUNE = text(
    "DELETE FROM pm_procrastinate_sent WHERE idempotency_key IN ("
    " SELECT s.idempotency_key FROM pm_procrastinate_sent s WHERE s.expires_at < :now"
    " AND EXISTS (SELECT 1 FROM pm_procrastinate_sent n WHERE n.name = s.name"
    " AND n.job_id > s.job_id)"
    f" ORDER BY s.expires_at LIMIT {PRUNE_ROWS} FOR UPDATE SKIP LOCKED)"
)
_LOCK = text("SELECT pg_advisory_xact_lock(:key)")
# A schedule's newest job and its status (NULL: the job row is gone).
_NEWEST = text(
    "SELECT s.task_id, s.enqueued_at, CAST(j.status AS text) FROM pm_procrastinate_sent s"
    " LEFT JOIN procrastinate_jobs j ON j.id = s.job_id WHERE s.name = :name"
    " ORDER BY s.job_id DESC LIMIT 1"
)
_STATES = {"todo": QUEUED, "doing": RUNNING, "aborting": RUNNING}
_PING = text("SELECT 1 FROM procrastinate_jobs LIMIT 0")
# options.pause_after_failures: the status of jobs by id.
_STATUSES = text(
    "SELECT id, CAST(status AS text) FROM procrastinate_jobs WHERE id = ANY(CAST(:ids AS bigint[]))"
)


def _outcome(status: str | None) -> str:
    if status == "succeeded":
        return SUCCEEDED
    if status == "failed":
        return FAILED
    return PENDING if status in _STATES else UNKNOWN


def job_args(task: Task) -> str:
    """The job's ``args`` as JSON text: the payload, an object of keyword arguments (null: none).
    Raises ValueError for any other payload, or a task or queue name procrastinate cannot hold."""
    if len(task.task_type) > NAME_MAX:
        raise ValueError(f"task_type longer than {NAME_MAX} characters (procrastinate's task_name)")
    if len(task.queue) > NAME_MAX:
        raise ValueError(f"queue longer than {NAME_MAX} characters (procrastinate's queue_name)")
    payload = task.payload
    if payload is None:
        return "{}"
    if not isinstance(payload, dict):
        raise ValueError(
            f"the payload must be a JSON object of keyword arguments or null, not "
            f"{type(payload).__name__}"
        )
    return task.payload_text()


class ProcrastinateTarget(DatabaseTarget):
    """Inserts tasks as procrastinate jobs; each idempotency key at most once."""

    name = "procrastinate"

    def __init__(self, engine: AsyncEngine) -> None:
        if engine.dialect.name != "postgresql":
            raise TargetError(f"{POSTGRESQL_ONLY}, not {engine.dialect.name}")
        self._engine = engine

    def prepare(self, tasks: Sequence[Task]) -> Prepared:
        """The column arrays of the one INSERT, rows sorted by key (two managers sending
        overlapping batches then wait on each other's keys in one order: no deadlock); a task
        whose payload is not an object (or null) is set apart as failed."""
        rows: list[tuple[Any, ...]] = []
        after: list[tuple[int, tuple[Any, ...]]] = []
        failed: dict[int, str] = {}
        for index, task in enumerate(tasks):
            try:
                args = job_args(task)
            except (TypeError, ValueError) as exc:
                failed[index] = f"procrastinate: {exc}"
                continue
            row = (
                task.idempotency_key,
                task.queue,
                task.task_type,
                args,
                task.expires_at,
                task.name,
                task.id,
            )
            if overlap_of(task) == "allow":
                rows.append(row)
            else:
                after.append((index, row))
        rows.sort(key=lambda r: r[0])
        after.sort(key=lambda item: tasks[item[0]].name)  # the locks' order: no deadlock
        return Prepared(list(tasks), (_arrays(rows), failed, after))

    async def send(self, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
        tasks = prepared.tasks
        if not tasks:
            return []
        data, failed, after = prepared.data
        inserted: dict[str, int] = {}
        existing: dict[str, int] = {}
        decided: dict[int, EnqueueResult] = {}
        try:
            async with self._engine.begin() as conn:
                if data is not None:
                    inserted = await _rows(conn, _SEND, {**data, "now": now})
                    missing = sorted(set(data["key"]) - inserted.keys())
                    if missing:
                        existing = await _rows(conn, _LOOKUP, {"keys": missing})
                for index, row in after:
                    decided[index] = await self._send_after(conn, tasks[index], row, now)
                await conn.execute(_PRUNE, {"now": now})
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            raise TargetError(f"procrastinate: {type(exc).__name__}: {exc}") from exc
        return batch_results(tasks, failed, decided, inserted, existing)

    async def _send_after(
        self, conn: AsyncConnection, task: Task, row: tuple[Any, ...], now: datetime
    ) -> EnqueueResult:
        """Insert ``task`` unless its schedule's newest job is unfinished (options.overlap)."""
        await conn.execute(_LOCK, {"key": _lock_key(task.name)})
        found = await _rows(conn, _LOOKUP, {"keys": [task.idempotency_key]})
        if found:
            return EnqueueResult(task, "duplicate", str(found[task.idempotency_key]))
        newest = (await conn.execute(_NEWEST, {"name": task.name})).first()
        previous = Previous(None, NONE)
        if newest is not None:
            task_id, enqueued_at, status = newest
            state = _STATES.get(status, FINISHED) if status is not None else FINISHED
            previous = Previous(task_id, state)
            if state != FINISHED:
                timeout = overlap_timeout_ms(task)
                if not timeout or now - enqueued_at < timedelta(milliseconds=timeout):
                    return EnqueueResult(task, "busy", previous=previous)
                previous.timed_out = True
        data = _arrays([row])
        assert data is not None
        inserted = await _rows(conn, _SEND, {**data, "now": now})
        job_id = inserted.get(task.idempotency_key)  # always there, behind the lock
        return EnqueueResult(
            task,
            "enqueued" if job_id is not None else "duplicate",
            str(job_id) if job_id is not None else None,
            previous=previous,
        )

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        """procrastinate's job status tells when a job finished (see the module docstring)."""
        return None

    def failure_off(self, options: Mapping[str, Any]) -> str | None:
        """procrastinate's job status tells a failed job (``failed``)."""
        return None

    async def outcomes(self, options: Mapping[str, Any], task_ids: Sequence[str]) -> list[str]:
        """Each job's outcome (the message id is the job id): ``succeeded``, ``failed``; still
        to do or doing pending; cancelled, aborted, gone or not a job id unknown."""
        ids = sorted({int(i) for i in task_ids if i.isdigit() and len(i) <= 18})
        statuses: dict[str, str] = {}
        if ids:
            try:
                async with self._engine.connect() as conn:
                    rows = (await conn.execute(_STATUSES, {"ids": ids})).all()
            except (SQLAlchemyError, OSError, TimeoutError) as exc:
                raise TargetError(f"procrastinate: cannot read job statuses: {exc}") from exc
            statuses = {str(job_id): str(status) for job_id, status in rows}
        return [_outcome(statuses.get(i)) for i in task_ids]

    async def ping(self) -> None:
        """Raise unless the database answers and holds procrastinate's schema (``/readyz``)."""
        async with self._engine.connect() as conn:
            await conn.execute(_PING)


def _arrays(rows: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]] | None:
    """The column arrays of ``_SEND`` (None: no rows)."""
    return {col: [r[i] for r in rows] for i, col in enumerate(_COLUMNS)} if rows else None


def _lock_key(name: str) -> int:
    """A signed 64-bit advisory-lock key for a schedule's name (the outbox's: a schedule is one
    lock whichever target it uses; a collision only serialises)."""
    digest = hashlib.sha256(f"periodic_manager:overlap:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def _rows(conn: AsyncConnection, statement: Any, params: Mapping[str, Any]) -> dict[str, int]:
    return {key: int(job_id) for key, job_id in (await conn.execute(statement, params)).all()}


def task_problem(
    task_type: str, payload_json: str, options: Mapping[str, Any]
) -> TaskProblem | None:
    """What procrastinate refuses whenever the task is sent
    (:mod:`~periodic_manager.plugins.task_rules`), as :func:`job_args` refuses it: a
    ``task_type`` longer than its column holds, a payload that is neither a JSON object (the
    task's keyword arguments) nor null (its kind is read from its first character: the text is
    valid JSON). A queue name is at most 100 characters for every schedule (rules.QUEUE_RE)."""
    if len(task_type) > NAME_MAX:
        return TaskProblem(
            "task_type",
            f"at most {NAME_MAX} characters (procrastinate's task_name), not {len(task_type)}",
        )
    if payload_json[:1] == "{" or payload_json == "null":  # as stored or canonical: no blanks
        return None
    text = payload_json.strip()
    if text[:1] == "{" or text == "null":
        return None
    kinds = {"[": "an array", '"': "a string", "t": "true", "f": "false"}
    return TaskProblem(
        "payload",
        f"must be a JSON object of keyword arguments or null, not "
        f"{kinds.get(text[:1], 'a number')} (the job's args)",
    )
