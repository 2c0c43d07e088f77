"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from sqlalchemy import case, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from api.deps import get_now, get_session, get_settings
from api.errors import problem_response
from api.runtime import live_cutoff
from api.schemas import Health, Readiness
from periodic_manager.db.models import Manager, PeriodicJob
from periodic_manager.settings import Settings

router = APIRouter(tags=["operations"])
DB_CHECK_TIMEOUT_S = 2.0


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """Liveness: the process serves requests (does not touch the database; never needs a token)."""
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"description": "Not ready; `checks` says what failed"}},
)
async def readyz(request: Request) -> Any:
    """Readiness: the database answers and the in-process manager (if any) runs, as leader or
    standby (``manager: absent`` when this process serves the API alone)."""
    checks: dict[str, str] = {}
    ready = True
    try:
        async with request.app.state.engine.connect() as conn:
            await asyncio.wait_for(conn.execute(text("SELECT 1")), DB_CHECK_TIMEOUT_S)
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}"
        ready = False
    manager = getattr(request.app.state, "manager", None)
    if manager is None:
        checks["manager"] = "absent"
    elif getattr(manager, "failed", None) is not None:
        checks["manager"] = "failed"
        ready = False
    else:
        checks["manager"] = "leader" if getattr(manager, "is_leader", True) else "standby"
    if not ready:
        return problem_response(503, "not-ready", "a readiness check failed", checks=checks)
    return JSONResponse(Readiness(status="ready", checks=checks).model_dump())


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics(
    request: Request,
    session: Annotated[AsyncSession, Depends(get_session)],
    settings: Annotated[Settings, Depends(get_settings)],
    now: Annotated[Any, Depends(get_now)],
) -> PlainTextResponse:
    """Prometheus text format: the in-process manager's metrics and the API's own gauges."""
    out = b""
    manager_metrics = getattr(getattr(request.app.state, "manager", None), "metrics", None)
    if manager_metrics is not None:
        out += generate_latest(manager_metrics.registry)
    out += generate_latest(await _api_registry(session, settings, now))
    return PlainTextResponse(out, media_type=CONTENT_TYPE_LATEST)


async def _api_registry(session: AsyncSession, settings: Settings, now: Any) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    up = Gauge(
        "periodic_manager_api_database_up", "1 if the API reached the database", registry=registry
    )
    schedules = Gauge(
        "periodic_manager_schedules", "Rows of periodic_jobs", ["enabled"], registry=registry
    )
    managers = Gauge(
        "periodic_manager_live_managers", "Managers with a recent heartbeat", registry=registry
    )
    leaders = Gauge("periodic_manager_live_leaders", "Live managers that lead", registry=registry)
    try:
        rows = (
            await session.execute(
                select(PeriodicJob.enabled, func.count()).group_by(PeriodicJob.enabled)
            )
        ).all()
        live = (
            await session.execute(
                select(
                    func.count(), func.coalesce(func.sum(case((Manager.is_leader, 1), else_=0)), 0)
                ).where(Manager.heartbeat_at >= live_cutoff(now, settings.heartbeat_interval))
            )
        ).one()
    except Exception:
        up.set(0)
        return registry
    up.set(1)
    counts = {bool(enabled): n for enabled, n in rows}
    schedules.labels(enabled="true").set(counts.get(True, 0))
    schedules.labels(enabled="false").set(counts.get(False, 0))
    managers.set(live[0])
    leaders.set(live[1])
    return registry
