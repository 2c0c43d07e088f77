"""CRUD on ``periodic_jobs`` rows. Every write is validated as the manager would validate the row,
then the in-process manager (if any) is asked to sync.

Concurrency: every schedule answer carries a strong ``ETag`` computed from the row's content and
``updated_at``; PATCH, DELETE, pause and resume honour ``If-Match`` (a list of tags, or ``*``) and
answer 412 when the row changed since the client read it. Without ``If-Match`` the write is
unconditional. On PostgreSQL the row is locked from the check to the commit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response, status
from sqlalchemy import ColumnElement, and_, case, delete, func, insert, select, true, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from periodic_manager.db import rows as dbrows
from periodic_manager.db import view as dbview
from periodic_manager.db.models import LastGood, PeriodicJob, Run, ScheduleState
from periodic_manager.schedules.rules import DEFAULT_QUEUE
from periodic_manager.settings import Settings

from ..deps import get_now, get_session, get_settings, notify_manager
from ..errors import ApiProblem, NameConflict, ScheduleNotFound
from ..rows import (
    api_errors,
    is_sqlite,
    merge_base,
    read_rows,
    rules,
    same_value,
    stamps,
    to_schedule,
    to_schedule_with_runs,
    validate_write,
)
from ..runtime import (
    live_cutoff,
    schedule_errors,
    schedule_overlap,
    schedule_state,
)
from ..schemas import (
    NoNul,
    ScheduleCreate,
    ScheduleDetail,
    ScheduleError,
    SchedulePage,
    ScheduleUpdate,
    ScheduleWithRuns,
)

router = APIRouter(prefix="/schedules", tags=["schedules"])

Session = Annotated[AsyncSession, Depends(get_session)]
Now = Annotated[datetime, Depends(get_now)]
ScheduleId = Annotated[int, Path(ge=1, le=2**63 - 1, description="the row id")]
IfMatch = Annotated[
    str | None,
    Header(
        max_length=2000,
        description="ETag(s) of the version the change is based on, or `*`; 412 if stale",
    ),
]
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "No such schedule"}}
CONFLICT: dict[int | str, dict[str, Any]] = {409: {"description": "The name is taken"}}
STALE: dict[int | str, dict[str, Any]] = {
    412: {"description": "If-Match does not match the current ETag"}
}
TOO_LARGE: dict[int | str, dict[str, Any]] = {
    413: {"description": "payload or options larger than PM_MAX_PAYLOAD_BYTES (canonical JSON)"}
}
ETAG_HEADER = {
    "ETag": {"description": "strong validator of this version", "schema": {"type": "string"}}
}
T = PeriodicJob.__table__.c


# -- helpers ---------------------------------------------------------------------------------


def check_if_match(row: dbview.RowView, if_match: str | None) -> None:
    """RFC 9110 If-Match with the strong comparison: weak tags never match."""
    if if_match is None:
        return
    tags = [t.strip() for t in if_match.split(",")]
    if "*" in tags or row.etag in tags:
        return
    raise ApiProblem(
        412,
        "precondition-failed",
        "the schedule changed since it was read (If-Match does not match its ETag); "
        "GET it again and retry",
    )


async def load_row(
    request: Request, session: AsyncSession, schedule_id: int, *, for_update: bool = False
) -> dbview.RowView:
    """The row, read raw and judged (whatever it holds); 404 if there is none."""
    raws = await read_rows(session, T.id == schedule_id, for_update=for_update)
    if not raws:
        raise ScheduleNotFound(schedule_id)
    return dbview.view(rules(request, session), raws[0])


async def row_exists(session: AsyncSession, schedule_id: int) -> None:
    """404 unless the row exists (nothing of it is read)."""
    found = await session.execute(select(T.id).where(T.id == schedule_id))
    if found.first() is None:
        raise ScheduleNotFound(schedule_id)


async def _name_taken(session: AsyncSession, name: str, other_than: int | None = None) -> bool:
    stmt = select(T.id).where(T.name == name)
    if other_than is not None:
        stmt = stmt.where(T.id != other_than)
    return (await session.execute(stmt.limit(1))).first() is not None


async def _write(session: AsyncSession, stmt: Any, name: str) -> Any:
    """Execute and commit; a unique violation on the name (a concurrent writer won the race) is
    a 409."""
    try:
        result = await session.execute(stmt)
        await session.commit()
        return result
    except IntegrityError as exc:
        await session.rollback()
        if "name" in str(exc.orig):
            raise NameConflict(name) from None
        raise


def _queue_filter(session: AsyncSession, queue: str) -> ColumnElement[bool]:
    """Rows whose ``options.queue`` is ``queue`` (absent means the default queue)."""
    value = func.coalesce(PeriodicJob.options["queue"].as_string(), DEFAULT_QUEUE)
    if is_sqlite(session):
        # Rows written with SQL may hold text that is not JSON, which json_extract refuses.
        value = case((func.json_valid(PeriodicJob.options) == 1, value), else_=None)
    return value == queue


def _manager_error(manager_id: str, message: str, last_good_since: datetime | None) -> ScheduleError:
    # Managers publish a rejection as "<field>: <reason>" (RowError.message).
    field, sep, reason = message.partition(": ")
    if not sep or " " in field:
        field, reason = "", message
    return ScheduleError(
        source="manager",
        field=field or None,
        reason=reason,
        message=message,
        manager_id=manager_id,
        last_good_since=last_good_since,
    )


async def detail(
    session: AsyncSession, row: dbview.RowView, now: datetime, settings: Settings
) -> ScheduleDetail:
    key = str(row.id)
    cutoff = live_cutoff(now, settings.heartbeat_interval)
    reported = await schedule_errors(session, key, cutoff)
    body = to_schedule_with_runs(row, now).model_dump()
    body["errors"] = [
        *api_errors(row),
        *(_manager_error(e.manager_id, e.message, e.last_good_since) for e in reported),
    ]
    return ScheduleDetail(
        **body,
        state=await schedule_state(session, key),
        overlap=await schedule_overlap(session, key, cutoff),
    )


async def _reread(request: Request, session: AsyncSession, schedule_id: int) -> dbview.RowView:
    """The row as stored after a write: the answer and its ETag are what a GET would give."""
    return await load_row(request, session, schedule_id)


# -- routes ----------------------------------------------------------------------------------


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ScheduleWithRuns,
    responses={**CONFLICT, **TOO_LARGE, 201: {"headers": ETAG_HEADER, "description": "Created"}},
    summary="Create a schedule",
)
async def create_schedule(
    body: ScheduleCreate, request: Request, response: Response, session: Session, now: Now
) -> ScheduleWithRuns:
    fields = body.model_dump()
    validate_write(request, fields, now)
    if await _name_taken(session, body.name):
        raise NameConflict(body.name)
    born = {"created_at": now, "updated_at": now, "effective_at": now}
    stmt = insert(PeriodicJob).values(**fields, **born).returning(T.id)
    schedule_id = (await _write(session, stmt, body.name)).scalar_one()
    notify_manager(request)
    row = await _reread(request, session, schedule_id)
    response.headers["Location"] = f"/schedules/{row.id}"
    response.headers["ETag"] = row.etag
    return to_schedule_with_runs(row, now)


@router.get("", response_model=SchedulePage, summary="List schedules (by id), with filters")
async def list_schedules(
    request: Request,
    session: Session,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
    enabled: Annotated[
        bool | None,
        Query(description="only enabled or paused ones (a row whose `enabled` is neither: none)"),
    ] = None,
    task_type: Annotated[str | None, Query(max_length=200), NoNul] = None,
    queue: Annotated[
        str | None,
        Query(max_length=100, description="`options.queue` (absent: `default`)"),
        NoNul,
    ] = None,
    name_prefix: Annotated[
        str | None, Query(max_length=200, description="case-sensitive name prefix"), NoNul
    ] = None,
) -> SchedulePage:
    conds: list[ColumnElement[bool]] = []
    if enabled is not None:
        conds.append(dbrows.enabled_is(is_sqlite(session), enabled))
    if task_type is not None:
        conds.append(T.task_type == task_type)
    if queue is not None:
        conds.append(_queue_filter(session, queue))
    if name_prefix:
        # substr rather than LIKE: exact and case-sensitive on both databases, no escaping.
        conds.append(func.substr(T.name, 1, len(name_prefix)) == name_prefix)
    where = and_(true(), *conds)
    total = (
        await session.execute(select(func.count()).select_from(PeriodicJob).where(where))
    ).scalar_one()
    raws = await read_rows(session, where, limit=limit, offset=offset)
    judged = rules(request, session)
    return SchedulePage(
        items=[to_schedule(dbview.view(judged, raw)) for raw in raws],
        total=total,
        limit=limit,
        offset=offset,
    )


@router.get(
    "/by-name/{name:path}",
    response_model=ScheduleDetail,
    responses={**NOT_FOUND, 200: {"headers": ETAG_HEADER, "description": "The schedule"}},
    summary="A schedule looked up by its name",
)
async def get_schedule_by_name(
    name: Annotated[str, Path(min_length=1, max_length=200), NoNul],
    request: Request,
    response: Response,
    session: Session,
    now: Now,
    settings: Annotated[Settings, Depends(get_settings)],
) -> ScheduleDetail:
    raws = await read_rows(session, T.name == name)
    if not raws:
        raise ScheduleNotFound(repr(name))
    row = dbview.view(rules(request, session), raws[0])
    response.headers["ETag"] = row.etag
    return await detail(session, row, now, settings)


@router.get(
    "/{schedule_id}",
    response_model=ScheduleDetail,
    responses={**NOT_FOUND, 200: {"headers": ETAG_HEADER, "description": "The schedule"}},
    summary="A schedule with its next runs and what the managers report about it",
)
async def get_schedule(
    schedule_id: ScheduleId,
    request: Request,
    response: Response,
    session: Session,
    now: Now,
    settings: Annotated[Settings, Depends(get_settings)],
) -> ScheduleDetail:
    row = await load_row(request, session, schedule_id)
    response.headers["ETag"] = row.etag
    return await detail(session, row, now, settings)


@router.patch(
    "/{schedule_id}",
    response_model=ScheduleWithRuns,
    responses={**NOT_FOUND, **CONFLICT, **STALE, **TOO_LARGE},
    summary="Change some fields of a schedule",
)
async def update_schedule(
    schedule_id: ScheduleId,
    body: ScheduleUpdate,
    request: Request,
    response: Response,
    session: Session,
    now: Now,
    if_match: IfMatch = None,
) -> ScheduleWithRuns:
    row = await load_row(request, session, schedule_id, for_update=True)
    check_if_match(row, if_match)
    stored = merge_base(row)
    asked = body.model_dump(exclude_unset=True)
    merged = {**stored, **asked}
    validate_write(request, merged, now)
    # Only what differs is written: a PATCH that changes nothing (empty, or the values already
    # stored) keeps the version (same ETag and updated_at); a column the PATCH leaves alone is
    # never rewritten, even one that cannot be read (a description that is not UTF-8, say).
    changes = {
        k: v for k, v in asked.items() if k in row.unreadable or not same_value(k, stored[k], v)
    }
    if changes:
        if merged["name"] != row.values["name"] and await _name_taken(
            session, merged["name"], schedule_id
        ):
            raise NameConflict(merged["name"])
        written = {**changes, **stamps(changes, row.enabled, now)}
        stmt = update(PeriodicJob).where(T.id == schedule_id).values(**written)
        await _write(session, stmt, merged["name"])
        notify_manager(request)
        row = await _reread(request, session, schedule_id)
    else:
        await session.rollback()  # ends the transaction (and its row lock)
    response.headers["ETag"] = row.etag
    return to_schedule_with_runs(row, now)


async def _set_enabled(
    schedule_id: int,
    enabled: bool,
    request: Request,
    response: Response,
    session: AsyncSession,
    now: datetime,
    if_match: str | None,
) -> ScheduleWithRuns:
    row = await load_row(request, session, schedule_id, for_update=True)
    check_if_match(row, if_match)
    if row.enabled is not enabled:  # idempotent: pausing a paused schedule changes nothing
        if enabled:
            # Resuming must not bring back a row that no manager could use.
            validate_write(request, {**merge_base(row), "enabled": True}, now)
        written = {"enabled": enabled, **stamps({"enabled": enabled}, row.enabled, now)}
        await session.execute(update(PeriodicJob).where(T.id == schedule_id).values(**written))
        await session.commit()
        notify_manager(request)
        row = await _reread(request, session, schedule_id)
    else:
        await session.rollback()
    response.headers["ETag"] = row.etag
    return to_schedule_with_runs(row, now)


@router.post(
    "/{schedule_id}/pause",
    response_model=ScheduleWithRuns,
    responses={**NOT_FOUND, **STALE},
    summary="Pause a schedule (enabled = false; its entry is removed, the row stays)",
)
async def pause_schedule(
    schedule_id: ScheduleId,
    request: Request,
    response: Response,
    session: Session,
    now: Now,
    if_match: IfMatch = None,
) -> ScheduleWithRuns:
    return await _set_enabled(schedule_id, False, request, response, session, now, if_match)


@router.post(
    "/{schedule_id}/resume",
    response_model=ScheduleWithRuns,
    responses={**NOT_FOUND, **STALE, **TOO_LARGE},
    summary="Resume a paused schedule (its first slot is the first one after now)",
)
async def resume_schedule(
    schedule_id: ScheduleId,
    request: Request,
    response: Response,
    session: Session,
    now: Now,
    if_match: IfMatch = None,
) -> ScheduleWithRuns:
    return await _set_enabled(schedule_id, True, request, response, session, now, if_match)


@router.delete(
    "/{schedule_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses={**NOT_FOUND, **STALE},
    summary="Delete a schedule, its runtime state and its run history",
)
async def delete_schedule(
    schedule_id: ScheduleId,
    request: Request,
    session: Session,
    if_match: IfMatch = None,
) -> Response:
    row = await load_row(request, session, schedule_id, for_update=True)
    check_if_match(row, if_match)
    key = str(schedule_id)
    await session.execute(delete(PeriodicJob).where(T.id == schedule_id))
    await session.execute(delete(ScheduleState).where(ScheduleState.schedule_key == key))
    await session.execute(delete(Run).where(Run.schedule_key == key))
    await session.execute(delete(LastGood).where(LastGood.schedule_key == key))
    await session.commit()
    notify_manager(request)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
