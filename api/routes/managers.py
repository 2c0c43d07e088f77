"""Live managers: who leads, last sync, entry count, version, heartbeat age."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends

from periodic_manager.db import store_reads
from periodic_manager.db.engine import Connection
from periodic_manager.settings import Settings

from ..deps import get_conn, get_now, get_settings
from ..runtime import live_cutoff
from ..schemas import ManagerList, ManagerOut

router = APIRouter(tags=["entries"])


@router.get("/managers", response_model=ManagerList, summary="Live managers (leader first)")
async def list_managers(
    conn: Annotated[Connection, Depends(get_conn)],
    now: Annotated[datetime, Depends(get_now)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> ManagerList:
    live = await store_reads.live_managers(conn, live_cutoff(now, settings.heartbeat_interval))
    return ManagerList(
        items=[
            ManagerOut(
                manager_id=m.info.manager_id,
                hostname=m.info.hostname,
                pid=m.info.pid,
                version=m.info.version,
                started_at=m.info.started_at,
                heartbeat_at=m.status.heartbeat_at,
                heartbeat_age_s=max(0.0, (now - m.status.heartbeat_at).total_seconds()),
                is_leader=m.status.is_leader,
                last_sync_at=m.status.last_sync_at,
                last_sync_error=m.status.last_sync_error,
                entry_count=m.status.entry_count,
            )
            for m in live
        ]
    )
