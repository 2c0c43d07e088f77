"""Shared by the API tests (tests/api/, and the behaviour tests that drive the API): the instant
they start at, a valid schedule body, and checks of the answers. The ``clock``, ``engine`` and
``client`` fixtures built from these are in tests/api/conftest.py (api_client is the client)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.api import create_app
from periodic_manager.clock import VirtualClock
from periodic_manager.settings import Settings

T0 = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)
HEARTBEAT_S = 5.0
JOB = {"name": "reports.daily", "spec": "*/15 * * * *", "task_type": "reports.build"}


def iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat().replace("+00:00", "Z")


def settings_for(db_url: str) -> Settings:
    return Settings(database_url=db_url, heartbeat_interval=HEARTBEAT_S)


@asynccontextmanager
async def api_client(
    db_url: str, clock: VirtualClock, engine: AsyncEngine
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app on ``db_url`` (settings_for), its lifespan run: the ``client``
    fixture of tests/api/conftest.py."""
    app = create_app(settings_for(db_url), clock=clock, engine=engine)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            yield c


async def create(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    r = await client.post("/schedules", json={**JOB, **fields})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def assert_problem(r: httpx.Response, status: int) -> dict[str, Any]:
    """An RFC 9457 problem: media type and the members every problem has."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json", r.headers
    body: dict[str, Any] = r.json()
    assert body["status"] == status and body["title"] and body["type"], body
    return body


def assert_error(r: httpx.Response, status: int, loc: list[Any], type_: str | None = None) -> None:
    """A problem whose first ``errors`` item names ``loc`` (location, then the field's path)."""
    errors = assert_problem(r, status)["errors"]
    assert len(errors) >= 1 and all(
        set(item) == {"location", "field", "reason", "code"} for item in errors
    )
    field = ".".join(str(p) for p in loc[1:]) or None
    assert (errors[0]["location"], errors[0]["field"]) == (loc[0], field), errors
    assert errors[0]["reason"]
    if type_ is not None:
        assert errors[0]["code"] == type_, errors


def manager_row(manager_id: str, heartbeat_at: datetime, *, leader: bool) -> dict[str, Any]:
    return {
        "manager_id": manager_id,
        "hostname": "host",
        "pid": 1,
        "version": "0.1.0",
        "started_at": T0 - timedelta(hours=1),
        "heartbeat_at": heartbeat_at,
        "is_leader": leader,
    }
