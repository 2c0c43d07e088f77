"""CRUD on ``periodic_jobs`` rows. Every write is validated as the manager would validate the row,
then the in-process manager (if any) is asked to sync.

Concurrency: every schedule answer carries a strong ``ETag`` computed from the row's content and
``updated_at``; PATCH, DELETE, pause and resume honour ``If-Match`` (a list of tags, or ``*``) and
answer 412 when the row changed since the client read it. Without ``If-Match`` the write is
unconditional. On PostgreSQL the row is locked from the check to the commit.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response, status
from sqlalchemy import ColumnElement, and_, case, delete, func, select, true
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import flag_modified

from api.deps import get_now, get_session, get_settings, notify_manager
from api.errors import ApiProblem, NameConflict, ScheduleNotFound
from api.rows import schedule_body, to_schedule, to_schedule_with_runs, validate_row
from api.runtime import live_cutoff, schedule_errors, schedule_overlap, schedule_state
from api.schemas import (
    ScheduleCreate,
    ScheduleDetail,
    SchedulePage,
    ScheduleUpdate,
    ScheduleWithRuns,
)
from periodic_manager.config import DEFAULT_QUEUE, canonical_json
from periodic_manager.db.models import PeriodicJob, Run, ScheduleState
from periodic_manager.settings import Settings

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
ETAG_HEADER = {
    "ETag": {"description": "strong validator of this version", "schema": {"type": "string"}}
}
COLUMNS = (
    "name",
    "spec",
    "timezone",
    "task_type",
    "payload",
    "options",
    "enabled",
    "description",
    "anchor",
)


# -- helpers ---------------------------------------------------------------------------------


def etag(row: PeriodicJob) -> str:
    """A strong validator: sha256 of the row's representation (content, timestamps, id)."""
    doc = {
        k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in schedule_body(row).items()
    }
    try:
        text = canonical_json(doc)
    except (TypeError, ValueError):  # a row written with SQL may hold anything; still a version
        text = repr(sorted(doc.items()))
    return '"' + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32] + '"'


def check_if_match(row: PeriodicJob, if_match: str | None) -> None:
    """RFC 9110 If-Match with the strong comparison: weak tags never match."""
    if if_match is None:
        return
    tags = [t.strip() for t in if_match.split(",")]
    if "*" in tags or etag(row) in tags:
        return
    raise ApiProblem(
        412,
        "precondition-failed",
        "the schedule changed since it was read (If-Match does not match its ETag); "
        "GET it again and retry",
    )


async def load_row(
    session: AsyncSession, schedule_id: int, *, for_update: bool = False
) -> PeriodicJob:
    stmt = select(PeriodicJob).where(PeriodicJob.id == schedule_id)
    if for_update:
        stmt = stmt.with_for_update()  # PostgreSQL: check-merge-write is atomic; SQLite ignores
    row = (await session.execute(stmt)).scalar_one_or_none()
    if row is None:
        raise ScheduleNotFound(schedule_id)
    return row


async def _name_taken(session: AsyncSession, name: str, other_than: int | None = None) -> bool:
    stmt = select(PeriodicJob.id).where(PeriodicJob.name == name)
    if other_than is not None:
        stmt = stmt.where(PeriodicJob.id != other_than)
    return (await session.execute(stmt.limit(1))).first() is not None


async def _commit(session: AsyncSession, name: str) -> None:
    """Commit; a unique violation on the name (a concurrent writer won the race) is a 409."""
    try:
        await session.commit()
    except IntegrityError as exc:
        await session.rollback()
        if "name" in str(exc.orig):
            raise NameConflict(name) from None
        raise


def _touch(row: PeriodicJob, now: datetime) -> None:
    row.updated_at = now
    # Even when ``now`` equals the stored value: an unchanged attribute would let the model's
    # ``onupdate=func.now()`` (the database's clock, not ours) fill the column.
    flag_modified(row, "updated_at")


def _queue_filter(session: AsyncSession, queue: str) -> ColumnElement[bool]:
    """Rows whose ``options.queue`` is ``queue`` (absent means the default queue)."""
    value = func.coalesce(PeriodicJob.options["queue"].as_string(), DEFAULT_QUEUE)
    if session.bind is not None and session.bind.dialect.name == "sqlite":
        # Rows written with SQL may hold text that is not JSON, which json_extract refuses.
        value = case((func.json_valid(PeriodicJob.options) == 1, value), else_=None)
    return value == queue


async def detail(
    session: AsyncSession, row: PeriodicJob, now: datetime, settings: Settings
) -> ScheduleDetail:
    key = str(row.id)
    cutoff = live_cutoff(now, settings.heartbeat_interval)
    return ScheduleDetail(
        **to_schedule_with_runs(row, now).model_dump(),
        state=await schedule_state(session, key),
        errors=await schedule_errors(session, key, cutoff),
        overlap=await schedule_overlap(session, key, cutoff),
    )


# -- routes ----------------------------------------------------------------------------------


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ScheduleWithRuns,
    responses={**CONFLICT, 201: {"headers": ETAG_HEADER, "description": "Created"}},
    summary="Create a schedule",
)
async def create_schedule(
    body: ScheduleCreate, request: Request, response: Response, session: Session, now: Now
) -> ScheduleWithRuns:
    fields = body.model_dump()
    validate_row(fields, now, targets=get_settings(request).configured_targets())
    if await _name_taken(session, body.name):
        raise NameConflict(body.name)
    row = PeriodicJob(**fields, created_at=now, updated_at=now)
    session.add(row)
    await _commit(session, body.name)
    notify_manager(request)
    response.headers["Location"] = f"/schedules/{row.id}"
    response.headers["ETag"] = etag(row)
    return to_schedule_with_runs(row, now)


@router.get("", response_model=SchedulePage, summary="List schedules (by id), with filters")
async def list_schedules(
    session: Session,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
    enabled: Annotated[bool | None, Query(description="only enabled or paused ones")] = None,
    task_type: Annotated[str | None, Query(max_length=200)] = None,
    queue: Annotated[
        str | None, Query(max_length=100, description="`options.queue` (absent: `default`)")
    ] = None,
    name_prefix: Annotated[
        str | None, Query(max_length=200, description="case-sensitive name prefix")
    ] = None,
) -> SchedulePage:
    conds: list[ColumnElement[bool]] = []
    if enabled is not None:
        conds.append(PeriodicJob.enabled == enabled)
    if task_type is not None:
        conds.append(PeriodicJob.task_type == task_type)
    if queue is not None:
        conds.append(_queue_filter(session, queue))
    if name_prefix:
        # substr rather than LIKE: exact and case-sensitive on both databases, no escaping.
        conds.append(func.substr(PeriodicJob.name, 1, len(name_prefix)) == name_prefix)
    where = and_(true(), *conds)
    total = (
        await session.execute(select(func.count()).select_from(PeriodicJob).where(where))
    ).scalar_one()
    stmt = select(PeriodicJob).where(where).order_by(PeriodicJob.id).limit(limit).offset(offset)
    rows = (await session.execute(stmt)).scalars().all()
    return SchedulePage(
        items=[to_schedule(r) for r in rows], total=total, limit=limit, offset=offset
    )


@router.get(
    "/by-name/{name:path}",
    response_model=ScheduleDetail,
    responses={**NOT_FOUND, 200: {"headers": ETAG_HEADER, "description": "The schedule"}},
    summary="A schedule looked up by its name",
)
async def get_schedule_by_name(
    name: Annotated[str, Path(min_length=1, max_length=200)],
    response: Response,
    session: Session,
    now: Now,
    settings: Annotated[Settings, Depends(get_settings)],
) -> ScheduleDetail:
    row = (
        await session.execute(select(PeriodicJob).where(PeriodicJob.name == name))
    ).scalar_one_or_none()
    if row is None:
        raise ScheduleNotFound(repr(name))
    response.headers["ETag"] = etag(row)
    return await detail(session, row, now, settings)


@router.get(
    "/{schedule_id}",
    response_model=ScheduleDetail,
    responses={**NOT_FOUND, 200: {"headers": ETAG_HEADER, "description": "The schedule"}},
    summary="A schedule with its next runs and what the managers report about it",
)
async def get_schedule(
    schedule_id: ScheduleId,
    response: Response,
    session: Session,
    now: Now,
    settings: Annotated[Settings, Depends(get_settings)],
) -> ScheduleDetail:
    row = await load_row(session, schedule_id)
    response.headers["ETag"] = etag(row)
    return await detail(session, row, now, settings)


@router.patch(
    "/{schedule_id}",
    response_model=ScheduleWithRuns,
    responses={**NOT_FOUND, **CONFLICT, **STALE},
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
    row = await load_row(session, schedule_id, for_update=True)
    check_if_match(row, if_match)
    merged: dict[str, Any] = {c: getattr(row, c) for c in COLUMNS}
    merged.update(body.model_dump(exclude_unset=True))
    validate_row(merged, now, targets=get_settings(request).configured_targets())
    if merged["name"] != row.name and await _name_taken(session, merged["name"], schedule_id):
        raise NameConflict(merged["name"])
    for column, value in merged.items():
        setattr(row, column, value)
    _touch(row, now)
    await _commit(session, merged["name"])
    notify_manager(request)
    response.headers["ETag"] = etag(row)
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
    row = await load_row(session, schedule_id, for_update=True)
    check_if_match(row, if_match)
    if row.enabled != enabled:  # idempotent: pausing a paused schedule changes nothing
        if enabled:
            # Resuming must not bring back a row that no manager could use.
            validate_row(
                {c: getattr(row, c) for c in COLUMNS},
                now,
                targets=get_settings(request).configured_targets(),
            )
        row.enabled = enabled
        _touch(row, now)
        await session.commit()
        notify_manager(request)
    response.headers["ETag"] = etag(row)
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
    responses={**NOT_FOUND, **STALE},
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
    schedule_id: ScheduleId, request: Request, session: Session, if_match: IfMatch = None
) -> Response:
    row = await load_row(session, schedule_id, for_update=True)
    check_if_match(row, if_match)
    key = str(schedule_id)
    await session.execute(delete(PeriodicJob).where(PeriodicJob.id == schedule_id))
    await session.execute(delete(ScheduleState).where(ScheduleState.schedule_key == key))
    await session.execute(delete(Run).where(Run.schedule_key == key))
    await session.commit()
    notify_manager(request)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
