"""Live managers: who leads, the partitions each holds, last sync, entry count, version,
heartbeat age."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends

from periodic_manager.db import partitions, store_reads
from periodic_manager.db.engine import Connection
from periodic_manager.settings import Settings

from ..deps import get_conn, get_now, get_settings
from ..runtime import live_cutoff, manager_fields
from ..schemas import ManagerList, ManagerOut

router = APIRouter(tags=["entries"])


@router.get("/managers", response_model=ManagerList, summary="Live managers (leader first)")
async def list_managers(
    conn: Annotated[Connection, Depends(get_conn)],
    now: Annotated[datetime, Depends(get_now)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> ManagerList:
    live = await store_reads.live_managers(conn, live_cutoff(now, settings.heartbeat_interval))
    held = await partitions.holders(conn)
    return ManagerList(items=[ManagerOut(**manager_fields(m, now, held)) for m in live])
