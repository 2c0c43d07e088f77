"""Exclusion calendars: ``/calendars/{name}``, named sets of dates a schedule's
``options.exclude`` names (``periodic_manager.schedules.calendars``). Read and written through
``periodic_manager.db.calendars``; a write reaches the managers like a schedule edit (the rows
that name the calendar get a new revision)."""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response, status

from periodic_manager.db import calendars as dbcalendars
from periodic_manager.db.engine import retried
from periodic_manager.schedules.calendars import (
    MAX_DATES,
    NAME_PATTERN,
    CalendarSpec,
    check_name,
    check_spec,
    holiday_dates,
)

from ..deps import Conn, Now, notify_manager
from ..errors import ApiProblem
from ..schemas import CalendarBody, CalendarList, CalendarView

router = APIRouter(prefix="/calendars", tags=["calendars"])

Name = Annotated[str, Path(min_length=1, max_length=64, pattern=f"^{NAME_PATTERN}$")]
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "No such calendar"}}
IN_USE: dict[int | str, dict[str, Any]] = {
    409: {"description": "Schedules name the calendar in options.exclude (listed)"}
}


def _view(
    c: dbcalendars.StoredCalendar, now: datetime, used_by: list[str] | None = None
) -> CalendarView:
    spec: CalendarSpec | None = c.spec
    body: dict[str, Any] = {"name": c.name, "updated_at": c.updated_at, "used_by": used_by}
    if spec is None:
        assert c.error is not None
        body["error"] = str(c.error)
        return CalendarView(kind=None, **body)
    if spec.dates is not None:
        return CalendarView(kind="dates", dates=sorted(spec.dates), **body)
    assert spec.country is not None
    # A holidays calendar shows its dates of this year and the next (it holds every year's).
    days: set[date] = set()
    for year in (now.year, now.year + 1):
        days |= holiday_dates(spec.country, spec.subdiv, year)
    holidays = {"country": spec.country, "subdiv": spec.subdiv}
    return CalendarView(kind="holidays", holidays=holidays, dates=sorted(days), **body)


@router.get("", response_model=CalendarList, summary="Every exclusion calendar, by name")
async def list_calendars(conn: Conn, now: Now) -> CalendarList:
    return CalendarList(items=[_view(c, now) for c in await dbcalendars.read_all(conn)])


@router.get("/{name}", response_model=CalendarView, responses=NOT_FOUND, summary="One calendar")
async def get_calendar(name: Name, conn: Conn, now: Now) -> CalendarView:
    found = await dbcalendars.read_one(conn, name)
    if found is None:
        raise ApiProblem(404, "not-found", f"no calendar named {name!r}")
    return _view(found, now, await dbcalendars.users(conn, name))


@router.put(
    "/{name}",
    response_model=CalendarView,
    responses={201: {"description": "Created"}},
    summary="Create or replace a calendar: a list of dates, or a country's public holidays",
    description=f'`{{"dates": ["2026-12-24", ...]}}` (at most {MAX_DATES}) or '
    '`{"holidays": {"country": "DE", "subdiv": "BY"}}`. Schedules that name it in '
    "`options.exclude` follow the new content at the managers' next sync.",
)
async def put_calendar(
    name: Name, body: CalendarBody, request: Request, response: Response, conn: Conn, now: Now
) -> CalendarView:
    check_name(name)
    spec = check_spec(body.model_dump(exclude_none=True))

    async def write() -> tuple[bool, dbcalendars.StoredCalendar, list[str]]:
        created = await dbcalendars.put(conn, name, spec, now)
        found = await dbcalendars.read_one(conn, name)
        assert found is not None
        return created, found, await dbcalendars.users(conn, name)

    # Concurrent writers of one calendar may deadlock on MariaDB/MySQL: the write is run again.
    created, found, users = await retried(conn, write)
    notify_manager(request)
    if created:
        response.status_code = status.HTTP_201_CREATED
    return _view(found, now, users)


@router.delete(
    "/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={**NOT_FOUND, **IN_USE},
    summary="Delete a calendar no schedule names",
)
async def delete_calendar(name: Name, request: Request, conn: Conn) -> Response:
    if await dbcalendars.read_one(conn, name) is None:
        raise ApiProblem(404, "not-found", f"no calendar named {name!r}")
    users = await dbcalendars.remove(conn, name)
    if users is not None:
        shown = ", ".join(users[:20]) + (f" and {len(users) - 20} more" if len(users) > 20 else "")
        raise ApiProblem(
            409,
            "calendar-in-use",
            f"calendar {name!r} is named in options.exclude of {len(users)} schedule(s): {shown};"
            " remove it from them first",
            extra={"used_by": users},
        )
    notify_manager(request)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
