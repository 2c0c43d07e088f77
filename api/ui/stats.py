"""The overview's numbers: schedule counts, the last hour of run history per minute, lateness.

Everything is aggregated by the database (``pm_runs`` is indexed on ``at``), so the cost grows with
the number of runs in the hour, not with the table; only 60 x 5 counts and three ranks come back.
Percentiles are nearest-rank (the value at rank ceil(p * n)), exact on both databases, from one
sorted pass (``row_number()``; SQLite has no percentile function).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Integer, String, case, cast, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from api.ui.listing import error_entries
from api.ui.models import Counts, Lateness, ManagerSummary, SeriesPoint
from periodic_manager.db.models import Entry, Manager, PeriodicJob, Run

WINDOW_MINUTES = 60
STATUSES = ("enqueued", "skipped", "failed", "duplicate", "triggered")
PERCENTILES = (0.5, 0.9, 0.99)


def window_start(now: datetime) -> datetime:
    """The start of the oldest of 60 one-minute buckets; the newest holds ``now``."""
    minute = now.astimezone(UTC).replace(second=0, microsecond=0)
    return minute - timedelta(minutes=WINDOW_MINUTES - 1)


async def counts(session: AsyncSession, cutoff: datetime) -> Counts:
    total, enabled = (
        await session.execute(
            select(
                func.count(), func.coalesce(func.sum(case((PeriodicJob.enabled, 1), else_=0)), 0)
            )
        )
    ).one()
    rejected = error_entries(cutoff).with_only_columns(Entry.schedule_key)
    in_error = (
        await session.execute(
            select(func.count()).where(cast(PeriodicJob.id, String).in_(rejected))
        )
    ).scalar_one()
    return Counts(
        schedules=total, enabled=int(enabled), paused=total - int(enabled), in_error=in_error
    )


def _epoch_seconds(session: AsyncSession, column: Any) -> Any:
    if session.bind is not None and session.bind.dialect.name == "sqlite":
        # Instants are stored as UTC text there; strftime('%s') reads it as UTC.
        return cast(func.strftime("%s", column), Integer)
    return func.floor(func.extract("epoch", column))


async def series(session: AsyncSession, start: datetime) -> list[SeriesPoint]:
    end = start + timedelta(minutes=WINDOW_MINUTES)
    start_s = int(start.timestamp())
    bucket = func.floor((_epoch_seconds(session, Run.at) - start_s) / 60.0).label("bucket")
    stmt = (
        select(bucket, Run.status, func.count())
        .where(Run.at >= start, Run.at < end)
        .group_by(bucket, Run.status)
    )
    grid: list[dict[str, int]] = [dict.fromkeys(STATUSES, 0) for _ in range(WINDOW_MINUTES)]
    for index, status, n in await session.execute(stmt):
        i = int(index)
        if 0 <= i < WINDOW_MINUTES and status in grid[i]:
            grid[i][status] += int(n)
    return [
        SeriesPoint(start_at=start + timedelta(minutes=i), **cells) for i, cells in enumerate(grid)
    ]


async def lateness(session: AsyncSession, start: datetime) -> Lateness:
    where = (Run.status == "enqueued", Run.at >= start)
    n, worst = (
        await session.execute(select(func.count(), func.max(Run.lateness_ms)).where(*where))
    ).one()
    if not n:
        return Lateness(count=0, p50_ms=None, p90_ms=None, p99_ms=None, max_ms=None)
    ranks = [max(1, math.ceil(p * n)) for p in PERCENTILES]
    ranked = (
        select(Run.lateness_ms, func.row_number().over(order_by=Run.lateness_ms).label("rank"))
        .where(*where)
        .subquery()
    )
    stmt = select(ranked.c.rank, ranked.c.lateness_ms).where(ranked.c.rank.in_(ranks))
    found = {rank: value for rank, value in await session.execute(stmt)}
    p50, p90, p99 = (found.get(r) for r in ranks)
    return Lateness(count=n, p50_ms=p50, p90_ms=p90, p99_ms=p99, max_ms=worst)


async def managers(session: AsyncSession, cutoff: datetime) -> ManagerSummary:
    rows = (
        await session.execute(
            select(Manager.manager_id, Manager.is_leader).where(Manager.heartbeat_at >= cutoff)
        )
    ).all()
    leader = next((m for m, is_leader in sorted(rows) if is_leader), None)
    return ManagerSummary(live=len(rows), leader=leader)
