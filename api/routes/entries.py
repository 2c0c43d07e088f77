"""What the live managers registered (a manager that misses three heartbeats disappears)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from periodic_manager.contracts import EntryRecord
from periodic_manager.db import store_reads
from periodic_manager.db.engine import Connection
from periodic_manager.settings import Settings

from ..deps import get_conn, get_now, get_settings
from ..rows import next_slot
from ..runtime import live_cutoff
from ..schemas import EntryList, EntryOut, PreviousTask

router = APIRouter(tags=["entries"])
DIGITS = re.compile(r"[0-9]+")  # not str.isdigit(): that accepts non-ASCII digits


def _entry(live: store_reads.LiveEntry, now: datetime) -> EntryOut:
    entry, manager, state = live.entry, live.manager, live.state
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
        manager_id=manager.info.manager_id,
        manager_is_leader=manager.status.is_leader,
        manager_heartbeat_at=manager.status.heartbeat_at,
        registered_at=entry.registered_at,
        held_slot=entry.held_slot,
        previous_task=previous_task(entry),
        last_good_since=entry.last_good_since,
    )


def previous_task(entry: EntryRecord) -> PreviousTask | None:
    """What the manager published of the schedule's last task (options.overlap), if anything."""
    if entry.previous_task_id is None and entry.previous_task_state is None:
        return None
    return PreviousTask(task_id=entry.previous_task_id, state=entry.previous_task_state)


@router.get("/entries", response_model=EntryList, summary="Entries registered by live managers")
async def list_entries(
    conn: Annotated[Connection, Depends(get_conn)],
    now: Annotated[datetime, Depends(get_now)],
    settings: Annotated[Settings, Depends(get_settings)],
    schedule_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> EntryList:
    cutoff = live_cutoff(now, settings.heartbeat_interval)
    key = str(schedule_id) if schedule_id is not None else None
    live = await store_reads.live_entries(conn, cutoff, key)
    return EntryList(items=[_entry(e, now) for e in live])
