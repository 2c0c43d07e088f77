"""The http target's options judged by the one judge: the API's 422 and a row written with SQL
name the same field for the same reason (PM_TARGET=http, and beside the outbox)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.api import create_app
from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import RowError
from periodic_manager.db import judge as dbjudge
from periodic_manager.db import schedule_reader
from periodic_manager.db.engine import create_engine, reads_bytes
from periodic_manager.settings import Settings
from tests.support import rawsql
from tests.support.api import JOB, T0

URL = "https://hooks.example.com/in"
BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"url": "ftp://hooks.example.com/"}, "options.url", "http:// or https://"),
    ({"url": "http://169.254.169.254/latest/meta-data"}, "options.url", "PM_HTTP_ALLOW_PRIVATE"),
    ({"url": "http://localhost:8000/"}, "options.url", "PM_HTTP_ALLOW_PRIVATE"),
    ({"url": URL, "headers": {"Authorization": "Bearer x"}}, "options.headers", "credential"),
    ({"url": URL, "retry": {"attempts": 500}}, "options.retry", "attempts"),
    ({"url": URL, "method": "DELETE"}, "options.method", "POST, PUT"),
    ({"url": URL, "target": "outbox"}, "options.url", "only the http target reads it"),
    ({}, "options.url", "PM_HTTP_URL"),
]


@pytest.fixture
async def engine(migrated_sqlite_url: str) -> AsyncIterator[AsyncEngine]:
    e = create_engine(migrated_sqlite_url)
    yield e
    await e.dispose()


async def test_the_api_and_a_stored_row_refuse_alike(
    migrated_sqlite_url: str, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PM_HTTP_ALLOW_PRIVATE", raising=False)
    monkeypatch.delenv("PM_HTTP_URL", raising=False)
    settings = Settings(database_url=migrated_sqlite_url, target="http", targets=("outbox",))
    app = create_app(settings, clock=VirtualClock(T0), engine=engine)
    rules = dbjudge.rules_for(
        reads_bytes(engine), settings.max_payload_bytes, settings.configured_targets()
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            for i, (options, field, words) in enumerate(BAD):
                r = await client.post(
                    "/schedules", json={**JOB, "name": f"h.{i}", "options": options}
                )
                assert r.status_code == 422, (options, r.text)
                api = r.json()["errors"][0]
                assert api["field"] == field and words in api["reason"], (options, api)
                row_id = await rawsql.insert(
                    migrated_sqlite_url, f"h.{i}", options=f"'{json.dumps(options)}'"
                )
                async with engine.connect() as conn:
                    raw = await schedule_reader.row(conn, row_id)
                verdict = dbjudge.RowJudge(rules)(raw)
                assert isinstance(verdict, RowError), (options, verdict)
                assert (verdict.field, verdict.reason) == (api["field"], api["reason"])
            good = {"url": URL, "secret": "hooks", "retry": {"attempts": 5}, "timeout": 2.5}
            r = await client.post("/schedules", json={**JOB, "name": "h.good", "options": good})
            assert r.status_code == 201, r.text
