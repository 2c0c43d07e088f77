"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from periodic_manager.contracts import Target
from periodic_manager.db import stats, store_reads
from periodic_manager.db.engine import Connection, Engine
from periodic_manager.db.migrate import database_revision, schema_problem
from periodic_manager.runtime.causes import explain
from periodic_manager.runtime.probe import ping_target
from periodic_manager.settings import Settings

from ..deps import get_conn, get_now, get_settings, get_state
from ..errors import problem_response
from ..runtime import live_cutoff
from ..schemas import Health, Readiness

router = APIRouter(tags=["operations"])
CHECK_TIMEOUT_S = 2.0


@router.get(
    "/healthz",
    response_model=Health,
    responses={503: {"description": "The in-process manager reports itself unhealthy"}},
)
async def healthz(request: Request) -> Any:
    """Liveness: the process serves requests and its in-process manager (if any) is healthy.
    Never touches the database; never needs a token."""
    manager = get_state(request).manager
    reason = manager.health() if manager is not None else None
    if reason is not None:
        return problem_response(503, "not-alive", reason)
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"description": "Not ready; `checks` says what failed"}},
)
async def readyz(request: Request) -> Any:
    """Readiness, one entry per dependency in ``checks``: ``database`` answers, ``schema`` is at
    this version's head, the in-process manager's ``target`` answers, the ``manager`` runs
    (``leader`` or ``standby``) and may hold work (``standing down: <why>`` while its targets
    fail their pings: it holds none), and its ``clock`` agrees with the database's (``ok``;
    ``skewed: ...`` beyond 2 s, still ready; ``failed: ...`` beyond the grace / 4 or after a jump
    not yet measured: it holds and sends nothing). A process serving the API alone reports
    ``target``, ``manager`` and ``clock`` as ``absent``. Each check is bounded by 2 s; any failure
    is a 503."""
    state = get_state(request)
    manager = state.manager
    (database, schema), target = await asyncio.gather(
        _check_database(state.database),
        _check_target(manager.target if manager is not None else None),
    )
    checks = {"database": database, "schema": schema, "target": target}
    if manager is None:
        checks["manager"] = checks["clock"] = "absent"
    else:
        reason = manager.health()
        down = manager.standing_down
        if reason is not None:
            checks["manager"] = f"failed: {reason}"
        elif down is not None:
            checks["manager"] = f"standing down: {down}"
        else:
            checks["manager"] = "leader" if manager.is_leader else "standby"
        checks["clock"] = manager.clock_check()
    failed = [
        name
        for name, value in checks.items()
        if value not in READY_VALUES and not value.startswith("skewed:")
    ]
    if failed:
        detail = "not ready: " + ", ".join(failed)
        return problem_response(503, "not-ready", detail, checks=checks)
    return JSONResponse(Readiness(status="ready", checks=checks).model_dump())


READY_VALUES = frozenset({"ok", "absent", "leader", "standby"})


def _error(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"error: no answer within {CHECK_TIMEOUT_S:g} s"
    return f"error: {type(exc).__name__}: {explain(exc)}"


async def _check_database(engine: Engine) -> tuple[str, str]:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S), engine.connect() as conn:
            revision = await database_revision(conn)
    except Exception as exc:
        return _error(exc), "unknown"
    problem = schema_problem(revision)
    return "ok", "ok" if problem is None else problem


async def _check_target(target: Target | None) -> str:
    if target is None:
        return "absent"
    try:
        await ping_target(target, CHECK_TIMEOUT_S)
    except Exception as exc:
        return _error(exc)
    return "ok"


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics(
    request: Request,
    conn: Annotated[Connection, Depends(get_conn)],
    settings: Annotated[Settings, Depends(get_settings)],
    now: Annotated[Any, Depends(get_now)],
) -> PlainTextResponse:
    """Prometheus text format: the in-process manager's metrics and the API's own gauges."""
    out = b""
    manager = get_state(request).manager
    if manager is not None:
        out += generate_latest(manager.registry)
    out += generate_latest(await _api_registry(conn, settings, now))
    return PlainTextResponse(out, media_type=CONTENT_TYPE_LATEST)


async def _api_registry(conn: Connection, settings: Settings, now: Any) -> CollectorRegistry:
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
        counts = await stats.enabled_counts(conn)
        live, leading = await store_reads.live_counts(
            conn, live_cutoff(now, settings.heartbeat_interval)
        )
    except Exception:
        up.set(0)
        return registry
    up.set(1)
    schedules.labels(enabled="true").set(counts[True])
    schedules.labels(enabled="false").set(counts[False])
    managers.set(live)
    leaders.set(leading)
    return registry
