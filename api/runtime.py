"""What running managers published about one schedule (read by ``periodic_manager.db.store_reads``),
as the API shows it; and which managers count as live."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from periodic_manager.db import store_reads
from periodic_manager.db.engine import Connection
from periodic_manager.db.models import COUNT_COLUMNS
from periodic_manager.db.runtime_rows import ManagerRecord

from .schedule_schemas import OverlapState, PreviousTask, ScheduleRowError
from .schedule_schemas import ScheduleState as ScheduleStateOut

# A manager that missed this many heartbeats is treated as dead.
LIVE_HEARTBEATS = 3


def live_cutoff(now: datetime, heartbeat_interval_s: float) -> datetime:
    return now - timedelta(seconds=LIVE_HEARTBEATS * heartbeat_interval_s)


def manager_fields(
    m: ManagerRecord, now: datetime, held: Mapping[str, list[int]]
) -> dict[str, Any]:
    """A live manager as ``/managers`` and the dashboard show it (the fields of ``ManagerOut``);
    ``held``: the partitions whose lease names each manager (``db.partitions.holders``)."""
    return {
        "manager_id": m.info.manager_id,
        "hostname": m.info.hostname,
        "pid": m.info.pid,
        "version": m.info.version,
        "started_at": m.info.started_at,
        "heartbeat_at": m.status.heartbeat_at,
        "heartbeat_age_s": max(0.0, (now - m.status.heartbeat_at).total_seconds()),
        "is_leader": m.status.is_leader,
        "last_sync_at": m.status.last_sync_at,
        "last_sync_error": m.status.last_sync_error,
        "entry_count": m.status.entry_count,
        "target_down": m.status.target_down,
        "clock_offset_s": m.status.clock_offset_s,
        "partitions": held.get(m.info.manager_id, []),
    }


async def runs_counted(conn: Connection, schedule_key: str) -> int:
    """The runs of a schedule with options.max_runs that the managers recorded (0: none)."""
    st = (await store_reads.states(conn, [schedule_key])).get(schedule_key)
    return st.runs if st is not None else 0


async def schedule_state(conn: Connection, schedule_key: str) -> ScheduleStateOut | None:
    st = (await store_reads.states(conn, [schedule_key])).get(schedule_key)
    if st is None:
        return None
    return ScheduleStateOut(
        last_slot_at=st.last_slot_at,
        last_enqueued_at=st.last_enqueued_at,
        last_message_id=st.last_message_id,
        last_status=st.last_status,
        last_error=st.last_error,
        counts={status: st.counts.get(status, 0) for status in COUNT_COLUMNS},
    )


async def schedule_errors(
    conn: Connection, schedule_key: str, cutoff: datetime
) -> list[ScheduleRowError]:
    return [
        ScheduleRowError(
            manager_id=r.manager_id,
            message=r.message or "rejected",
            last_good_since=r.last_good_since,
        )
        for r in await store_reads.rejections_of(conn, schedule_key, cutoff)
    ]


async def schedule_overlap(
    conn: Connection, schedule_key: str, cutoff: datetime
) -> OverlapState | None:
    """The held slot and previous task live managers publish for a schedule (options.overlap):
    the leader's first, else the manager that heard from its target last."""
    found = await store_reads.overlap_of(conn, schedule_key, cutoff)
    if found is None:
        return None
    return OverlapState(
        manager_id=found.manager_id,
        held_slot=found.held_slot,
        previous_task=PreviousTask(task_id=found.previous_task_id, state=found.previous_task_state),
    )
