"""``/views``: read-only JSON shaped for the dashboard (``/ui``), documented like the rest.

The public endpoints stay the way to read and write schedules; these add what a page needs in
one request and the public API does not offer: the schedule list sorted by next slot with last
run and error badge, the next slots with daylight-saving changes marked, the overview's counts,
last-hour series and lateness percentiles, managers with their entry counts, and whether the
caller's token may write (and its scope).
"""

from __future__ import annotations

import asyncio
import re
from functools import lru_cache
from typing import Annotated, Any, Literal
from zoneinfo import available_timezones

from fastapi import APIRouter, Path, Query, Request

from periodic_manager.access import Scope
from periodic_manager.db import partitions, schedule_reader, store_reads
from periodic_manager.db import view as dbview
from periodic_manager.schedules import bounds as slot_bounds
from periodic_manager.schedules.partition import ranges_text

from ..deps import Conn, LiveAfter, Now, Page, get_state
from ..errors import ScheduleNotFound
from ..rows import rules as row_rules
from ..rows import runs_left
from ..runtime import manager_fields, runs_counted
from ..schemas import NoNul
from ..scopes import OPEN_GRANT, grant_of
from ..ui import listing, stats
from ..ui.models import (
    Counts,
    EntryView,
    EntryViewPage,
    Lateness,
    ManagerSummary,
    ManagerView,
    ManagerViewList,
    Overview,
    ScheduleRowPage,
    SeriesPoint,
    SlotList,
    SlotView,
    WhoAmI,
)
from ..ui.slots import marked_slots

router = APIRouter(prefix="/views", tags=["views"])

# Filters reach the database: NUL refused with a 422, as /schedules refuses it (schemas.NoNul).
Text = Annotated[str | None, Query(max_length=200), NoNul]
DIGITS = re.compile(r"[0-9]{1,18}")  # a schedule key that is a row id (str.isdigit takes more)
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "No such schedule"}}


@router.get("/whoami", response_model=WhoAmI, summary="Who this caller is: scope, may it write")
async def whoami(request: Request) -> WhoAmI:
    # The auth middleware let this request through and said who it is (api/scopes.Grant).
    grant = grant_of(request.scope) or OPEN_GRANT
    return WhoAmI(
        auth=grant.via != OPEN_GRANT.via,
        can_write=grant.scope.allows(Scope.WRITE),
        scope=grant.scope.value,
        key=grant.key_name,
    )


@router.get(
    "/schedules",
    response_model=ScheduleRowPage,
    summary="Schedules with next slot, last run and error (by default sorted by next slot)",
)
async def schedule_rows(
    request: Request,
    conn: Conn,
    now: Now,
    cutoff: LiveAfter,
    paging: Page,
    sort: Annotated[
        Literal["next", "name", "id"],
        Query(description="`next`: next slot first, then unusable rows, then paused ones"),
    ] = "next",
    name_prefix: Text = None,
    task_type: Text = None,
    queue: Annotated[str | None, Query(max_length=100), NoNul] = None,
    enabled: bool | None = None,
    in_error: Annotated[bool | None, Query(description="rejected by a live manager")] = None,
) -> ScheduleRowPage:
    filters = schedule_reader.Filters(
        enabled=enabled,
        task_type=task_type or None,  # an empty filter filters nothing here
        queue=queue or None,
        name_prefix=name_prefix,
        in_error=in_error,
        alive_after=cutoff,
    )
    state = get_state(request)
    if sort == "next":
        keys = await state.order.snapshot(conn, now, await row_rules(request, conn))
        ordered = [key[3] for key in keys]
        if filters.active:
            wanted = await schedule_reader.matching_ids(conn, filters)
            ordered = [row_id for row_id in ordered if row_id in wanted]
        total, ids = len(ordered), ordered[paging.offset : paging.offset + paging.limit]
    else:
        total = await schedule_reader.count(conn, filters)
        ids = await schedule_reader.page_ids(conn, filters, by=sort, **paging._asdict())
    items = await listing.page_rows(
        conn, ids, now, cutoff, state.next_slots, await row_rules(request, conn)
    )
    return ScheduleRowPage(items=items, total=total, **paging._asdict(), sort=sort, now=now)


@router.get(
    "/schedules/{schedule_id}/slots",
    response_model=SlotList,
    responses=NOT_FOUND,
    summary="The next slots of a schedule in its zone, daylight-saving changes marked",
)
async def schedule_slots(
    schedule_id: Annotated[int, Path(ge=1, le=2**63 - 1, description="the row id")],
    request: Request,
    conn: Conn,
    now: Now,
    n: Annotated[int, Query(ge=1, le=100)] = 10,
) -> SlotList:
    raw = await schedule_reader.row(conn, schedule_id)
    if raw is None:
        raise ScheduleNotFound(schedule_id)
    # Read raw and judged as the manager judges it: a row written with SQL may hold anything.
    row = dbview.view(await row_rules(request, conn), raw)
    v = row.values
    error: str | None = None
    views: list[SlotView] = []
    bounds = slot_bounds.NO_BOUNDS
    try:
        if not row.usable or row.config is None:
            field, reason = row.errors[0]
            raise ValueError(f"{field}: {reason}")
        bounds = slot_bounds.bounds_of(row.config.options)
        # options.max_runs: no slot past the last run (as next_runs and the engine); an excluded
        # slot (options.exclude: shown, marked) is no run.
        left = runs_left(row, await runs_counted(conn, str(row.id)))
        exclusion = row.config.exclusion
        for slot in marked_slots(
            v["spec"], v["timezone"], v["anchor"], now, n, bounds, exclusion, left
        ):
            views.append(
                SlotView(
                    at=slot.at,
                    local=slot.local.isoformat(),
                    abbreviation=slot.local.tzname(),
                    marks=slot.marks,
                    notes=slot.notes,
                )
            )
    except listing.SLOT_ERRORS as exc:
        error = str(exc) or type(exc).__name__
    return SlotList(
        schedule_id=row.id,
        spec=str(v["spec"] or ""),
        timezone=str(v["timezone"] or ""),
        description=listing.describe_spec(v["spec"]) if isinstance(v["spec"], str) else None,
        enabled=row.enabled is True,
        start_at=bounds.start_at,
        end_at=bounds.end_at,
        slots=views,
        error=error,
    )


@router.get("/overview", response_model=Overview, summary="Counts, last hour of runs, lateness")
async def overview(request: Request, conn: Conn, now: Now, cutoff: LiveAfter) -> Overview:
    start = stats.window_start(now)

    async def series() -> list[SeriesPoint]:
        # The per-minute counts read every run of the hour: on a connection of their own, they
        # run while the other three numbers are read (each statement sees its own snapshot
        # either way: read committed on PostgreSQL, a SELECT opens no transaction on SQLite).
        async with get_state(request).database.connect() as own:
            return await stats.series(own, start)

    async def rest() -> tuple[Counts, Lateness, ManagerSummary]:
        return (
            await stats.counts(conn, cutoff),
            await stats.lateness(conn, start),
            await stats.managers(conn, cutoff),
        )

    points, (counts, lateness, managers) = await asyncio.gather(series(), rest())
    return Overview(
        now=now,
        counts=counts,
        window_start_at=start,
        series=points,
        lateness=lateness,
        managers=managers,
    )


@router.get(
    "/managers",
    response_model=ManagerViewList,
    summary="Live managers (leader first) with their entries by status",
)
async def managers(conn: Conn, now: Now, cutoff: LiveAfter) -> ManagerViewList:
    live = await store_reads.live_managers(conn, cutoff)
    tally = await store_reads.entry_tallies(conn, [m.info.manager_id for m in live])
    held = await partitions.holders(conn)
    items = [
        ManagerView(
            **manager_fields(m, now, held),
            partition_ranges=ranges_text(held.get(m.info.manager_id, [])),
            entries_active=tally.get(m.info.manager_id, (0, 0))[0],
            entries_error=tally.get(m.info.manager_id, (0, 0))[1],
        )
        for m in live
    ]
    return ManagerViewList(now=now, items=items)


@router.get(
    "/entries",
    response_model=EntryViewPage,
    summary="Entries of live managers, rejected rows first, paginated",
)
async def entries(
    conn: Conn,
    cutoff: LiveAfter,
    paging: Page,
    manager_id: Annotated[str | None, Query(max_length=64), NoNul] = None,
    status: Annotated[Literal["active", "error"] | None, Query()] = None,
) -> EntryViewPage:
    total, page = await store_reads.entry_page(
        conn, cutoff, manager_id=manager_id, status=status, **paging._asdict()
    )
    return EntryViewPage(
        items=[_entry_view(live) for live in page], total=total, **paging._asdict()
    )


def _entry_view(live: store_reads.LiveEntry) -> EntryView:
    e = live.entry
    return EntryView(
        manager_id=live.manager.info.manager_id,
        manager_is_leader=live.manager.status.is_leader,
        schedule_id=int(e.schedule_key) if DIGITS.fullmatch(e.schedule_key) else None,
        schedule_key=e.schedule_key,
        name=e.name,
        status=e.status,
        hash=e.content_hash,
        spec=e.spec,
        timezone=e.timezone,
        queue=e.queue,
        registered_at=e.registered_at,
        last_error=e.last_error,
        last_good_since=e.last_good_since,
    )


@lru_cache(maxsize=1)
def _zones() -> list[str]:
    return sorted(z for z in available_timezones() if "/" in z or z == "UTC")


@router.get("/zones", response_model=list[str], summary="IANA zone names (for the form's hints)")
async def zones() -> list[str]:
    return _zones()
