from __future__ import annotations

from fastapi import APIRouter

from api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """Liveness: the process serves requests (does not touch the database)."""
    return Health(status="ok")
