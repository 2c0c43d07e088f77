"""Read what running managers published: pm_managers, pm_entries, pm_schedule_state."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Select, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from periodic_manager.db.models import Entry, Manager, ScheduleState

from .schemas import OverlapState, PreviousTask, ScheduleRowError
from .schemas import ScheduleState as ScheduleStateOut

# A manager that missed this many heartbeats is treated as dead.
LIVE_HEARTBEATS = 3


def live_cutoff(now: datetime, heartbeat_interval_s: float) -> datetime:
    return now - timedelta(seconds=LIVE_HEARTBEATS * heartbeat_interval_s)


def live_entries(cutoff: datetime) -> Select[Entry, Manager, ScheduleState]:
    """Entries of live managers with their manager and (maybe absent) schedule state."""
    return (
        select(Entry, Manager, ScheduleState)
        .join(Manager, Manager.manager_id == Entry.manager_id)
        .outerjoin(ScheduleState, ScheduleState.schedule_key == Entry.schedule_key)
        .where(Manager.heartbeat_at >= cutoff)
    )


async def schedule_state(session: AsyncSession, schedule_key: str) -> ScheduleStateOut | None:
    st = await session.get(ScheduleState, schedule_key)
    if st is None:
        return None
    return ScheduleStateOut(
        last_slot_at=st.last_slot_at,
        last_enqueued_at=st.last_enqueued_at,
        last_message_id=st.last_message_id,
        last_status=st.last_status,
        last_error=st.last_error,
        counts={
            "enqueued": st.enqueued_count,
            "duplicate": st.duplicate_count,
            "skipped": st.skipped_count,
            "failed": st.failed_count,
            "held": st.held_count,
            "resent": st.resent_count,
        },
    )


async def schedule_errors(
    session: AsyncSession, schedule_key: str, cutoff: datetime
) -> list[ScheduleRowError]:
    stmt = (
        select(Entry.manager_id, Entry.last_error, Entry.last_good_since)
        .join(Manager, Manager.manager_id == Entry.manager_id)
        .where(
            Entry.schedule_key == schedule_key,
            Entry.status == "error",
            Manager.heartbeat_at >= cutoff,
        )
        .order_by(Entry.manager_id, Entry.entry_id)
    )
    rows = (await session.execute(stmt)).all()
    return [
        ScheduleRowError(manager_id=m, message=msg or "rejected", last_good_since=since)
        for m, msg, since in rows
    ]


async def schedule_overlap(
    session: AsyncSession, schedule_key: str, cutoff: datetime
) -> OverlapState | None:
    """The held slot and previous task live managers publish for a schedule (options.overlap):
    the leader's first, else the manager that heard from its target last."""
    stmt = (
        select(
            Entry.manager_id,
            Entry.held_slot_at,
            Entry.previous_task_id,
            Entry.previous_task_state,
        )
        .join(Manager, Manager.manager_id == Entry.manager_id)
        .where(
            Entry.schedule_key == schedule_key,
            Entry.status == "active",
            Manager.heartbeat_at >= cutoff,
            or_(Entry.held_slot_at.is_not(None), Entry.previous_task_state.is_not(None)),
        )
        .order_by(Manager.is_leader.desc(), Entry.manager_id)
        .limit(1)
    )
    row = (await session.execute(stmt)).first()
    if row is None:
        return None
    manager_id, held_slot, task_id, state = row
    return OverlapState(
        manager_id=manager_id,
        held_slot=held_slot,
        previous_task=PreviousTask(task_id=task_id, state=state),
    )
