"""The overview's numbers: schedule counts, the last hour of run history per minute, lateness.

Everything is aggregated by the database (``periodic_manager.db.stats``; ``pm_runs`` is indexed on
``at``), so the cost grows with the number of runs in the hour, not with the table: a count per
minute and status comes back (at most 60 x 5), and the lateness distribution of the newest 10,000
enqueued slots as (value, count) pairs. Percentiles are nearest-rank (the value at rank
ceil(p * n)), exact over those slots on both databases (SQLite has no percentile function).

The numbers are those of the run history: a schedule firing more often than
``PM_RUNS_MAX_PER_SCHEDULE`` times an hour keeps only its newest rows, so fewer of its slots show.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from periodic_manager.db import stats, store_reads
from periodic_manager.db.engine import Connection

from ..ui.models import Counts, Lateness, ManagerSummary, SeriesPoint

WINDOW_MINUTES = 60
STATUSES = (
    "enqueued",
    "skipped",
    "held",
    "failed",
    "duplicate",
    "resent",
    "triggered",
    "backfilled",
)
PERCENTILES = (0.5, 0.9, 0.99)
LATENESS_SAMPLE = 10_000


def window_start(now: datetime) -> datetime:
    """The start of the oldest of 60 one-minute buckets; the newest holds ``now``."""
    minute = now.astimezone(UTC).replace(second=0, microsecond=0)
    return minute - timedelta(minutes=WINDOW_MINUTES - 1)


async def counts(conn: Connection, cutoff: datetime) -> Counts:
    """Schedules, enabled, paused and in error, each by the condition of the list's filter it
    links to (``enabled=true``, ``enabled=false``, ``in_error=true``): a row whose ``enabled`` is
    neither true nor false is neither enabled nor paused (see ``db.stats.schedule_counts``)."""
    total, on, off, bad = await stats.schedule_counts(conn, cutoff)
    return Counts(schedules=total, enabled=on, paused=off, in_error=bad)


async def series(conn: Connection, start: datetime) -> list[SeriesPoint]:
    """Runs per minute and status: at most 60 x (number of statuses) counts come back."""
    grid: list[dict[str, int]] = [dict.fromkeys(STATUSES, 0) for _ in range(WINDOW_MINUTES)]
    for i, status, n in await stats.runs_per_minute(conn, start, WINDOW_MINUTES):
        if 0 <= i < WINDOW_MINUTES and status in grid[i]:
            grid[i][status] = n
    return [
        SeriesPoint(start_at=start + timedelta(minutes=i), **cells) for i, cells in enumerate(grid)
    ]


async def lateness(conn: Connection, start: datetime) -> Lateness:
    """Nearest-rank percentiles of the newest :data:`LATENESS_SAMPLE` enqueued slots since
    ``start``, exact over them: their distinct lateness values (whole milliseconds) are counted
    by the database. The bound keeps the cost flat however busy the hour was."""
    values = await stats.lateness_counts(conn, start, LATENESS_SAMPLE)
    found = stats.nearest_ranks(values, PERCENTILES)
    if not found:
        return Lateness(count=0, p50_ms=None, p90_ms=None, p99_ms=None, max_ms=None)
    p50, p90, p99 = found
    total = sum(n for _, n in values)
    return Lateness(count=total, p50_ms=p50, p90_ms=p90, p99_ms=p99, max_ms=values[-1][0])


async def managers(conn: Connection, cutoff: datetime) -> ManagerSummary:
    live = await store_reads.live_managers(conn, cutoff)
    leaders = sorted(m.info.manager_id for m in live if m.status.is_leader)
    return ManagerSummary(live=len(live), leader=leaders[0] if leaders else None)
