"""The dashboard's schedule list: filtered in SQL, sorted by next slot in Python.

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

from sqlalchemy import ColumnElement, String, and_, case, cast, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from periodic_manager import cron
from periodic_manager.db import judge as dbjudge
from periodic_manager.db import rows as dbrows
from periodic_manager.db import view as dbview
from periodic_manager.db.models import Entry, Manager, PeriodicJob, Run
from periodic_manager.schedules.describe import describe
from periodic_manager.schedules.rules import DEFAULT_QUEUE

from ..rows import read_rows
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

    def get(self, spec: Any, tz: Any, anchor: datetime | None, now: datetime) -> datetime | str:
        """The next slot after ``now`` (UTC), or the reason it cannot be computed."""
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


def error_entries(cutoff: datetime) -> Any:
    """Schedule keys (with the reason) that a live manager rejected."""
    return (
        select(Entry.schedule_key, Entry.last_error)
        .join(Manager, Manager.manager_id == Entry.manager_id)
        .where(Entry.status == "error", Manager.heartbeat_at >= cutoff)
    )


def conditions(
    session: AsyncSession,
    *,
    cutoff: datetime,
    name_prefix: str | None,
    task_type: str | None,
    queue: str | None,
    enabled: bool | None,
    in_error: bool | None,
) -> list[ColumnElement[bool]]:
    """The SQL conditions of the list's filters (none when no filter is set)."""
    conds: list[ColumnElement[bool]] = []
    if enabled is not None:  # as judged: a row whose `enabled` is neither matches neither
        conds.append(dbrows.enabled_is(_is_sqlite(session), enabled))
    if task_type:
        conds.append(PeriodicJob.task_type == task_type)
    if queue:
        value = func.coalesce(PeriodicJob.options["queue"].as_string(), DEFAULT_QUEUE)
        if _is_sqlite(session):
            # Rows written with SQL may hold text that is not JSON, which json_extract refuses.
            value = case((func.json_valid(PeriodicJob.options) == 1, value), else_=None)
        conds.append(value == queue)
    if name_prefix:
        # substr rather than LIKE: exact and case-sensitive on both databases, no escaping.
        conds.append(func.substr(PeriodicJob.name, 1, len(name_prefix)) == name_prefix)
    if in_error is not None:
        rejected = cast(PeriodicJob.id, String).in_(
            error_entries(cutoff).with_only_columns(Entry.schedule_key)
        )
        conds.append(rejected if in_error else ~rejected)
    return conds


def _is_sqlite(session: AsyncSession) -> bool:
    return session.bind is not None and session.bind.dialect.name == "sqlite"


async def page_rows(
    session: AsyncSession,
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
    raws = await read_rows(session, PeriodicJob.id.in_(ids))
    rows = {raw[0]: dbview.view(rules, raw) for raw in raws}
    keys = [str(i) for i in ids]
    errors: dict[str, str] = {}
    for key, message in await session.execute(
        error_entries(cutoff).where(Entry.schedule_key.in_(keys)).order_by(Entry.manager_id)
    ):
        errors.setdefault(key, message or "rejected by the manager")
    last = await last_runs(session, keys)
    out: list[ScheduleRowView] = []
    for row_id in ids:
        row = rows.get(row_id)
        if row is None:  # deleted between the two reads
            continue
        key = str(row_id)
        v = row.values
        error = errors.get(key) or (
            f"{row.errors[0][0]}: {row.errors[0][1]}" if row.errors else None
        )
        nxt: LocalTime | None = None
        if row.enabled and row.usable:
            slot = slots.get(v["spec"], v["timezone"], v["anchor"], now)
            if isinstance(slot, str):
                error = error or slot
            else:
                nxt = local_time(slot, v["timezone"])
        out.append(
            ScheduleRowView(
                id=row.id,
                name=str(v["name"] or ""),
                spec=str(v["spec"] or ""),
                description=describe_spec(v["spec"]) if isinstance(v["spec"], str) else None,
                timezone=str(v["timezone"] or ""),
                task_type=str(v["task_type"] or ""),
                queue=queue_of(v["options"]) if row.usable else None,
                enabled=row.enabled,
                next=nxt,
                last_run=last.get(key),
                error=error,
            )
        )
    return out


async def last_runs(session: AsyncSession, keys: Sequence[str]) -> dict[str, LastRun]:
    """The newest history row (by slot) of each key."""
    newest = (
        select(Run.schedule_key, func.max(Run.slot_at).label("slot_at"))
        .where(Run.schedule_key.in_(keys))
        .group_by(Run.schedule_key)
        .subquery()
    )
    stmt = (
        select(Run)
        .join(
            newest,
            and_(Run.schedule_key == newest.c.schedule_key, Run.slot_at == newest.c.slot_at),
        )
        .order_by(Run.id)
    )
    out: dict[str, LastRun] = {}
    for run in (await session.execute(stmt)).scalars():  # ties on a slot: the newest row wins
        out[run.schedule_key] = LastRun(
            status=run.status, slot_at=run.slot_at, at=run.at, lateness_ms=run.lateness_ms
        )
    return out
