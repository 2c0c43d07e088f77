"""Live managers: who leads, last sync, entry count, version, heartbeat age."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from periodic_manager.db.models import Manager
from periodic_manager.settings import Settings

from ..deps import get_now, get_session, get_settings
from ..runtime import live_cutoff
from ..schemas import ManagerList, ManagerOut

router = APIRouter(tags=["entries"])


@router.get("/managers", response_model=ManagerList, summary="Live managers (leader first)")
async def list_managers(
    session: Annotated[AsyncSession, Depends(get_session)],
    now: Annotated[datetime, Depends(get_now)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> ManagerList:
    stmt = (
        select(Manager)
        .where(Manager.heartbeat_at >= live_cutoff(now, settings.heartbeat_interval))
        .order_by(Manager.is_leader.desc(), Manager.manager_id)
    )
    rows = (await session.execute(stmt)).scalars().all()
    return ManagerList(
        items=[
            ManagerOut(
                manager_id=m.manager_id,
                hostname=m.hostname,
                pid=m.pid,
                version=m.version,
                started_at=m.started_at,
                heartbeat_at=m.heartbeat_at,
                heartbeat_age_s=max(0.0, (now - m.heartbeat_at).total_seconds()),
                is_leader=m.is_leader,
                last_sync_at=m.last_sync_at,
                last_sync_error=m.last_sync_error,
                entry_count=m.entry_count,
            )
            for m in rows
        ]
    )
