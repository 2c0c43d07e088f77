"""Database outbox target: tasks become rows of ``pm_outbox``, unique on the idempotency key.

``INSERT ... ON CONFLICT (idempotency_key) DO NOTHING RETURNING seq, idempotency_key`` claims
and enqueues in one statement: a key that comes back was enqueued now; one that does not was
already there (its ``seq`` is looked up in the same transaction). PostgreSQL and SQLite >= 3.35
(RETURNING). The message id is ``str(seq)``.

Consumers take rows with ``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL and set
``processed_at`` (see ``examples/consume_outbox.py``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.dml import ReturningInsert

from periodic_manager.db.engine import create_engine
from periodic_manager.db.models import OutboxMessage
from periodic_manager.errors import TargetError
from periodic_manager.targets.base import EnqueueResult, Prepared, Task

# Rows per INSERT: 10 bind parameters a row stays far below the limits of asyncpg (32767) and
# SQLite (32766), so a burst of 10,000 slots is a few statements in one transaction.
CHUNK_ROWS = 1000
SQLITE_MIN_RETURNING = (3, 35, 0)


class OutboxTarget:
    """Enqueues tasks as ``pm_outbox`` rows; each idempotency key at most once."""

    name = "outbox"

    def __init__(self, engine: AsyncEngine) -> None:
        dialect = engine.dialect.name
        if dialect == "sqlite":
            if sqlite3.sqlite_version_info < SQLITE_MIN_RETURNING:
                raise TargetError(
                    f"the outbox needs SQLite >= 3.35 (RETURNING); this runtime has "
                    f"{sqlite3.sqlite_version}"
                )
        elif dialect != "postgresql":
            raise TargetError(f"the outbox supports PostgreSQL and SQLite, not {dialect}")
        self._engine = engine
        self._dialect = dialect
        self._owns_engine = False

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> OutboxTarget:
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
        """The rows, sorted by key: two managers inserting overlapping batches then wait on each
        other's unique-index entries in one order and cannot deadlock. On PostgreSQL, also the
        column arrays of the one INSERT (the enqueue instant is added when sent)."""
        try:
            rows = sorted((_row(task) for task in tasks), key=lambda r: r["idempotency_key"])
        except (TypeError, ValueError) as exc:
            raise TargetError(f"cannot encode the batch: {exc}") from exc
        if self._dialect == "postgresql":
            return Prepared(list(tasks), {col: [r[col] for r in rows] for col in _COLUMNS})
        return Prepared(list(tasks), rows)

    async def send(self, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
        tasks = prepared.tasks
        if not tasks:
            return []
        try:
            async with self._engine.begin() as conn:
                inserted = await self._insert_rows(conn, prepared.data, now)
                missing = {t.idempotency_key for t in tasks} - inserted.keys()
                existing = await _lookup(conn, missing)
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            raise TargetError(f"outbox: {type(exc).__name__}: {exc}") from exc
        results = []
        for task in tasks:
            key = task.idempotency_key
            seq = inserted.pop(key, None)
            if seq is not None:
                # A key repeated within the batch is new once, then a duplicate of that row.
                existing[key] = seq
                results.append(EnqueueResult(task, "enqueued", str(seq)))
            else:
                seq = existing.get(key)
                message_id = str(seq) if seq is not None else None
                results.append(EnqueueResult(task, "duplicate", message_id))
        return results

    async def _insert_rows(self, conn: AsyncConnection, data: Any, now: datetime) -> dict[str, int]:
        inserted: dict[str, int] = {}
        if self._dialect == "postgresql":
            # One statement whatever the batch size: the columns travel as arrays.
            for seq, key in (await conn.execute(_PG_UNNEST_INSERT, {**data, "enqueued_at": now})).all():
                inserted[key] = seq
            return inserted
        rows: list[dict[str, Any]] = [{**r, "enqueued_at": now} for r in data]
        for start in range(0, len(rows), CHUNK_ROWS):
            stmt = self._insert_statement(rows[start : start + CHUNK_ROWS])
            for seq, key in (await conn.execute(stmt)).all():
                inserted[key] = seq
        return inserted

    def _insert_statement(self, rows: list[dict[str, Any]]) -> ReturningInsert[int, str]:
        returned = (OutboxMessage.seq, OutboxMessage.idempotency_key)
        if self._dialect == "postgresql":
            pg = postgresql.insert(OutboxMessage).values(rows)
            return pg.on_conflict_do_nothing(index_elements=["idempotency_key"]).returning(
                *returned
            )
        lite = sqlite.insert(OutboxMessage).values(rows)
        return lite.on_conflict_do_nothing(index_elements=["idempotency_key"]).returning(*returned)

    async def ping(self) -> None:
        """Raise unless the outbox's database answers (a readiness check)."""
        async with self._engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def close(self) -> None:
        """Dispose of the engine if this target created it (:meth:`from_url`)."""
        if self._owns_engine:
            await self._engine.dispose()


_COLUMNS = (
    "task_id", "idempotency_key", "queue", "name", "task_type", "payload", "options", "scheduled_at",
)
_PG_TYPES = ("text",) * 7 + ("timestamptz",)
_PG_UNNEST_INSERT = text(
    f"INSERT INTO pm_outbox ({', '.join(_COLUMNS)}, enqueued_at) "
    f"SELECT *, CAST(:enqueued_at AS timestamptz) FROM unnest("
    f"{', '.join(f'CAST(:{c} AS {t}[])' for c, t in zip(_COLUMNS, _PG_TYPES, strict=True))}) "
    "ON CONFLICT (idempotency_key) DO NOTHING RETURNING seq, idempotency_key"
)


def _row(task: Task) -> dict[str, Any]:
    return {
        "task_id": task.id,
        "idempotency_key": task.idempotency_key,
        "queue": task.queue,
        "name": task.name,
        "task_type": task.task_type,
        "payload": task.payload_text(),
        "options": task.options_text(),
        "scheduled_at": task.scheduled_at,
    }


async def _lookup(conn: AsyncConnection, keys: set[str]) -> dict[str, int]:
    """``seq`` of rows that already hold these keys (same transaction as the insert)."""
    found: dict[str, int] = {}
    ordered = sorted(keys)
    for start in range(0, len(ordered), CHUNK_ROWS):
        chunk = ordered[start : start + CHUNK_ROWS]
        stmt = select(OutboxMessage.seq, OutboxMessage.idempotency_key).where(
            OutboxMessage.idempotency_key.in_(chunk)
        )
        for seq, key in (await conn.execute(stmt)).all():
            found[key] = seq
    return found
