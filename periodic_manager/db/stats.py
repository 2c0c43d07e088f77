"""The numbers of the dashboard's overview and of the API's metrics, aggregated by the database:
schedule counts, run history per minute, the distribution of lateness; and one schedule's
history counted by status, reason and lateness (``GET /schedules/{id}/stats``).

``pm_runs`` is indexed on ``at``, so the cost grows with the number of runs in the window, not
with the table: a count per minute and status comes back (at most minutes x statuses), and the
lateness of the newest enqueued slots as (value, count) pairs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import String, bindparam, case, cast, func, literal_column, select, union_all
from sqlalchemy.ext.asyncio import AsyncConnection

from periodic_manager.db import rows as dbrows
from periodic_manager.db.engine import reads_bytes
from periodic_manager.db.models import entries_table, jobs_table, runs_table
from periodic_manager.db.store_reads import rejected


async def schedule_counts(
    conn: AsyncConnection, alive_after: datetime
) -> tuple[int, int, int, int]:
    """Schedules, enabled, paused and in error, in one statement, each by the condition of the
    list's filter it links to (``enabled=true``, ``enabled=false``, ``in_error=true``). A row whose
    ``enabled`` is neither true nor false (SQL wrote ``'yes'``) is neither enabled nor paused: it
    is a row error, "in error" once a live manager reports it."""
    rejected_keys = rejected(alive_after).with_only_columns(entries_table.c.schedule_key)
    in_error = (
        select(func.count())
        .select_from(jobs_table)
        .where(cast(jobs_table.c.id, String).in_(rejected_keys))
        .scalar_subquery()
    )
    sqlite = reads_bytes(conn)
    total, on, off, bad = (
        await conn.execute(
            select(func.count(), _tally(sqlite, True), _tally(sqlite, False), in_error).select_from(
                jobs_table
            )
        )
    ).one()
    return int(total), int(on), int(off), int(bad)


async def enabled_counts(conn: AsyncConnection) -> dict[bool, int]:
    """Rows of ``periodic_jobs`` whose ``enabled`` is judged true, and false (as the list's
    ``enabled`` filter counts them): a row whose ``enabled`` is neither (SQL wrote ``'yes'`` or
    2 on SQLite) is in neither count."""
    sqlite = reads_bytes(conn)
    on, off = (
        await conn.execute(
            select(_tally(sqlite, True), _tally(sqlite, False)).select_from(jobs_table)
        )
    ).one()
    return {True: int(on), False: int(off)}


def _tally(sqlite: bool, enabled: bool) -> Any:
    """How many rows have ``enabled`` judged ``enabled``."""
    return func.coalesce(func.sum(case((dbrows.enabled_is(sqlite, enabled), 1), else_=0)), 0)


@lru_cache(maxsize=4)
def _per_minute_sqlite(minutes: int) -> Any:
    """One index range per minute (UNION ALL), each counted by status: SQLite then reads the runs
    in index order and sorts nothing (grouping the window by a computed minute made it sort every
    run: 1.4x slower). Built once: making 60 selects cost more than running them; the bounds are
    the parameters ``b0`` .. ``b<minutes>``."""
    return union_all(
        *(
            select(literal_column(str(i)), runs_table.c.status, func.count())
            .where(runs_table.c.at >= bindparam(f"b{i}"), runs_table.c.at < bindparam(f"b{i + 1}"))
            .group_by(runs_table.c.status)
            for i in range(minutes)
        )
    )


def _per_minute_postgres(start: datetime, minutes: int, version: tuple[Any, ...]) -> Any:
    """Grouped by minute and status, counted (PostgreSQL aggregates by hash; 60 range scans were
    1.4x slower). ``date_bin`` (PostgreSQL 14) cuts the minute 1.6x cheaper than ``date_trunc``,
    which converts every instant to the session's zone; both give the same UTC minutes."""
    since = bindparam("start", start, type_=runs_table.c.at.type)
    if version >= (14,):
        minute = func.date_bin(literal_column("interval '1 minute'"), runs_table.c.at, since)
    else:
        minute = func.date_trunc("minute", runs_table.c.at)
    end = start + timedelta(minutes=minutes)
    return (
        select(minute, runs_table.c.status, func.count())
        .where(runs_table.c.at >= since, runs_table.c.at < end)
        .group_by(minute, runs_table.c.status)
    )


async def runs_per_minute(
    conn: AsyncConnection, start: datetime, minutes: int
) -> list[tuple[int, str, int]]:
    """(minute, status, runs) of the history in the ``minutes`` one-minute buckets from
    ``start``: the bucket's index from 0, and only the buckets and statuses that have runs."""
    dialect = conn.dialect
    if reads_bytes(conn):
        bounds = {f"b{i}": start + timedelta(minutes=i) for i in range(minutes + 1)}
        result = await conn.execute(_per_minute_sqlite(minutes), bounds)
    else:
        version = tuple(dialect.server_version_info or (0,))
        result = await conn.execute(_per_minute_postgres(start, minutes, version))
    out: list[tuple[int, str, int]] = []
    for first, status, n in result:
        # the bucket's index (SQLite) or the minute (PostgreSQL)
        i = first if isinstance(first, int) else int((first - start).total_seconds() // 60)
        out.append((i, status, int(n)))
    return out


async def lateness_counts(
    conn: AsyncConnection, start: datetime, sample: int
) -> list[tuple[int, int]]:
    """The lateness of the newest ``sample`` enqueued slots since ``start``: each distinct value
    (whole milliseconds) with how many slots had it, smallest first. The bound keeps the cost
    flat however busy the window was."""
    newest = (
        select(runs_table.c.lateness_ms)
        .where(runs_table.c.status == "enqueued", runs_table.c.at >= start)
        .order_by(runs_table.c.at.desc())
        .limit(sample)
        .subquery()
    )
    stmt = (
        select(newest.c.lateness_ms, func.count())
        .group_by(newest.c.lateness_ms)
        .order_by(newest.c.lateness_ms)
    )
    # Decoded per value: SQL may have written 'many' or 1e400 there (SQLite), which is no
    # lateness at all and is left out.
    found: dict[int, int] = {}
    for v, n in await conn.execute(stmt):
        value = dbrows.int_of(v)
        if value is not None:
            found[value] = found.get(value, 0) + int(n)
    return sorted(found.items())


def nearest_ranks(counts: Sequence[tuple[int, int]], percentiles: Iterable[float]) -> list[int]:
    """Nearest-rank percentiles (the value at rank ceil(p * n), p ascending) of a distribution
    given as (value, how many) pairs, smallest value first; empty when it has no value."""
    total = sum(n for _, n in counts)
    if not total:
        return []
    found: list[int] = []
    ranks = iter(max(1, math.ceil(p * total)) for p in percentiles)
    rank: int | None = next(ranks, None)
    seen = 0
    for value, n in counts:
        seen += n
        while rank is not None and seen >= rank:
            found.append(value)
            rank = next(ranks, None)
    return found


@dataclass(frozen=True, slots=True)
class RunTally:
    """How many runs of one schedule had this status, reason and lateness, and whether they
    are in the recent window (values decoded: None when NULL or unreadable)."""

    recent: bool
    status: str | None
    reason: str | None
    lateness_ms: int | None
    count: int


async def schedule_tallies(
    conn: AsyncConnection, schedule_key: str, since: datetime, recent_since: datetime, sample: int
) -> list[RunTally]:
    """The newest ``sample`` runs of a schedule handled at or after ``since`` (``at``), counted
    by status, reason, lateness and whether they were handled at or after ``recent_since``. The
    rows are the schedule's (index on ``schedule_key``), so the cost is bounded by its history
    cap and by ``sample``; percentiles are left to :func:`nearest_ranks` (portable)."""
    sqlite = reads_bytes(conn)
    c = runs_table.c
    newest = (
        select(
            dbrows.raw(sqlite, c.status).label("status"),
            dbrows.raw(sqlite, c.reason).label("reason"),
            dbrows.raw(sqlite, c.lateness_ms).label("lateness_ms"),
            case((c.at >= recent_since, 1), else_=0).label("recent"),
        )
        .where(c.schedule_key == schedule_key, c.at >= since)
        .order_by(c.at.desc(), c.id.desc())
        .limit(sample)
        .subquery()
    )
    cols = (newest.c.recent, newest.c.status, newest.c.reason, newest.c.lateness_ms)
    stmt = select(*cols, func.count()).group_by(*cols)
    return [
        RunTally(
            recent=bool(dbrows.int_of(recent)),
            status=dbrows.text_of(status),
            reason=dbrows.text_of(reason),
            lateness_ms=dbrows.int_of(lateness),
            count=int(n),
        )
        for recent, status, reason, lateness, n in await conn.execute(stmt)
    ]


@dataclass(frozen=True, slots=True)
class LateRun:
    """A run of the history (values decoded: None when NULL or unreadable)."""

    slot_at: datetime | None
    at: datetime | None
    status: str | None
    reason: str | None
    lateness_ms: int | None
    error: str | None


async def newest_with_reason(
    conn: AsyncConnection, schedule_key: str, reasons: Iterable[str]
) -> LateRun | None:
    """The schedule's newest run (by ``at``) whose reason is one of ``reasons``, if any."""
    sqlite = reads_bytes(conn)
    c = runs_table.c
    stmt = (
        select(
            *(
                dbrows.raw(sqlite, col)
                for col in (c.slot_at, c.at, c.status, c.reason, c.lateness_ms, c.error)
            )
        )
        .where(c.schedule_key == schedule_key, c.reason.in_(list(reasons)))
        .order_by(c.at.desc(), c.id.desc())
        .limit(1)
    )
    found = (await conn.execute(stmt)).first()
    if found is None:
        return None
    slot_at, at, status, reason, lateness, error = found
    return LateRun(
        slot_at=dbrows.instant_or_none(sqlite, slot_at),
        at=dbrows.instant_or_none(sqlite, at),
        status=dbrows.text_of(status),
        reason=dbrows.text_of(reason),
        lateness_ms=dbrows.int_of(lateness),
        error=dbrows.text_of(error),
    )
