"""What the live managers registered (a manager that misses three heartbeats disappears)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from sqlalchemy.ext.asyncio import AsyncSession

from periodic_manager.db.models import Entry, Manager, ScheduleState
from periodic_manager.settings import Settings

from ..deps import get_now, get_session, get_settings
from ..rows import next_slot
from ..runtime import live_cutoff, live_entries
from ..schemas import EntryList, EntryOut, PreviousTask

router = APIRouter(tags=["entries"])
DIGITS = re.compile(r"[0-9]+")  # not str.isdigit(): that accepts non-ASCII digits


def _entry(entry: Entry, manager: Manager, state: ScheduleState | None, now: datetime) -> EntryOut:
    key = entry.schedule_key
    active = entry.status == "active"
    return EntryOut(
        entry_id=entry.entry_id,
        schedule_id=int(key) if DIGITS.fullmatch(key) else None,
        schedule_key=key,
        name=entry.name,
        hash=entry.content_hash,
        status=entry.status,
        spec=entry.spec,
        timezone=entry.timezone,
        task_type=entry.task_type,
        queue=entry.queue,
        next_slot=next_slot(entry.spec, entry.timezone, entry.anchor, now) if active else None,
        previous_slot=state.last_slot_at if state is not None else None,
        last_error=entry.last_error or (state.last_error if state is not None else None),
        manager_id=manager.manager_id,
        manager_is_leader=manager.is_leader,
        manager_heartbeat_at=manager.heartbeat_at,
        registered_at=entry.registered_at,
        held_slot=entry.held_slot_at,
        previous_task=previous_task(entry),
        last_good_since=entry.last_good_since,
    )


def previous_task(entry: Entry) -> PreviousTask | None:
    """What the manager published of the schedule's last task (options.overlap), if anything."""
    if entry.previous_task_id is None and entry.previous_task_state is None:
        return None
    return PreviousTask(task_id=entry.previous_task_id, state=entry.previous_task_state)


@router.get("/entries", response_model=EntryList, summary="Entries registered by live managers")
async def list_entries(
    session: Annotated[AsyncSession, Depends(get_session)],
    now: Annotated[datetime, Depends(get_now)],
    settings: Annotated[Settings, Depends(get_settings)],
    schedule_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> EntryList:
    stmt = live_entries(live_cutoff(now, settings.heartbeat_interval))
    if schedule_id is not None:
        stmt = stmt.where(Entry.schedule_key == str(schedule_id))
    stmt = stmt.order_by(Entry.schedule_key, Entry.manager_id, Entry.entry_id)
    rows = (await session.execute(stmt)).all()
    return EntryList(items=[_entry(e, m, s, now) for e, m, s in rows])
