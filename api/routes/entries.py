"""What the live managers registered (a manager that misses three heartbeats disappears)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from periodic_manager.contracts import EntryRecord
from periodic_manager.db import schedule_reader, store_reads
from periodic_manager.db import view as dbview
from periodic_manager.db.engine import Connection
from periodic_manager.schedules import bounds as slot_bounds
from periodic_manager.schedules.definition import content_hash
from periodic_manager.schedules.runs import max_runs_of, runs_left
from periodic_manager.settings import Settings

from ..deps import get_conn, get_now, get_settings
from ..rows import next_slot, rules
from ..runtime import live_cutoff
from ..schedule_schemas import PreviousTask
from ..schemas import EntryList, EntryOut

router = APIRouter(tags=["entries"])
DIGITS = re.compile(r"[0-9]+")  # not str.isdigit(): that accepts non-ASCII digits


Version = tuple[slot_bounds.Bounds, int | None]  # options.start_at/end_at, options.max_runs
NO_LIMITS: Version = (slot_bounds.NO_BOUNDS, None)


def _entry(live: store_reads.LiveEntry, now: datetime, version: Version = NO_LIMITS) -> EntryOut:
    """``version``: the bounds (options.start_at, options.end_at) and options.max_runs of the
    version the entry runs (entry records do not carry options; see :func:`_versions`). An
    active entry past its end_at, or with every run of max_runs recorded, shows status
    ``ended`` and no next slot, as the manager holds it."""
    entry, manager, state = live.entry, live.manager, live.state
    bounds, max_runs = version
    key = entry.schedule_key
    active = entry.status == "active"
    nxt = next_slot(entry.spec, entry.timezone, entry.anchor, now) if active else None
    status = entry.status
    if active and bounds is not slot_bounds.NO_BOUNDS:
        nxt = next_slot(entry.spec, entry.timezone, entry.anchor, slot_bounds.floor_of(now, bounds))
        if nxt is None or slot_bounds.ended(nxt, bounds):
            nxt, status = None, "ended"  # no slot left before options.end_at
    if (
        active
        and max_runs is not None
        and state is not None
        and runs_left(max_runs, state.runs) == 0
    ):
        nxt, status = None, "ended"  # every run of options.max_runs was sent
    return EntryOut(
        entry_id=entry.entry_id,
        schedule_id=int(key) if DIGITS.fullmatch(key) else None,
        schedule_key=key,
        name=entry.name,
        hash=entry.content_hash,
        status=status,
        spec=entry.spec,
        timezone=entry.timezone,
        task_type=entry.task_type,
        queue=entry.queue,
        next_slot=nxt,
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
    request: Request,
    conn: Annotated[Connection, Depends(get_conn)],
    now: Annotated[datetime, Depends(get_now)],
    settings: Annotated[Settings, Depends(get_settings)],
    schedule_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> EntryList:
    cutoff = live_cutoff(now, settings.heartbeat_interval)
    key = str(schedule_id) if schedule_id is not None else None
    live = await store_reads.live_entries(conn, cutoff, key)
    found = await _versions(request, conn, live)
    return EntryList(
        items=[_entry(e, now, found.get(e.entry.content_hash, NO_LIMITS)) for e in live]
    )


async def _versions(
    request: Request, conn: Connection, live: list[store_reads.LiveEntry]
) -> dict[str, Version]:
    """The bounds and max_runs of the rows behind the active entries, by content hash (the
    version an entry runs: a row changed since, or a last-good version, has another hash and
    none here)."""
    ids = sorted(
        {
            int(e.entry.schedule_key)
            for e in live
            if e.entry.status == "active" and DIGITS.fullmatch(e.entry.schedule_key)
        }
    )
    if not ids:
        return {}
    judged = await rules(request, conn)
    out: dict[str, Version] = {}
    for raw in await schedule_reader.rows_of(conn, ids):
        config = dbview.view(judged, raw).config
        if config is not None and config.options:
            version = (slot_bounds.bounds_of(config.options), max_runs_of(config.options))
            if version != NO_LIMITS:
                out[content_hash(config)] = version
    return out
