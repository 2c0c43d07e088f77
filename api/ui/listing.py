"""The dashboard's schedule list: filtered in SQL (``periodic_manager.db.schedule_reader``), sorted
by next slot in Python.

Sorting by next slot cannot be done by the database (the slot is a function of spec, zone and
anchor): :mod:`api.ui.order` keeps every row's place in that order and brings it up to date by
what changed; a filter is a SQL query for the matching ids, applied to that order. The cron engine
shares one parsed schedule per (spec, zone, anchor) and answers in microseconds; :class:`NextSlots`
also remembers each triple's answer until that slot passes. The page's own rows are then read in
full with their last run and the errors live managers reported (``bench/ui_bench.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from periodic_manager import cron
from periodic_manager.db import history, schedule_reader, store_reads
from periodic_manager.db import judge as dbjudge
from periodic_manager.db import view as dbview
from periodic_manager.db.engine import Connection
from periodic_manager.schedules import bounds as slot_bounds
from periodic_manager.schedules import runs as slot_runs
from periodic_manager.schedules import slots as slot_rule
from periodic_manager.schedules.describe import describe
from periodic_manager.schedules.rules import DEFAULT_QUEUE

from ..ui.models import LastRun, LocalTime, ScheduleRowView

# What a stored row (possibly written with SQL) can raise while its slots are computed.
SLOT_ERRORS = (ValueError, TypeError, ArithmeticError, LookupError, OverflowError)
_CACHE_MAX = 200_000
_NEVER = datetime.max.replace(tzinfo=UTC)


class NextSlots:
    """Next slot per (spec, zone, anchor), valid from the instant it was computed after until
    the slot itself: for any ``now`` in ``[after, slot)`` the next slot is the same."""

    def __init__(self) -> None:
        self._known: dict[tuple[Any, Any, Any], tuple[datetime, datetime | str]] = {}

    def get(
        self,
        spec: Any,
        tz: Any,
        anchor: datetime | None,
        now: datetime,
        bounds: slot_bounds.Bounds = slot_bounds.NO_BOUNDS,
    ) -> datetime | str | None:
        """The next slot after ``now`` (UTC) within ``bounds`` (a row's options.start_at and
        options.end_at, applied outside the memo, which is shared by every row of the triple),
        None when the schedule has ended, or the reason it cannot be computed."""
        if bounds is not slot_bounds.NO_BOUNDS:
            slot = self._get(spec, tz, anchor, slot_rule.floor_of(now, bounds))
            if isinstance(slot, datetime) and slot_rule.ended(slot, bounds):
                return None
            return slot
        return self._get(spec, tz, anchor, now)

    def _get(self, spec: Any, tz: Any, anchor: datetime | None, now: datetime) -> datetime | str:
        key = (spec, tz, anchor)
        known = self._known.get(key)
        if known is not None:
            after, slot = known
            if isinstance(slot, str) or (after <= now < slot):
                return slot
        try:
            answer: datetime | str = (
                cron.parse(spec, tz=tz, anchor=anchor).next_after(now).astimezone(UTC)
            )
        except SLOT_ERRORS as exc:
            answer = str(exc) or type(exc).__name__
        if len(self._known) >= _CACHE_MAX:
            self._known.clear()
        self._known[key] = (now, answer)
        return answer


@lru_cache(maxsize=4096)
def describe_spec(spec: str) -> str | None:
    try:
        cron.validate(spec)
    except SLOT_ERRORS:
        return None
    return describe(spec)


def queue_of(options: Any) -> str | None:
    if not isinstance(options, dict):
        return None
    queue = options.get("queue", DEFAULT_QUEUE)
    return queue if isinstance(queue, str) else None


@lru_cache(maxsize=1024)
def zone_info(tz: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(tz)
    except (ValueError, OSError, ZoneInfoNotFoundError):
        return None


def local_time(at: datetime, tz: Any) -> LocalTime:
    """``at`` in zone ``tz`` (in UTC if the zone is unusable)."""
    zone = zone_info(tz) if isinstance(tz, str) else None
    local = at.astimezone(zone) if zone is not None else at
    return LocalTime(at=at, local=local.isoformat(), abbreviation=local.tzname())


async def page_rows(
    conn: Connection,
    ids: Sequence[int],
    now: datetime,
    cutoff: datetime,
    slots: NextSlots,
    rules: dbjudge.Rules,
) -> list[ScheduleRowView]:
    """The rows of ``ids`` in that order, with next slot, last run and error."""
    if not ids:
        return []
    # Read raw and judged as the manager judges them (a row written with SQL may hold anything).
    raws = await schedule_reader.rows_of(conn, ids)
    rows = {raw[0]: dbview.view(rules, raw) for raw in raws}
    keys = [str(i) for i in ids]
    errors: dict[str, str] = {}
    for key, message in await store_reads.rejections(conn, keys, cutoff):
        errors.setdefault(key, message or "rejected by the manager")
    last = {
        key: LastRun(status=run.status, slot_at=run.slot_at, at=run.at, lateness_ms=run.lateness_ms)
        for key, run in (await history.last_runs(conn, keys)).items()
    }
    # options.max_runs: the runs the managers recorded, for rows that have it.
    limited = [
        str(i)
        for i, r in rows.items()
        if r.config is not None and slot_runs.max_runs_of(r.config.options)
    ]
    counted = {k: st.runs for k, st in (await store_reads.states(conn, limited)).items()}
    out: list[ScheduleRowView] = []
    for row_id in ids:
        row = rows.get(row_id)
        if row is None:  # deleted between the two reads
            continue
        key = str(row_id)
        v = row.values
        limit = slot_runs.max_runs_of(row.config.options) if row.config is not None else None
        error = errors.get(key) or (
            f"{row.errors[0][0]}: {row.errors[0][1]}" if row.errors else None
        )
        nxt: LocalTime | None = None
        status = "paused" if row.enabled is False else "active" if row.usable else "error"
        if row.enabled and row.usable and row.config is not None:
            bounds = slot_bounds.bounds_of(row.config.options)
            slot = slots.get(v["spec"], v["timezone"], v["anchor"], now, bounds)
            if row.config.exclusion is not None and isinstance(slot, datetime):
                # options.exclude: the next slot that is sent (the rows that set it pay for it)
                sent = slot_rule.Rule.of(row.config).next_sent(now)
                slot = "" if sent is None else sent  # "": the next 10,000 slots are all excluded
            if slot == "":
                pass  # active, no slot to show
            elif isinstance(slot, str):
                error = error or slot
                status = "error"
            elif slot is None or (
                limit is not None and slot_runs.runs_left(limit, counted.get(key, 0)) == 0
            ):
                status = "ended"
            else:
                nxt = local_time(slot, v["timezone"])
        out.append(_row_view(row, status, nxt, last.get(key), error))
    return out


def _row_view(
    row: dbview.RowView,
    status: str,
    nxt: LocalTime | None,
    last_run: LastRun | None,
    error: str | None,
) -> ScheduleRowView:
    """A row of the list as the page shows it: its stored text as read, whatever it holds."""
    v = row.values
    return ScheduleRowView(
        id=row.id,
        name=str(v["name"] or ""),
        spec=str(v["spec"] or ""),
        description=describe_spec(v["spec"]) if isinstance(v["spec"], str) else None,
        timezone=str(v["timezone"] or ""),
        task_type=str(v["task_type"] or ""),
        queue=queue_of(v["options"]) if row.usable else None,
        enabled=row.enabled,
        next=nxt,
        status=status,
        last_run=last_run,
        error=error,
    )
