"""What the live managers registered (a manager that misses three heartbeats disappears)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from periodic_manager import cron
from periodic_manager.contracts import EntryRecord
from periodic_manager.db import schedule_reader, store_reads
from periodic_manager.db import view as dbview
from periodic_manager.db.engine import Connection
from periodic_manager.schedules.definition import content_hash
from periodic_manager.schedules.runs import max_runs_of, runs_left
from periodic_manager.schedules.slots import Rule
from periodic_manager.settings import Settings

from ..deps import get_conn, get_now, get_settings
from ..rows import SLOT_ERRORS, rules
from ..runtime import live_cutoff
from ..schedule_schemas import PreviousTask
from ..schemas import EntryList, EntryOut

router = APIRouter(tags=["entries"])
DIGITS = re.compile(r"[0-9]+")  # not str.isdigit(): that accepts non-ASCII digits


# The slot rule and options.max_runs of the version an entry runs (entry records carry no
# options; see :func:`_versions`).
Version = tuple[Rule, int | None]


def _entry(live: store_reads.LiveEntry, now: datetime, version: Version | None = None) -> EntryOut:
    """``version``: the slot rule (bounds, options.exclude, ...) and options.max_runs of the
    version the entry runs; None: its spec, zone and anchor alone. An active entry shows its
    next slot that is sent, and status ``ended`` when none is left (past its end_at, every run
    of max_runs recorded), as the manager holds it."""
    entry, manager, state = live.entry, live.manager, live.state
    key = entry.schedule_key
    nxt, status = None, entry.status
    if status == "active":
        nxt, ended = _next_slot(live, now, version)
        if ended:
            status = "ended"
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


def _next_slot(
    live: store_reads.LiveEntry, now: datetime, version: Version | None
) -> tuple[datetime | None, bool]:
    """The next slot of an active entry that is sent (None: none, or it cannot be computed),
    and whether the entry has ended."""
    entry, state = live.entry, live.state
    try:
        if version is None:
            if entry.spec is None:
                return None, False
            rule = Rule(cron.parse(entry.spec, tz=entry.timezone or "UTC", anchor=entry.anchor))
            return rule.next_sent(now), False
        rule, max_runs = version
    except SLOT_ERRORS:
        return None, False
    left = None
    if max_runs is not None:
        left = runs_left(max_runs, state.runs if state is not None else 0)
    if rule.has_ended(now, left):
        return None, True
    return rule.next_sent(now, left), False


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
    return EntryList(items=[_entry(e, now, found.get(e.entry.content_hash)) for e in live])


async def _versions(
    request: Request, conn: Connection, live: list[store_reads.LiveEntry]
) -> dict[str, Version]:
    """The slot rule and max_runs of the rows with options behind the active entries, by content
    hash (the version an entry runs: a row changed since, or a last-good version, has another
    hash and none here)."""
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
            try:
                out[content_hash(config)] = (Rule.of(config), max_runs_of(config.options))
            except SLOT_ERRORS:
                continue
    return out
