"""Reading ``periodic_jobs`` for people: the rows the API and the dashboard show, and the filters
of their lists.

Rows are read raw (:func:`periodic_manager.db.rows.columns`, every column) for the row judge, so
no stored value can fail a request; only what is asked for is read, so a page never judges rows
beyond it. The writer (:mod:`periodic_manager.db.schedule_writer`) reads the row it changes
through :func:`select_rows` too, locked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import ColumnElement, Select, String, and_, case, cast, func, select, true
from sqlalchemy.ext.asyncio import AsyncConnection

from periodic_manager.db import rows as dbrows
from periodic_manager.db.engine import reads_bytes
from periodic_manager.db.models import entries_table, jobs_table
from periodic_manager.db.store_reads import rejected
from periodic_manager.schedules.rules import DEFAULT_QUEUE

T = jobs_table.c


@dataclass(frozen=True, slots=True)
class Filters:
    """What a list of schedules is filtered by (None: not filtered).

    ``enabled``: as judged (a row whose ``enabled`` is neither true nor false matches neither).
    ``queue``: ``options.queue`` (absent means the default queue). ``name_prefix``:
    case-sensitive (an empty one filters nothing). ``in_error``: rows a live manager (heartbeat at
    or after ``alive_after``) rejected, or the others.
    """

    enabled: bool | None = None
    task_type: str | None = None
    queue: str | None = None
    name_prefix: str | None = None
    in_error: bool | None = None
    alive_after: datetime | None = None

    @property
    def active(self) -> bool:
        """Whether any filter is set."""
        chosen = (self.enabled, self.task_type, self.queue, self.in_error)
        return any(value is not None for value in chosen) or bool(self.name_prefix)


def _conditions(f: Filters, sqlite: bool) -> list[ColumnElement[bool]]:
    conds: list[ColumnElement[bool]] = []
    if f.enabled is not None:
        conds.append(dbrows.enabled_is(sqlite, f.enabled))
    if f.task_type is not None:
        conds.append(T.task_type == f.task_type)
    if f.queue is not None:
        conds.append(_queue_is(sqlite, f.queue))
    if f.name_prefix:
        # substr rather than LIKE: exact and case-sensitive on both databases, no escaping.
        conds.append(func.substr(T.name, 1, len(f.name_prefix)) == f.name_prefix)
    if f.in_error is not None:
        assert f.alive_after is not None, "in_error needs alive_after"
        rejected_ids = cast(T.id, String).in_(
            rejected(f.alive_after).with_only_columns(entries_table.c.schedule_key)
        )
        conds.append(rejected_ids if f.in_error else ~rejected_ids)
    return conds


def _queue_is(sqlite: bool, queue: str) -> ColumnElement[bool]:
    """Rows whose ``options.queue`` is ``queue`` (absent means the default queue)."""
    value: ColumnElement[Any] = func.coalesce(
        jobs_table.c.options["queue"].as_string(), DEFAULT_QUEUE
    )
    if sqlite:
        # Rows written with SQL may hold text that is not JSON, which json_extract refuses.
        value = case((func.json_valid(jobs_table.c.options) == 1, value), else_=None)
    return value == queue


def _where(conn: AsyncConnection, filters: Filters) -> ColumnElement[bool]:
    return and_(true(), *_conditions(filters, reads_bytes(conn)))


def select_rows(
    sqlite: bool,
    where: ColumnElement[bool] | None = None,
    *,
    limit: int | None = None,
    offset: int = 0,
) -> Select[Any]:
    """Raw rows (every column, see ``dbrows.FIELDS``) ordered by id: only what is asked for."""
    stmt = select(*dbrows.columns(sqlite, display=True)).order_by(T.id)
    if where is not None:
        stmt = stmt.where(where)
    if limit is not None:
        stmt = stmt.limit(limit).offset(offset)
    return stmt


async def _read(conn: AsyncConnection, stmt: Select[Any]) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in (await conn.execute(stmt)).all()]


async def row(conn: AsyncConnection, schedule_id: int) -> tuple[Any, ...] | None:
    """The raw row of ``schedule_id`` (None: there is none)."""
    raws = await _read(conn, select_rows(reads_bytes(conn), T.id == schedule_id))
    return raws[0] if raws else None


async def row_named(conn: AsyncConnection, name: str) -> tuple[Any, ...] | None:
    """The raw row named ``name`` (None: there is none)."""
    raws = await _read(conn, select_rows(reads_bytes(conn), T.name == name))
    return raws[0] if raws else None


async def rows_of(conn: AsyncConnection, ids: Sequence[int]) -> list[tuple[Any, ...]]:
    """The raw rows of ``ids`` that exist, by id."""
    return await _read(conn, select_rows(reads_bytes(conn), T.id.in_(ids)))


async def exists(conn: AsyncConnection, schedule_id: int) -> bool:
    """Whether the row exists (nothing of it is read)."""
    found = await conn.execute(select(T.id).where(T.id == schedule_id))
    return found.first() is not None


async def count(conn: AsyncConnection, filters: Filters) -> int:
    """How many rows ``filters`` lets through."""
    stmt = select(func.count()).select_from(jobs_table).where(_where(conn, filters))
    return int((await conn.execute(stmt)).scalar_one())


async def page(
    conn: AsyncConnection, filters: Filters, *, limit: int, offset: int
) -> list[tuple[Any, ...]]:
    """A page of the raw rows ``filters`` lets through, by id."""
    sqlite = reads_bytes(conn)
    return await _read(conn, select_rows(sqlite, _where(conn, filters), limit=limit, offset=offset))


async def page_ids(
    conn: AsyncConnection,
    filters: Filters,
    *,
    by: Literal["name", "id"],
    limit: int,
    offset: int,
) -> list[int]:
    """A page of the ids of the rows ``filters`` lets through, ordered by name or id."""
    column = T.name if by == "name" else T.id
    stmt = select(T.id).where(_where(conn, filters)).order_by(column).limit(limit).offset(offset)
    return list((await conn.execute(stmt)).scalars())


async def matching_ids(conn: AsyncConnection, filters: Filters) -> set[int]:
    """The ids of every row ``filters`` lets through."""
    return set((await conn.execute(select(T.id).where(_where(conn, filters)))).scalars())
