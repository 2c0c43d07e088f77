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
queued, not once it ran. PostgreSQL only: procrastinate is. ``options.overlap`` skip and hold are
not supported yet (procrastinate's job status could tell).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.contracts import EnqueueResult, Prepared, Task
from periodic_manager.db.engine import create_engine
from periodic_manager.errors import TargetError
from periodic_manager.targets import completion

NAME_MAX = 128  # procrastinate_jobs.queue_name and task_name: character varying(128)
PRUNE_ROWS = 1000  # expired keys deleted per batch sent
POSTGRESQL_ONLY = "the procrastinate target needs PostgreSQL (procrastinate is PostgreSQL only)"

_COLUMNS = ("key", "queue", "task", "args", "expires")
_SEND = text(
    "WITH input AS ("
    " SELECT * FROM unnest(CAST(:key AS text[]), CAST(:queue AS text[]), CAST(:task AS text[]),"
    " CAST(:args AS text[]), CAST(:expires AS timestamptz[]))"
    " AS t(key, queue, task, args, expires)),"
    " numbered AS MATERIALIZED ("
    " SELECT input.*, nextval(pg_get_serial_sequence('procrastinate_jobs', 'id')) AS job_id"
    " FROM input),"
    " claimed AS ("
    " INSERT INTO pm_procrastinate_sent (idempotency_key, job_id, expires_at)"
    " SELECT key, job_id, expires FROM numbered"
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
_PRUNE = text(
    "DELETE FROM pm_procrastinate_sent WHERE idempotency_key IN ("
    " SELECT idempotency_key FROM pm_procrastinate_sent WHERE expires_at < :now"
    f" ORDER BY expires_at LIMIT {PRUNE_ROWS} FOR UPDATE SKIP LOCKED)"
)
_PING = text("SELECT 1 FROM procrastinate_jobs LIMIT 0")


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


class ProcrastinateTarget:
    """Inserts tasks as procrastinate jobs; each idempotency key at most once."""

    name = "procrastinate"

    def __init__(self, engine: AsyncEngine) -> None:
        if engine.dialect.name != "postgresql":
            raise TargetError(f"{POSTGRESQL_ONLY}, not {engine.dialect.name}")
        self._engine = engine
        self._owns_engine = False

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> ProcrastinateTarget:
        """A target with its own engine (disposed by :meth:`close`)."""
        engine = create_engine(url, **kwargs)
        try:
            target = cls(engine)
        except TargetError:
            engine.sync_engine.dispose()
            raise
        target._owns_engine = True
        return target

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        """Insert the batch in one transaction; report each task in input order."""
        return await self.send(self.prepare(tasks), now)

    def prepare(self, tasks: Sequence[Task]) -> Prepared:
        """The column arrays of the one INSERT, rows sorted by key (two managers sending
        overlapping batches then wait on each other's keys in one order: no deadlock); a task
        whose payload is not an object (or null) is set apart as failed."""
        rows: list[tuple[str, str, str, str, datetime]] = []
        failed: dict[int, str] = {}
        for index, task in enumerate(tasks):
            try:
                args = job_args(task)
            except (TypeError, ValueError) as exc:
                failed[index] = f"procrastinate: {exc}"
                continue
            rows.append((task.idempotency_key, task.queue, task.task_type, args, task.expires_at))
        rows.sort(key=lambda r: r[0])
        data = {col: [r[i] for r in rows] for i, col in enumerate(_COLUMNS)} if rows else None
        return Prepared(list(tasks), (data, failed))

    async def send(self, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
        tasks = prepared.tasks
        if not tasks:
            return []
        data, failed = prepared.data
        inserted: dict[str, int] = {}
        existing: dict[str, int] = {}
        try:
            async with self._engine.begin() as conn:
                if data is not None:
                    inserted = await _rows(conn, _SEND, data)
                    missing = sorted(set(data["key"]) - inserted.keys())
                    if missing:
                        existing = await _rows(conn, _LOOKUP, {"keys": missing})
                await conn.execute(_PRUNE, {"now": now})
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            raise TargetError(f"procrastinate: {type(exc).__name__}: {exc}") from exc
        results = []
        for index, task in enumerate(tasks):
            if index in failed:
                results.append(EnqueueResult(task, "failed", error=failed[index]))
                continue
            key = task.idempotency_key
            job_id = inserted.pop(key, None)
            if job_id is not None:
                # A key repeated within the batch is new once, then a duplicate of that job.
                existing[key] = job_id
                results.append(EnqueueResult(task, "enqueued", str(job_id)))
            else:
                found = existing.get(key)
                results.append(
                    EnqueueResult(task, "duplicate", str(found) if found is not None else None)
                )
        return results

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        """Overlap skip and hold are not supported yet (see the module docstring)."""
        return completion.PROCRASTINATE_NO_OVERLAP if completion.asks(options) else None

    async def ping(self) -> None:
        """Raise unless the database answers and holds procrastinate's schema (``/readyz``)."""
        async with self._engine.connect() as conn:
            await conn.execute(_PING)

    async def close(self) -> None:
        """Dispose of the engine if this target created it (:meth:`from_url`)."""
        if self._owns_engine:
            await self._engine.dispose()


async def _rows(conn: AsyncConnection, statement: Any, params: Mapping[str, Any]) -> dict[str, int]:
    return {key: int(job_id) for key, job_id in (await conn.execute(statement, params)).all()}
