"""CRUD on ``periodic_jobs`` rows. Every write is validated as the manager would validate the row,
then the in-process manager (if any) is asked to sync.

Concurrency: every schedule answer carries a strong ``ETag`` computed from the row's content and
``updated_at``; PATCH, DELETE, pause and resume honour ``If-Match`` (a list of tags, or ``*``) and
answer 412 when the row changed since the client read it. Without ``If-Match`` the write is
unconditional. The row is locked from the check to the commit, and written, stamped and deleted by
the schedule writer (``periodic_manager.db.schedule_writer``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response, status

from periodic_manager.db import schedule_reader, schedule_writer
from periodic_manager.db import view as dbview
from periodic_manager.db.engine import Connection
from periodic_manager.settings import Settings

from ..deps import get_conn, get_now, get_settings, notify_manager
from ..errors import ApiProblem, ScheduleNotFound
from ..rows import (
    api_errors,
    merge_base,
    refuse_alone,
    rules,
    to_schedule,
    to_schedule_with_runs,
    validate_write,
)
from ..runtime import (
    live_cutoff,
    runs_counted,
    schedule_errors,
    schedule_overlap,
    schedule_state,
)
from ..schedule_schemas import (
    PauseRequest,
    ScheduleCreate,
    ScheduleDetail,
    ScheduleError,
    SchedulePage,
    ScheduleUpdate,
    ScheduleWithRuns,
)
from ..schemas import NoNul

router = APIRouter(prefix="/schedules", tags=["schedules"])

Conn = Annotated[Connection, Depends(get_conn)]
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
    request: Request, conn: Connection, schedule_id: int, *, for_update: bool = False
) -> dbview.RowView:
    """The row, read raw and judged (whatever it holds); 404 if there is none. ``for_update``:
    locked for the write that follows (see ``schedule_writer.lock``)."""
    if for_update:
        raw = await schedule_writer.lock(conn, schedule_id)
    else:
        raw = await schedule_reader.row(conn, schedule_id)
    if raw is None:
        raise ScheduleNotFound(schedule_id)
    return dbview.view(await rules(request, conn), raw)


async def row_exists(conn: Connection, schedule_id: int) -> None:
    """404 unless the row exists (nothing of it is read)."""
    if not await schedule_reader.exists(conn, schedule_id):
        raise ScheduleNotFound(schedule_id)


def _manager_error(
    manager_id: str, message: str, last_good_since: datetime | None
) -> ScheduleError:
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
    conn: Connection, row: dbview.RowView, now: datetime, settings: Settings
) -> ScheduleDetail:
    key = str(row.id)
    cutoff = live_cutoff(now, settings.heartbeat_interval)
    reported = await schedule_errors(conn, key, cutoff)
    body = to_schedule_with_runs(row, now, await runs_counted(conn, key)).model_dump()
    body["errors"] = [
        *api_errors(row),
        *(_manager_error(e.manager_id, e.message, e.last_good_since) for e in reported),
    ]
    return ScheduleDetail(
        **body,
        state=await schedule_state(conn, key),
        overlap=await schedule_overlap(conn, key, cutoff),
    )


async def _reread(request: Request, conn: Connection, schedule_id: int) -> dbview.RowView:
    """The row as stored after a write: the answer and its ETag are what a GET would give."""
    return await load_row(request, conn, schedule_id)


# -- routes ----------------------------------------------------------------------------------


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ScheduleWithRuns,
    responses={**CONFLICT, **TOO_LARGE, 201: {"headers": ETAG_HEADER, "description": "Created"}},
    summary="Create a schedule",
)
async def create_schedule(
    body: ScheduleCreate, request: Request, response: Response, conn: Conn, now: Now
) -> ScheduleWithRuns:
    fields = await validate_write(request, conn, body.fields(), now)
    schedule_id = await schedule_writer.create(conn, fields, now)
    notify_manager(request)
    row = await _reread(request, conn, schedule_id)
    response.headers["Location"] = f"/schedules/{row.id}"
    response.headers["ETag"] = row.etag
    return to_schedule_with_runs(row, now, await runs_counted(conn, str(row.id)))


@router.get("", response_model=SchedulePage, summary="List schedules (by id), with filters")
async def list_schedules(
    request: Request,
    conn: Conn,
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
    filters = schedule_reader.Filters(
        enabled=enabled, task_type=task_type, queue=queue, name_prefix=name_prefix
    )
    total = await schedule_reader.count(conn, filters)
    raws = await schedule_reader.page(conn, filters, limit=limit, offset=offset)
    judged = await rules(request, conn)
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
    conn: Conn,
    now: Now,
    settings: Annotated[Settings, Depends(get_settings)],
) -> ScheduleDetail:
    raw = await schedule_reader.row_named(conn, name)
    if raw is None:
        raise ScheduleNotFound(repr(name))
    row = dbview.view(await rules(request, conn), raw)
    response.headers["ETag"] = row.etag
    return await detail(conn, row, now, settings)


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
    conn: Conn,
    now: Now,
    settings: Annotated[Settings, Depends(get_settings)],
) -> ScheduleDetail:
    row = await load_row(request, conn, schedule_id)
    response.headers["ETag"] = row.etag
    return await detail(conn, row, now, settings)


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
    conn: Conn,
    now: Now,
    if_match: IfMatch = None,
) -> ScheduleWithRuns:
    asked = body.fields()
    refuse_alone(request, asked)
    row = await load_row(request, conn, schedule_id, for_update=True)
    check_if_match(row, if_match)
    stored = merge_base(row)
    merged = await validate_write(request, conn, {**stored, **asked}, now)
    # Only what differs is written: a PATCH that changes nothing (empty, or the values already
    # stored) keeps the version (same ETag and updated_at); a column the PATCH leaves alone is
    # never rewritten, even one that cannot be read (a description that is not UTF-8, say).
    changes = {
        k: merged[k]
        for k in asked
        if k in row.unreadable or not dbview.same_value(k, stored[k], merged[k])
    }
    if changes:
        await schedule_writer.update_row(
            conn, schedule_id, changes, was_enabled=row.enabled, name=merged["name"], now=now
        )
        notify_manager(request)
        row = await _reread(request, conn, schedule_id)
    else:
        await schedule_writer.release(conn)  # ends the transaction (and its row lock)
    response.headers["ETag"] = row.etag
    return to_schedule_with_runs(row, now, await runs_counted(conn, str(row.id)))


async def _set_enabled(
    schedule_id: int,
    enabled: bool,
    request: Request,
    response: Response,
    conn: Connection,
    now: datetime,
    if_match: str | None,
    note: str | None = None,
) -> ScheduleWithRuns:
    row = await load_row(request, conn, schedule_id, for_update=True)
    check_if_match(row, if_match)
    # Idempotent: pausing a paused schedule changes nothing (not even its note: who paused it
    # first, when and why stays), resuming an enabled one neither.
    if row.enabled is not enabled:
        if enabled:
            # Resuming must not bring back a row that no manager could use.
            await validate_write(request, conn, {**merge_base(row), "enabled": True}, now)
        # The API's tokens have no names: every pause through it is by "api", no actor.
        await schedule_writer.set_enabled(
            conn, schedule_id, enabled, was_enabled=row.enabled, now=now, note=note
        )
        notify_manager(request)
        row = await _reread(request, conn, schedule_id)
    else:
        await schedule_writer.release(conn)
    response.headers["ETag"] = row.etag
    return to_schedule_with_runs(row, now, await runs_counted(conn, str(row.id)))


@router.post(
    "/{schedule_id}/pause",
    response_model=ScheduleWithRuns,
    responses={**NOT_FOUND, **STALE},
    summary="Pause a schedule (enabled = false; its entry is removed, the row stays)",
    description='An optional body `{"note": "..."}` says why; the note, when and by whom '
    "(`api`) are kept until the schedule resumes and shown as `paused`. Pausing a paused "
    "schedule changes nothing, its note neither.",
)
async def pause_schedule(
    schedule_id: ScheduleId,
    request: Request,
    response: Response,
    conn: Conn,
    now: Now,
    body: PauseRequest | None = None,
    if_match: IfMatch = None,
) -> ScheduleWithRuns:
    note = body.note if body is not None else None
    return await _set_enabled(schedule_id, False, request, response, conn, now, if_match, note)


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
    conn: Conn,
    now: Now,
    if_match: IfMatch = None,
) -> ScheduleWithRuns:
    return await _set_enabled(schedule_id, True, request, response, conn, now, if_match)


@router.delete(
    "/{schedule_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses={**NOT_FOUND, **STALE},
    summary="Delete a schedule, its runtime state and its run history (its changes stay)",
)
async def delete_schedule(
    schedule_id: ScheduleId,
    request: Request,
    conn: Conn,
    now: Now,
    if_match: IfMatch = None,
) -> Response:
    row = await load_row(request, conn, schedule_id, for_update=True)
    check_if_match(row, if_match)
    await schedule_writer.delete_row(conn, schedule_id, now)
    notify_manager(request)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
