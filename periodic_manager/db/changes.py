"""What changed in ``periodic_jobs`` since a revision: the one change feed, followed by the
manager's provider (:mod:`periodic_manager.db.provider`) and by the dashboard's next-slot order
(``api/ui/order.py``).

The triggers of migration 0003 give every INSERT and UPDATE a fresh ``revision`` from one counter
and leave a tombstone in ``periodic_jobs_deleted`` for every DELETE (a TRUNCATE leaves one
tombstone of id 0). Writers take a transaction-level advisory lock in a statement trigger, so
revisions become visible in commit order and a watermark never skips a slow transaction. Hence:

* the **watermark** (:func:`current_revision`) is the largest revision of a row or a tombstone:
  two index lookups, and when it has not moved nothing changed;
* what changed after revision N (:func:`changes_since`) is the tombstones newer than N and the
  rows whose revision is larger than N (:func:`rows_since`); a TRUNCATE asks for a full read.

MariaDB and MySQL fire no trigger on a TRUNCATE, so it leaves no tombstone there. It still shows:
no row read at N is left (the oldest row revision is past N, or there is no row), and a full read
then costs what reading the changed rows would; the watermark going backwards says the same of
rows gone without a tombstone. The poller (``runtime/poll.py``) compares both figures
(:class:`Watermark`), so a TRUNCATE alone wakes it too.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, bindparam, delete, func, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.db import rows as dbrows
from periodic_manager.db.engine import reads_bytes
from periodic_manager.db.models import deleted_jobs_table, jobs_table


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed after a revision: the watermark now, and the ids of the rows deleted since
    (their tombstones). ``full``: a TRUNCATE, after which only a full read tells what is there."""

    revision: int
    deleted: Sequence[int] = ()
    full: bool = False


@dataclass(frozen=True, slots=True)
class Watermark:
    """Where the change feed stands: ``revision``, the largest revision of a row or a tombstone,
    and ``oldest``, the smallest revision of a row (None: no row)."""

    revision: int
    oldest: int | None


# The watermark's statement, built once: it is read at every sync and every poll.
_WATERMARK = select(
    select(func.coalesce(func.max(jobs_table.c.revision), 0)).scalar_subquery(),
    select(func.min(jobs_table.c.revision)).scalar_subquery(),
    select(func.coalesce(func.max(deleted_jobs_table.c.revision), 0)).scalar_subquery(),
)


@functools.cache
def _watermark_pg() -> str:
    """The same statement as PostgreSQL's text, for the driver's own connection (see peek);
    compiled at the first peek, not when the module is imported."""
    return str(
        _WATERMARK.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True})
    )


async def watermark(conn: AsyncConnection) -> Watermark:
    """The :class:`Watermark` now: one statement, three index lookups."""
    return _mark((await conn.execute(_WATERMARK)).one())


def _mark(row: Sequence[Any]) -> Watermark:
    latest_row, oldest_row, latest_tombstone = row
    return Watermark(
        int(max(latest_row, latest_tombstone)), None if oldest_row is None else int(oldest_row)
    )


async def current_revision(conn: AsyncConnection) -> int:
    """The largest revision of a row or a tombstone."""
    return (await watermark(conn)).revision


def unchanged(mark: Watermark, since: int) -> bool:
    """Whether nothing is to be read after revision ``since``: the watermark has not moved and a
    row read then is still there (an empty table is read again: a TRUNCATE may have emptied it)."""
    return mark.revision == since and mark.oldest is not None and mark.oldest <= since


async def peek(engine: AsyncEngine) -> Watermark:
    """:func:`watermark` in the fewest round trips: what a sync that finds nothing changed
    costs, and what the MariaDB/MySQL poller asks every second. On PostgreSQL outside a
    transaction (one round trip, where BEGIN, the read and ROLLBACK are three), on the driver's
    own connection (asyncpg runs it in autocommit; SQLAlchemy's execution of it cost as much
    CPU again as the round trip, and a manager at rest peeks twice a minute); on MariaDB/MySQL
    in the implicit transaction of the read (the read and ROLLBACK: switching the session to
    autocommit and back would add two ``SET autocommit`` round trips)."""
    async with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            return _mark(await driver.fetchrow(_watermark_pg()))
        return await watermark(conn)


async def changes_since(conn: AsyncConnection, since: int) -> Changes | None:
    """None (one indexed query) when nothing changed after revision ``since``; else the watermark
    and the tombstones since. The rows written since are read with :func:`rows_since`.

    ``full`` when only a full read tells what is there: a TRUNCATE's tombstone (PostgreSQL), or
    rows gone without one (a TRUNCATE on MariaDB/MySQL): no row read at ``since`` is left, or
    the watermark went back. A table that stays empty is read in full at each sync then (a read
    of no row)."""
    mark = await watermark(conn)
    if unchanged(mark, since):
        return None
    revision = mark.revision
    if revision < since or mark.oldest is None or mark.oldest > since:
        return Changes(revision, full=True)
    deleted = (
        (
            await conn.execute(
                select(deleted_jobs_table.c.id).where(deleted_jobs_table.c.revision > since)
            )
        )
        .scalars()
        .all()
    )
    if 0 in deleted:  # TRUNCATE: no tombstone per row, read everything
        return Changes(revision, full=True)
    return Changes(revision, deleted)


def rows_since(columns: Sequence[ColumnElement[Any]]) -> Select[Any]:
    """``columns`` of the rows written after the revision bound as ``since``, by id."""
    t = jobs_table.c
    return select(*columns).where(t.revision > bindparam("since")).order_by(t.id)


async def read_rows(conn: AsyncConnection, since: int | None = None) -> list[Any]:
    """Every row, raw (:func:`periodic_manager.db.rows.columns`, without what only people read),
    or only those written after revision ``since``."""
    columns = dbrows.columns(reads_bytes(conn))
    if since is None:
        return list(await conn.execute(select(*columns)))
    return list(await conn.execute(rows_since(columns), {"since": since}))


async def stream_rows(conn: AsyncConnection, partition: int = 1000) -> AsyncIterator[Sequence[Any]]:
    """Every row, raw, as :func:`read_rows` reads them, in partitions of ``partition`` rows
    fetched one after the other: a reader that keeps only what it makes of each row (the
    dashboard's order) never holds every row's payload at once."""
    columns = dbrows.columns(reads_bytes(conn))
    result = await conn.stream(select(*columns).execution_options(yield_per=partition))
    async for part in result.partitions():
        yield part


async def prune_tombstones(engine: AsyncEngine, older_than: datetime) -> int:
    """Delete tombstones older than ``older_than`` (a full read makes up for any pruned)."""
    async with engine.begin() as conn:
        result = await conn.execute(
            delete(deleted_jobs_table).where(deleted_jobs_table.c.deleted_at < older_than)
        )
    return int(result.rowcount or 0)
