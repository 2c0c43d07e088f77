"""A schedule's change history (``pm_schedule_changes``): every change of its tracked columns,
whoever made it (the API, an import, the manager or plain SQL), newest first.

The history outlives the row: the id of a deleted schedule keeps answering with its changes,
the last one ``deleted``, until the manager prunes them (``PM_CHANGES_RETENTION``); an id that
has neither a row nor a change is 404.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from periodic_manager.db import change_history, schedule_reader
from periodic_manager.db.engine import Connection

from ..deps import get_conn
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
async def list_changes(
    schedule_id: ScheduleId,
    conn: Annotated[Connection, Depends(get_conn)],
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
) -> ChangePage:
    total, rows = await change_history.page(conn, schedule_id, limit=limit, offset=offset)
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
    return ChangePage(items=items, total=total, limit=limit, offset=offset)
