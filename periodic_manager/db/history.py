"""``pm_runs``, the run history: one row per slot outcome and per manual trigger.

Written by the runtime store in the same transaction as the state upsert (:func:`write`: one
``COPY`` on PostgreSQL with asyncpg, executemany in chunks elsewhere), and by the API for a manual
trigger (:func:`record_trigger`). Bounded two ways (``DatabaseRuntimeStore.prune_runs``): rows
older than the retention go (:func:`drop_old`), and each schedule written since the last prune
keeps only its newest rows (:func:`cap`). Every DELETE is bounded (by rows or by schedule keys).
Deleted with its schedule by the schedule writer.

The API reads a schedule's history a page at a time (:func:`page`) and the newest run of the
schedules a dashboard page shows (:func:`last_runs`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Table, and_, delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.contracts import RunRecord
from periodic_manager.db import rows as dbrows
from periodic_manager.db.engine import chunks, on_mysql, reads_bytes
from periodic_manager.db.models import runs_table
from periodic_manager.pacing import in_turns

# pm_runs: rows per executemany, rows per age-based DELETE, DELETE rounds per prune.
_INSERT_CHUNK = 5000
_PRUNE_BATCH = 5000
_PRUNE_ROUNDS = 20
_ERROR_MAX = 2000  # characters of an error kept in history
_MS = timedelta(milliseconds=1)
_RUN_COLUMNS = (
    "schedule_key",
    "name",
    "slot_at",
    "status",
    "at",
    "lateness_ms",
    "message_id",
    "error",
    "reason",
)


@dataclass(frozen=True, slots=True)
class RunRow:
    """A row of the history as the API shows it, decoded cell by cell: a value the table holds
    but that cannot be read (written with SQL) is None."""

    id: int
    schedule_key: str
    slot_at: datetime | None
    status: str
    at: datetime | None
    lateness_ms: int | None
    message_id: str | None
    error: str | None
    reason: str | None = None


# -- writing --------------------------------------------------------------------------------------


async def write(conn: AsyncConnection, runs: Sequence[RunRecord], *, copy: bool) -> None:
    """Insert ``runs`` in the caller's transaction: ``copy`` (PostgreSQL, asyncpg) as one COPY
    stream, so a burst's 100,000 history rows are not 20 executemany rounds; else in chunks."""
    if copy:
        records: list[tuple[Any, ...]] = []
        async for part in in_turns(runs):
            for run in part:
                h = _run_values(run)
                records.append(tuple(h[c] for c in _RUN_COLUMNS))
        raw = await conn.get_raw_connection()
        await raw.driver_connection.copy_records_to_table(  # type: ignore[union-attr]
            runs_table.name, records=records, columns=_RUN_COLUMNS
        )
        return
    for i in range(0, len(runs), _INSERT_CHUNK):
        part = runs[i : i + _INSERT_CHUNK]
        await conn.execute(insert(runs_table), [_run_values(run) for run in part])


async def record_trigger(
    conn: AsyncConnection,
    schedule_key: str,
    name: str,
    at: datetime,
    status: str,
    message_id: str | None,
    error: str | None,
) -> None:
    """Record a manual trigger at ``at`` (its own slot, so never late) and commit; a failure
    rolls the transaction back and is raised."""
    values = _values(schedule_key, name, at, status, at, message_id or None, error or None)
    try:
        await conn.execute(insert(runs_table).values(values))
        await conn.commit()
    except Exception:
        await conn.rollback()
        raise


async def record_api_runs(
    conn: AsyncConnection,
    schedule_key: str,
    name: str,
    runs: Sequence[tuple[datetime, str, datetime, str | None, str | None]],
) -> None:
    """Record runs the API (or the CLI) sent itself, ``(slot, status, at, message_id, error)``
    each (a backfill: ``backfilled``), and commit; a failure rolls back and is raised."""
    if not runs:
        return
    values = [
        _values(schedule_key, name, slot, st, at, mid or None, err or None)
        for slot, st, at, mid, err in runs
    ]
    try:
        for i in range(0, len(values), _INSERT_CHUNK):
            await conn.execute(insert(runs_table), values[i : i + _INSERT_CHUNK])
        await conn.commit()
    except Exception:
        await conn.rollback()
        raise


def _run_values(run: RunRecord) -> dict[str, Any]:
    return _values(
        run.schedule_key,
        run.name,
        run.slot,
        run.status,
        run.at,
        run.message_id,
        run.error,
        run.reason,
    )


def _values(
    schedule_key: str,
    name: str,
    slot: datetime,
    status: str,
    at: datetime,
    message_id: str | None,
    error: str | None,
    reason: str | None = None,
) -> dict[str, Any]:
    # Elapsed time in UTC: aware datetimes sharing one non-UTC zone subtract as wall-clock times.
    if slot.tzinfo is not UTC:
        slot = slot.astimezone(UTC)
    if at.tzinfo is not UTC:
        at = at.astimezone(UTC)
    return {
        "schedule_key": schedule_key,
        "name": name,
        "slot_at": slot,
        "status": status,
        "at": at,
        "lateness_ms": round((at - slot) / _MS),
        "message_id": message_id[:128] if message_id is not None else None,
        "error": error[:_ERROR_MAX] if error is not None else None,
        "reason": reason,
    }


# -- bounds ---------------------------------------------------------------------------------------


async def drop_old(engine: AsyncEngine, cutoff: datetime) -> int:
    """Delete rows with ``at`` before ``cutoff`` in bounded batches (at most ``_PRUNE_ROUNDS``
    per call; the rest goes at the next call); returns the number of rows deleted."""
    return await drop_before(engine, runs_table, runs_table.c.id, runs_table.c.at, cutoff)


async def cap(engine: AsyncEngine, keys: Iterable[str], per_schedule: int) -> int:
    """Keep the newest ``per_schedule`` rows of every schedule in ``keys``, a bounded number of
    schedules per statement; returns the number of rows deleted."""
    c = runs_table.c
    order = (c.slot_at.desc(), c.id.desc())
    return await keep_newest(
        engine, runs_table, c.id, c.schedule_key, order, sorted(set(keys)), per_schedule
    )


async def drop_before(
    engine: AsyncEngine,
    table: Table,
    id_col: ColumnElement[Any],
    at_col: ColumnElement[Any],
    cutoff: datetime,
) -> int:
    """Delete the rows of a history table ``table`` (primary key ``id_col``) whose ``at_col`` is
    before ``cutoff``, in bounded batches (at most ``_PRUNE_ROUNDS`` per call; the rest goes at
    the next call); the number deleted."""
    removed = 0
    old = select(id_col).where(at_col < cutoff).order_by(at_col).limit(_PRUNE_BATCH)
    stmt = delete(table).where(id_col.in_(old.scalar_subquery()))
    if on_mysql(engine):  # no LIMIT in a subquery of IN there; a DELETE takes one itself
        stmt = delete(table).where(at_col < cutoff).with_dialect_options(mysql_limit=_PRUNE_BATCH)
    for _ in range(_PRUNE_ROUNDS):
        async with engine.begin() as conn:
            result = await conn.execute(stmt)
        removed += int(result.rowcount)
        if result.rowcount < _PRUNE_BATCH:
            break
    return removed


async def keep_newest(
    engine: AsyncEngine,
    table: Table,
    id_col: ColumnElement[Any],
    key_col: ColumnElement[Any],
    order: Sequence[ColumnElement[Any]],
    keys: Sequence[Any],
    per_key: int,
) -> int:
    """Keep the first ``per_key`` rows by ``order`` of every ``key_col`` value in ``keys`` of a
    history table ``table`` (primary key ``id_col``), a bounded number of keys per statement;
    the number deleted."""
    removed = 0
    for part in chunks(list(keys)):
        rank = func.row_number().over(partition_by=key_col, order_by=order).label("rn")
        ranked = select(id_col.label("id"), rank).where(key_col.in_(part)).subquery()
        excess = select(ranked.c.id).where(ranked.c.rn > per_key)
        async with engine.begin() as conn:
            result = await conn.execute(delete(table).where(id_col.in_(excess.scalar_subquery())))
        removed += int(result.rowcount)
    return removed


# -- reading (the API) ----------------------------------------------------------------------------


async def page(
    conn: AsyncConnection, schedule_key: str, status: str | None, *, limit: int, offset: int
) -> tuple[int, list[RunRow]]:
    """How many runs the schedule has (with ``status``, when given), and a page of them, the
    newest slot first."""
    where = [runs_table.c.schedule_key == schedule_key]
    if status is not None:
        where.append(runs_table.c.status == status)
    total = (
        await conn.execute(select(func.count()).select_from(runs_table).where(*where))
    ).scalar_one()
    sqlite = reads_bytes(conn)
    stmt = (
        select(*_raw(sqlite))
        .where(*where)
        .order_by(runs_table.c.slot_at.desc(), runs_table.c.id.desc())
        .limit(limit)
        .offset(offset)
    )
    return int(total), [_row(sqlite, r) for r in (await conn.execute(stmt)).all()]


async def last_runs(conn: AsyncConnection, keys: Sequence[str]) -> dict[str, RunRow]:
    """The newest history row (by slot) of each key."""
    newest = (
        select(runs_table.c.schedule_key, func.max(runs_table.c.slot_at).label("slot_at"))
        .where(runs_table.c.schedule_key.in_(keys))
        .group_by(runs_table.c.schedule_key)
        .subquery()
    )
    sqlite = reads_bytes(conn)
    stmt = (
        select(*_raw(sqlite))
        .join(
            newest,
            and_(
                runs_table.c.schedule_key == newest.c.schedule_key,
                runs_table.c.slot_at == newest.c.slot_at,
            ),
        )
        .order_by(runs_table.c.id)
    )
    out: dict[str, RunRow] = {}
    for r in (await conn.execute(stmt)).all():  # ties on a slot: the newest row wins
        row = _row(sqlite, r)
        out[row.schedule_key] = row
    return out


async def slots_with(
    conn: AsyncConnection,
    schedule_key: str,
    statuses: Iterable[str],
    start: datetime,
    end: datetime,
) -> set[datetime]:
    """The slots in ``[start, end)`` the history records with one of ``statuses`` (UTC)."""
    return await instants(
        conn,
        runs_table.c.slot_at,
        [
            runs_table.c.schedule_key == schedule_key,
            runs_table.c.status.in_(list(statuses)),
            runs_table.c.slot_at >= start.astimezone(UTC),
            runs_table.c.slot_at < end.astimezone(UTC),
        ],
    )


async def instants(
    conn: AsyncConnection, column: ColumnElement[Any], where: Sequence[ColumnElement[Any]]
) -> set[datetime]:
    """The instants of ``column`` in the rows ``where`` selects (UTC), each read as data like
    any: an unreadable one is left out."""
    sqlite = reads_bytes(conn)
    stmt = select(dbrows.raw_instant(sqlite, column).label("at")).where(*where)
    out: set[datetime] = set()
    for r in (await conn.execute(stmt)).all():
        at = dbrows.instant_or_none(sqlite, r.at)
        if at is not None:
            out.add(at.astimezone(UTC))
    return out


async def kept(conn: AsyncConnection, schedule_key: str) -> tuple[int, datetime | None]:
    """How many rows the schedule's history holds and the oldest slot among them: with as many
    rows as its cap, slots at or before that one may have been dropped (:func:`cap` keeps the
    newest slots)."""
    sqlite = reads_bytes(conn)
    c = runs_table.c
    stmt = select(func.count(), dbrows.raw_instant(sqlite, func.min(c.slot_at))).where(
        c.schedule_key == schedule_key
    )
    n, oldest = (await conn.execute(stmt)).one()
    return int(n or 0), dbrows.instant_or_none(sqlite, oldest)


def _raw(sqlite: bool) -> list[Any]:
    """Every column of ``pm_runs`` raw (:func:`periodic_manager.db.rows.raw`)."""
    return [dbrows.raw(sqlite, c).label(c.name) for c in runs_table.c]


def _row(sqlite: bool, r: Any) -> RunRow:
    return RunRow(
        id=int(r.id),  # the primary key: an integer on both databases
        schedule_key=dbrows.text_of(r.schedule_key) or "",
        slot_at=dbrows.instant_or_none(sqlite, r.slot_at),
        status=dbrows.text_of(r.status) or "",
        at=dbrows.instant_or_none(sqlite, r.at),
        lateness_ms=dbrows.int_of(r.lateness_ms),
        message_id=dbrows.text_of(r.message_id),
        error=dbrows.text_of(r.error),
        reason=dbrows.text_of(r.reason),
    )
