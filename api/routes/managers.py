"""Live managers: who leads, the partitions each holds, last sync, entry count, version,
heartbeat age."""

from __future__ import annotations

from fastapi import APIRouter

from periodic_manager.db import partitions, store_reads

from ..deps import Conn, LiveAfter, Now
from ..runtime import manager_fields
from ..schemas import ManagerList, ManagerOut

router = APIRouter(tags=["entries"])


@router.get("/managers", response_model=ManagerList, summary="Live managers (leader first)")
async def list_managers(conn: Conn, now: Now, cutoff: LiveAfter) -> ManagerList:
    live = await store_reads.live_managers(conn, cutoff)
    held = await partitions.holders(conn)
    return ManagerList(items=[ManagerOut(**manager_fields(m, now, held)) for m in live])
