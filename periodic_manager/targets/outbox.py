"""Database outbox target: tasks become rows of ``pm_outbox``, unique on the idempotency key.

``INSERT ... ON CONFLICT (idempotency_key) DO NOTHING RETURNING seq, idempotency_key`` claims
and enqueues in one statement: a key that comes back was enqueued now; one that does not was
already there (its ``seq`` is looked up in the same transaction). PostgreSQL and SQLite >= 3.35
(RETURNING). The message id is ``str(seq)``.

MariaDB/MySQL have no RETURNING here: in a REPEATABLE READ transaction the keys already there are
read first (which fixes the transaction's snapshot), the others inserted with ``ON DUPLICATE KEY
UPDATE`` doing nothing, and read again: the snapshot shows this transaction's own rows and none
that another manager committed meanwhile, so the rows read are exactly the ones inserted now;
the seq of the others is read with a locking (current) read.

Consumers take rows with ``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL, MariaDB >= 10.6
and MySQL 8, and set ``processed_at`` (see ``examples/consume_outbox.py``).

``options.overlap`` skip and hold: the previous task of a schedule is its newest row (by
``seq``, whatever its key: a manual trigger counts too); it is finished once ``processed_at`` is
set, or when there is no row left. Such tasks are inserted one by one after the batch, each
behind a transaction-level advisory lock on its schedule's name (PostgreSQL; on MariaDB/MySQL a
named lock, ``GET_LOCK``, released once the transaction ends, with locking reads), so two
managers never both find the schedule free. SQLite serialises writers: a decision read before another
manager's write fails to commit (SQLITE_BUSY) and the batch is retried.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.dml import ReturningInsert

from periodic_manager.contracts import (
    FINISHED,
    NONE,
    UNFINISHED,
    EnqueueResult,
    Prepared,
    Previous,
    Task,
)
from periodic_manager.db.engine import backend
from periodic_manager.db.models import outbox_table
from periodic_manager.errors import TargetError
from periodic_manager.targets.base import overlap_of, overlap_timeout_ms
from periodic_manager.targets.database import DatabaseTarget, batch_results

# Rows per INSERT: 10 bind parameters a row stays far below the limits of asyncpg (32767) and
# SQLite (32766), so a burst of 10,000 slots is a few statements in one transaction.
CHUNK_ROWS = 1000
SQLITE_MIN_RETURNING = (3, 35, 0)


class OutboxTarget(DatabaseTarget):
    """Enqueues tasks as ``pm_outbox`` rows; each idempotency key at most once."""

    name = "outbox"

    def __init__(self, engine: AsyncEngine) -> None:
        dialect = backend(engine)
        if dialect == "sqlite":
            if sqlite3.sqlite_version_info < SQLITE_MIN_RETURNING:
                raise TargetError(
                    f"the outbox needs SQLite >= 3.35 (RETURNING); this runtime has "
                    f"{sqlite3.sqlite_version}"
                )
        elif dialect == "mysql":
            # The reads that tell inserted rows from others need REPEATABLE READ (module doc).
            engine = engine.execution_options(isolation_level="REPEATABLE READ")
        elif dialect != "postgresql":
            raise TargetError(
                f"the outbox supports PostgreSQL, MariaDB/MySQL and SQLite, not {dialect}"
            )
        self._engine = engine
        self._dialect = dialect

    def prepare(self, tasks: Sequence[Task]) -> Prepared:
        """The rows, sorted by key: two managers inserting overlapping batches then wait on each
        other's unique-index entries in one order and cannot deadlock. On PostgreSQL, also the
        column arrays of the one INSERT (the enqueue instant is added when sent). Tasks of
        schedules with ``options.overlap`` are kept apart, by name (their locks' order). A task
        that cannot be encoded is refused alone (for good)."""
        refusals: dict[int, str] = {}
        encoded: dict[int, dict[str, Any]] = {}
        for index, task in enumerate(tasks):
            try:
                encoded[index] = _row(task)
            except (TypeError, ValueError) as exc:
                refusals[index] = f"outbox: cannot encode the task: {exc}"
        after = sorted(
            (i for i in encoded if overlap_of(tasks[i]) != "allow"), key=lambda i: tasks[i].name
        )
        plain = [encoded[i] for i in encoded if overlap_of(tasks[i]) == "allow"]
        rows = sorted(plain, key=lambda r: r["idempotency_key"])
        after_rows = [(i, encoded[i]) for i in after]
        if self._dialect == "postgresql":
            data: Any = {col: [r[col] for r in rows] for col in _COLUMNS} if rows else None
        else:
            data = rows
        return Prepared(list(tasks), (data, after_rows, refusals))

    async def send(self, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
        tasks = prepared.tasks
        if not tasks:
            return []
        plain, after, refusals = prepared.data
        after_keys = {row["idempotency_key"] for _, row in after}
        mine = self._dialect == "mysql"
        try:
            async with self._engine.connect() as conn:
                try:
                    async with conn.begin():
                        inserted = await self._insert_rows(conn, plain, now) if plain else {}
                        missing = (
                            {t.idempotency_key for i, t in enumerate(tasks) if i not in refusals}
                            - inserted.keys()
                            - after_keys
                        )
                        existing = await _lookup(conn, missing, current=mine)
                        decided = {
                            i: await self._insert_after(conn, tasks[i], row, now)
                            for i, row in after
                        }
                finally:
                    if mine and after:  # the named locks of _insert_after
                        await conn.execute(_MY_UNLOCK)
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            raise TargetError(f"outbox: {type(exc).__name__}: {exc}") from exc
        return batch_results(tasks, refusals, decided, inserted, existing)

    async def _insert_after(
        self, conn: AsyncConnection, task: Task, row: dict[str, Any], now: datetime
    ) -> EnqueueResult:
        """Insert ``task`` unless its schedule's newest row is unprocessed (options.overlap)."""
        mine = self._dialect == "mysql"
        if self._dialect == "postgresql":
            await conn.execute(_LOCK, {"key": _lock_key(task.name)})
        elif mine:
            got = (
                await conn.execute(_MY_LOCK, {"key": task.name, "timeout": _MY_LOCK_WAIT_S})
            ).scalar()
            if got != 1:
                raise TargetError(
                    f"outbox: schedule {task.name!r} stayed locked {_MY_LOCK_WAIT_S} s"
                )
        found = (
            await conn.execute(_MY_BY_KEY if mine else _BY_KEY, {"key": task.idempotency_key})
        ).first()
        if found is not None:
            return EnqueueResult(task, "duplicate", str(found[0]))
        prev = (await conn.execute(_MY_NEWEST if mine else _NEWEST, {"name": task.name})).first()
        previous = Previous(None, NONE)
        if prev is not None:
            task_id, processed_at, enqueued_at = prev
            previous = Previous(task_id, FINISHED if processed_at is not None else UNFINISHED)
            if processed_at is None:
                timeout = overlap_timeout_ms(task)
                if not timeout or not _older(enqueued_at, now, timeout):
                    return EnqueueResult(task, "busy", previous=previous)
                previous.timed_out = True
        if mine:
            await conn.execute(self._mysql_insert([{**row, "enqueued_at": now}]))
            inserted = (await conn.execute(_BY_KEY, {"key": task.idempotency_key})).first()
        else:
            inserted = (
                await conn.execute(self._insert_statement([{**row, "enqueued_at": now}]))
            ).first()
        if inserted is None:  # cannot happen behind the lock; a duplicate if it ever does
            return EnqueueResult(task, "duplicate", None, previous=previous)
        return EnqueueResult(task, "enqueued", str(inserted[0]), previous=previous)

    async def _insert_rows(self, conn: AsyncConnection, data: Any, now: datetime) -> dict[str, int]:
        inserted: dict[str, int] = {}
        if self._dialect == "postgresql":
            # One statement whatever the batch size: the columns travel as arrays.
            for seq, key in (
                await conn.execute(_PG_UNNEST_INSERT, {**data, "enqueued_at": now})
            ).all():
                inserted[key] = seq
            return inserted
        rows: list[dict[str, Any]] = [{**r, "enqueued_at": now} for r in data]
        if self._dialect == "mysql":
            # Read first (this fixes the snapshot), insert the others, read them again: what the
            # snapshot shows of them is this transaction's own (module doc).
            there = await _lookup(conn, {r["idempotency_key"] for r in rows})
            fresh = [r for r in rows if r["idempotency_key"] not in there]
            for start in range(0, len(fresh), CHUNK_ROWS):
                await conn.execute(self._mysql_insert(fresh[start : start + CHUNK_ROWS]))
            return await _lookup(conn, {r["idempotency_key"] for r in fresh})
        for start in range(0, len(rows), CHUNK_ROWS):
            stmt = self._insert_statement(rows[start : start + CHUNK_ROWS])
            for seq, key in (await conn.execute(stmt)).all():
                inserted[key] = seq
        return inserted

    def _insert_statement(self, rows: list[dict[str, Any]]) -> ReturningInsert[int, str]:
        returned = (outbox_table.c.seq, outbox_table.c.idempotency_key)
        if self._dialect == "postgresql":
            pg = postgresql.insert(outbox_table).values(rows)
            return pg.on_conflict_do_nothing(index_elements=["idempotency_key"]).returning(
                *returned
            )
        lite = sqlite.insert(outbox_table).values(rows)
        return lite.on_conflict_do_nothing(index_elements=["idempotency_key"]).returning(*returned)

    @staticmethod
    def _mysql_insert(rows: list[dict[str, Any]]) -> Any:
        """MariaDB/MySQL: insert ``rows``, a key already there left as it is (no error)."""
        stmt = mysql.insert(outbox_table).values(rows)
        return stmt.on_duplicate_key_update(seq=outbox_table.c.seq)

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        """A row is finished once ``processed_at`` is set (see the module docstring)."""
        return None

    async def ping(self) -> None:
        """Raise unless the outbox's database answers (a readiness check)."""
        async with self._engine.connect() as conn:
            await conn.execute(text("SELECT 1"))


_COLUMNS = (
    "task_id",
    "idempotency_key",
    "queue",
    "name",
    "task_type",
    "payload",
    "options",
    "scheduled_at",
)
_PG_TYPES = ("text",) * 7 + ("timestamptz",)
_PG_UNNEST_INSERT = text(
    f"INSERT INTO pm_outbox ({', '.join(_COLUMNS)}, enqueued_at) "
    f"SELECT *, CAST(:enqueued_at AS timestamptz) FROM unnest("
    f"{', '.join(f'CAST(:{c} AS {t}[])' for c, t in zip(_COLUMNS, _PG_TYPES, strict=True))}) "
    "ON CONFLICT (idempotency_key) DO NOTHING RETURNING seq, idempotency_key"
)


_LOCK = text("SELECT pg_advisory_xact_lock(:key)")
_BY_KEY = text("SELECT seq FROM pm_outbox WHERE idempotency_key = :key")
# MariaDB/MySQL: a named lock per schedule (named locks are the server's: the database's name is
# part of it), held until the transaction has ended; locking reads see what others committed.
_MY_LOCK_WAIT_S = 10
_MY_LOCK = text(
    "SELECT GET_LOCK(CONCAT('pm:o:', LEFT(SHA2(CONCAT(DATABASE(), '/', :key), 256), 40)), :timeout)"
)
_MY_UNLOCK = text("DO RELEASE_ALL_LOCKS()")
_MY_BY_KEY = text("SELECT seq FROM pm_outbox WHERE idempotency_key = :key LOCK IN SHARE MODE")
# The newest row of a schedule (index ix_pm_outbox_name_seq).
_NEWEST = text(
    "SELECT task_id, processed_at, enqueued_at FROM pm_outbox WHERE name = :name "
    "ORDER BY seq DESC LIMIT 1"
)
_MY_NEWEST = text(
    "SELECT task_id, processed_at, enqueued_at FROM pm_outbox WHERE name = :name "
    "ORDER BY seq DESC LIMIT 1 LOCK IN SHARE MODE"
)


def _lock_key(name: str) -> int:
    """A signed 64-bit advisory-lock key for a schedule's name (a collision only serialises)."""
    digest = hashlib.sha256(f"periodic_manager:overlap:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _older(enqueued_at: Any, now: datetime, timeout_ms: int) -> bool:
    """Whether a row enqueued at ``enqueued_at`` (as read: aware, or naive UTC text/datetime
    on SQLite) is older than ``timeout_ms`` at ``now``; an unreadable value counts as old."""
    if isinstance(enqueued_at, str):
        try:
            enqueued_at = datetime.fromisoformat(enqueued_at)
        except ValueError:
            return True
    if not isinstance(enqueued_at, datetime):
        return True
    if enqueued_at.tzinfo is None:
        enqueued_at = enqueued_at.replace(tzinfo=UTC)
    return now.astimezone(UTC) - enqueued_at >= timedelta(milliseconds=timeout_ms)


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


async def _lookup(
    conn: AsyncConnection, keys: set[str], *, current: bool = False
) -> dict[str, int]:
    """``seq`` of rows that already hold these keys (same transaction as the insert); ``current``:
    a locking read, which sees what other transactions committed (MariaDB/MySQL)."""
    found: dict[str, int] = {}
    ordered = sorted(keys)
    for start in range(0, len(ordered), CHUNK_ROWS):
        chunk = ordered[start : start + CHUNK_ROWS]
        stmt = select(outbox_table.c.seq, outbox_table.c.idempotency_key).where(
            outbox_table.c.idempotency_key.in_(chunk)
        )
        if current:
            stmt = stmt.with_for_update(read=True)
        for seq, key in (await conn.execute(stmt)).all():
            found[key] = seq
    return found
