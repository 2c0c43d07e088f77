"""CRUD on ``periodic_jobs`` rows. Every write is validated as the manager would validate the row,
then the in-process manager (if any) is asked to sync."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status
from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import flag_modified

from api.deps import get_now, get_session, get_settings, notify_manager
from api.errors import NameConflict, ScheduleNotFound
from api.rows import to_schedule, to_schedule_with_runs, validate_row
from api.runtime import live_cutoff, schedule_errors, schedule_state
from api.schemas import (
    ErrorBody,
    NotFoundBody,
    ScheduleCreate,
    ScheduleDetail,
    SchedulePage,
    ScheduleUpdate,
    ScheduleWithRuns,
)
from periodic_manager.db.models import PeriodicJob, ScheduleState
from periodic_manager.settings import Settings

router = APIRouter(prefix="/schedules", tags=["schedules"])

Session = Annotated[AsyncSession, Depends(get_session)]
Now = Annotated[datetime, Depends(get_now)]
ScheduleId = Annotated[int, Path(ge=1, le=2**63 - 1, description="the row id")]
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": NotFoundBody}}
CONFLICT: dict[int | str, dict[str, Any]] = {409: {"model": ErrorBody}}
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


async def _load(
    session: AsyncSession, schedule_id: int, *, for_update: bool = False
) -> PeriodicJob:
    stmt = select(PeriodicJob).where(PeriodicJob.id == schedule_id)
    if for_update:
        stmt = stmt.with_for_update()  # PostgreSQL: merge-validate-write is atomic; SQLite ignores
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


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ScheduleWithRuns,
    responses=CONFLICT,
    summary="Create a schedule",
)
async def create_schedule(
    body: ScheduleCreate, request: Request, response: Response, session: Session, now: Now
) -> ScheduleWithRuns:
    fields = body.model_dump()
    validate_row(fields, now)
    if await _name_taken(session, body.name):
        raise NameConflict(body.name)
    row = PeriodicJob(**fields, created_at=now, updated_at=now)
    session.add(row)
    await _commit(session, body.name)
    notify_manager(request)
    response.headers["Location"] = f"/schedules/{row.id}"
    return to_schedule_with_runs(row, now)


@router.get("", response_model=SchedulePage, summary="List schedules (by id)")
async def list_schedules(
    session: Session,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
) -> SchedulePage:
    total = (await session.execute(select(func.count()).select_from(PeriodicJob))).scalar_one()
    stmt = select(PeriodicJob).order_by(PeriodicJob.id).limit(limit).offset(offset)
    rows = (await session.execute(stmt)).scalars().all()
    return SchedulePage(
        items=[to_schedule(r) for r in rows], total=total, limit=limit, offset=offset
    )


@router.get(
    "/{schedule_id}",
    response_model=ScheduleDetail,
    responses=NOT_FOUND,
    summary="A schedule with its next runs and what the managers report about it",
)
async def get_schedule(
    schedule_id: ScheduleId,
    session: Session,
    now: Now,
    settings: Annotated[Settings, Depends(get_settings)],
) -> ScheduleDetail:
    row = await _load(session, schedule_id)
    key = str(schedule_id)
    cutoff = live_cutoff(now, settings.heartbeat_interval)
    return ScheduleDetail(
        **to_schedule_with_runs(row, now).model_dump(),
        state=await schedule_state(session, key),
        errors=await schedule_errors(session, key, cutoff),
    )


@router.patch(
    "/{schedule_id}",
    response_model=ScheduleWithRuns,
    responses={**NOT_FOUND, **CONFLICT},
    summary="Change some fields of a schedule",
)
async def update_schedule(
    schedule_id: ScheduleId, body: ScheduleUpdate, request: Request, session: Session, now: Now
) -> ScheduleWithRuns:
    row = await _load(session, schedule_id, for_update=True)
    merged: dict[str, Any] = {c: getattr(row, c) for c in COLUMNS}
    merged.update(body.model_dump(exclude_unset=True))
    validate_row(merged, now)
    if merged["name"] != row.name and await _name_taken(session, merged["name"], schedule_id):
        raise NameConflict(merged["name"])
    for column, value in merged.items():
        setattr(row, column, value)
    row.updated_at = now
    # Even when ``now`` equals the stored value: an unchanged attribute would let the model's
    # ``onupdate=func.now()`` (the database's clock, not ours) fill the column.
    flag_modified(row, "updated_at")
    await _commit(session, merged["name"])
    notify_manager(request)
    return to_schedule_with_runs(row, now)


@router.delete(
    "/{schedule_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=NOT_FOUND,
    summary="Delete a schedule and its runtime state",
)
async def delete_schedule(schedule_id: ScheduleId, request: Request, session: Session) -> Response:
    result = await session.execute(delete(PeriodicJob).where(PeriodicJob.id == schedule_id))
    if result.rowcount == 0:  # type: ignore[attr-defined]
        await session.rollback()
        raise ScheduleNotFound(schedule_id)
    await session.execute(
        delete(ScheduleState).where(ScheduleState.schedule_key == str(schedule_id))
    )
    await session.commit()
    notify_manager(request)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
