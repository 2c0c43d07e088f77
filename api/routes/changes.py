"""A schedule's change history (``pm_schedule_changes``): every change of its tracked columns,
whoever made it (the API, an import, the manager or plain SQL), newest first.

The history outlives the row: the id of a deleted schedule keeps answering with its changes,
the last one ``deleted``, until the manager prunes them (``PM_CHANGES_RETENTION``); an id that
has neither a row nor a change is 404.
"""

from __future__ import annotations

from fastapi import APIRouter

from periodic_manager.db import change_history, schedule_reader

from ..deps import Conn, Page
from ..errors import ScheduleNotFound
from ..routes.schedules import NOT_FOUND, ScheduleId
from ..schemas import ChangeOut, ChangePage, FieldChangeOut

router = APIRouter(prefix="/schedules", tags=["history"])


@router.get(
    "/{schedule_id}/changes",
    response_model=ChangePage,
    responses=NOT_FOUND,
    summary="Change history of a schedule (also of a deleted one), newest first",
)
async def list_changes(schedule_id: ScheduleId, conn: Conn, paging: Page) -> ChangePage:
    total, rows = await change_history.page(conn, schedule_id, **paging._asdict())
    if total == 0 and not await schedule_reader.exists(conn, schedule_id):
        raise ScheduleNotFound(schedule_id)
    items = [
        ChangeOut(
            id=r.id,
            at=r.at,
            action=r.action,
            source=r.source,
            actor=r.actor,
            name=r.name,
            changes=None
            if r.changes is None
            else {
                column: FieldChangeOut(before=c.before, after=c.after, truncated=c.truncated)
                for column, c in r.changes.items()
            },
        )
        for r in rows
    ]
    return ChangePage(items=items, total=total, **paging._asdict())
