"""``GET /schedules/{id}/changes``: every change of a schedule (created, API edit, plain SQL edit,
import, pause, resume, delete) with its time, source, actor and each tracked column before and
after, recorded by migration 0012's triggers on both databases; bookkeeping writes make no entry;
the history outlives the row; hostile values are cut and read safely; the manager's store prunes
it by age and by count."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.clock import VirtualClock
from periodic_manager.db import change_history
from periodic_manager.db.engine import on_sqlite
from periodic_manager.db.store import DatabaseRuntimeStore
from periodic_manager.schedules import files as sio
from periodic_manager.schedules import import_export
from tests.support.api import JOB, T0, assert_problem, create, iso


async def changes(client: httpx.AsyncClient, schedule_id: int, **params: Any) -> dict[str, Any]:
    r = await client.get(f"/schedules/{schedule_id}/changes", params=params)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def sql(engine: AsyncEngine, *statements: str) -> None:
    async with engine.begin() as conn:
        for stmt in statements:
            await conn.execute(text(stmt))


def field(before: Any, after: Any, truncated: bool = False) -> dict[str, Any]:
    return {"before": before, "after": after, "truncated": truncated}


async def test_api_lifecycle_is_recorded_newest_first_and_outlives_the_row(
    client: httpx.AsyncClient, clock: VirtualClock
) -> None:
    s = await create(client, payload={"a": 1}, options={"queue": "q"})
    sid = s["id"]
    await clock.advance(10)
    r = await client.patch(f"/schedules/{sid}", json={"spec": "*/5 * * * *", "payload": {"a": 2}})
    assert r.status_code == 200, r.text
    # A PATCH that changes nothing is no change.
    assert (
        await client.patch(f"/schedules/{sid}", json={"spec": "*/5 * * * *"})
    ).status_code == 200
    await clock.advance(10)
    assert (
        await client.post(f"/schedules/{sid}/pause", json={"note": "db work"})
    ).status_code == 200
    assert (await client.post(f"/schedules/{sid}/pause")).status_code == 200  # paused already
    await clock.advance(10)
    assert (await client.post(f"/schedules/{sid}/resume")).status_code == 200
    await clock.advance(10)
    assert (await client.delete(f"/schedules/{sid}")).status_code == 204
    assert (await client.get(f"/schedules/{sid}")).status_code == 404

    page = await changes(client, sid)
    assert page["total"] == 5
    items = page["items"]
    assert [i["action"] for i in items] == ["deleted", "resumed", "paused", "updated", "created"]
    assert {i["source"] for i in items} == {"api"} and {i["actor"] for i in items} == {None}
    assert [i["at"] for i in items] == [iso(T0 + timedelta(seconds=n)) for n in (40, 30, 20, 10, 0)]
    assert {i["name"] for i in items} == {JOB["name"]}
    deleted, resumed, paused, updated, created = items
    assert created["changes"] == {
        "name": field(None, JOB["name"]),
        "spec": field(None, JOB["spec"]),
        "timezone": field(None, "UTC"),
        "task_type": field(None, JOB["task_type"]),
        "payload": field(None, {"a": 1}),
        "options": field(None, {"queue": "q"}),
        "enabled": field(None, True),
    }
    assert updated["changes"] == {
        "spec": field(JOB["spec"], "*/5 * * * *"),
        "payload": field({"a": 1}, {"a": 2}),
    }
    # Stamps (updated_at, effective_at, paused_at, paused_by, revision) are no entries of their own.
    assert paused["changes"] == {
        "enabled": field(True, False),
        "paused_note": field(None, "db work"),
    }
    assert resumed["changes"] == {
        "enabled": field(False, True),
        "paused_note": field("db work", None),
    }
    assert deleted["changes"]["spec"] == field("*/5 * * * *", None)
    assert deleted["changes"]["enabled"] == field(True, None)
    # Paging: newest first.
    second = await changes(client, sid, limit=2, offset=1)
    assert [i["action"] for i in second["items"]] == ["resumed", "paused"] and second["total"] == 5
    # An id that never existed.
    assert_problem(await client.get("/schedules/999/changes"), 404)


async def test_plain_sql_is_recorded_as_sql_without_bookkeeping_noise(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    s = await create(client)
    sid = s["id"]
    await sql(
        engine,
        "UPDATE periodic_jobs SET spec = '0 * * * *', description = 'by hand'",
        "UPDATE periodic_jobs SET updated_at = created_at, effective_at = NULL",  # no change
        "UPDATE periodic_jobs SET enabled = false",
        "UPDATE periodic_jobs SET paused_note = 'why'",
        "UPDATE periodic_jobs SET enabled = true",
    )
    await sql(
        engine,
        "INSERT INTO periodic_jobs (name, spec, timezone, task_type, options, enabled) "
        "VALUES ('by.sql', '@daily', 'UTC', 't', '{}', false)",
    )
    items = (await changes(client, sid))["items"]
    assert [i["action"] for i in items] == ["resumed", "updated", "paused", "updated", "created"]
    assert [i["source"] for i in items[:-1]] == ["sql"] * 4 and items[-1]["source"] == "api"
    # The actor of plain SQL: the database role on PostgreSQL, the account on MariaDB/MySQL;
    # SQLite has none.
    actor = None if on_sqlite(engine) else "postgres"
    if engine.dialect.name == "mysql":
        async with engine.connect() as conn:
            actor = (await conn.execute(text("SELECT CURRENT_USER()"))).scalar_one()
    assert {i["actor"] for i in items[:-1]} == {actor}
    resumed, noted, paused, edited = items[:4]
    assert edited["changes"] == {
        "spec": field(JOB["spec"], "0 * * * *"),
        "description": field(None, "by hand"),
    }
    assert paused["changes"] == {"enabled": field(True, False)}
    assert noted["changes"] == {"paused_note": field(None, "why")}
    assert resumed["changes"]["enabled"] == field(False, True)
    for item in items:
        assert item["at"] is not None
    other = (await client.get("/schedules/by-name/by.sql")).json()["id"]
    [born] = (await changes(client, other))["items"]
    assert born["action"] == "created" and born["source"] == "sql"
    assert born["changes"]["enabled"] == field(None, False)
    # Deleted with SQL: recorded, and the id still answers.
    await sql(engine, f"DELETE FROM periodic_jobs WHERE id = {other}")
    gone = (await changes(client, other))["items"]
    assert [(i["action"], i["source"]) for i in gone] == [("deleted", "sql"), ("created", "sql")]


@pytest.mark.parametrize("backend", ["postgresql"])  # transaction-local settings are PostgreSQL's
async def test_a_setting_naming_another_source_is_sql_unless_known(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    s = await create(client)
    await sql(
        engine,
        "SELECT set_config('periodic_manager.source', 'root', true)",
        "SELECT set_config('periodic_manager.at', '12:00 tomorrow', true)",
        "UPDATE periodic_jobs SET description = 'x'",
    )
    [item, _] = (await changes(client, s["id"]))["items"]
    assert item["source"] == "sql" and item["actor"] == "postgres" and item["at"] is not None


async def test_import_is_recorded_as_import(
    client: httpx.AsyncClient, engine: AsyncEngine, clock: VirtualClock
) -> None:
    s = await create(client)
    keep = await create(client, name="gone")
    await clock.advance(60)
    entries = [
        {**JOB, "spec": "@hourly", "enabled": False},
        {"name": "new", "spec": "@daily", "task_type": "t"},
    ]
    plan = await import_export.plan(engine, sio.validate(entries), True)
    await import_export.apply(engine, plan, clock.now())
    [item, _] = (await changes(client, s["id"]))["items"]
    assert (item["action"], item["source"], item["actor"]) == ("paused", "import", None)
    assert item["at"] == iso(T0 + timedelta(seconds=60))
    assert item["changes"] == {"spec": field(JOB["spec"], "@hourly"), "enabled": field(True, False)}
    deleted = (await changes(client, keep["id"]))["items"][0]
    assert (deleted["action"], deleted["source"]) == ("deleted", "import")
    new = (await client.get("/schedules/by-name/new")).json()["id"]
    [born] = (await changes(client, new))["items"]
    assert (born["action"], born["source"], born["at"]) == ("created", "import", iso(clock.now()))


async def test_hostile_values_are_cut_and_read_safely(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    s = await create(client)
    sid = s["id"]
    big = "é" * 5000
    await sql(engine, f"UPDATE periodic_jobs SET description = '{big}'")
    if on_sqlite(engine):
        # Bytes that are no text, and a payload that is no JSON: kept as stored.
        await sql(engine, "UPDATE periodic_jobs SET spec = x'ff00fe', payload = '{not json'")
    [item, *_] = (await changes(client, sid))["items"]
    if on_sqlite(engine):
        assert item["changes"]["spec"] == field(JOB["spec"], "x'FF00FE'")
        assert item["changes"]["payload"] == field(None, "{not json")
        item = (await changes(client, sid))["items"][1]
    assert item["changes"]["description"] == field(None, "é" * 2000, truncated=True)
    # Entries written there by hand: unreadable cells are null, the page still answers.
    nested = "[" * 5000 + "]" * 5000
    await sql(
        engine,
        "INSERT INTO pm_schedule_changes (schedule_id, name, at, action, source, actor, changes) "
        f"VALUES ({sid}, 'n', CURRENT_TIMESTAMP, 'updated', 'sql', NULL, 'not json'), "
        f"({sid}, 'n', CURRENT_TIMESTAMP, 'updated', 'sql', NULL, '{nested}'), "
        f"({sid}, 'n', CURRENT_TIMESTAMP, 'updated', 'sql', NULL, "
        '\'{"spec": 5, "bogus": {}, "payload": {"before": "' + nested + '"}, '
        '"options": {"before": 7, "after": "[1]"}}\')',
    )
    if on_sqlite(engine):
        await sql(engine, "UPDATE pm_schedule_changes SET at = x'00ff' WHERE name = 'n'")
    items = (await changes(client, sid, limit=3))["items"]
    assert [i["changes"] for i in items[1:]] == [None, None]
    assert items[0]["changes"] == {
        "payload": field(nested, None),
        "options": field(None, [1]),
    }
    if on_sqlite(engine):
        assert {i["at"] for i in items} == {None}


async def test_the_store_prunes_by_age_and_by_count(
    client: httpx.AsyncClient, engine: AsyncEngine, clock: VirtualClock
) -> None:
    a = await create(client, name="a")
    b = await create(client, name="b")
    for n in range(6):
        r = await client.patch(f"/schedules/{a['id']}", json={"description": f"v{n}"})
        assert r.status_code == 200
    assert (await client.delete(f"/schedules/{b['id']}")).status_code == 204
    assert (await changes(client, a["id"]))["total"] == 7
    assert (await changes(client, b["id"]))["total"] == 2

    store = DatabaseRuntimeStore(
        engine, changes_retention=timedelta(days=90), changes_per_schedule=3
    )
    # By count: each schedule keeps its newest three.
    assert await store.prune_changes(clock.now()) == 4
    page = await changes(client, a["id"])
    assert [i["changes"]["description"]["after"] for i in page["items"]] == ["v5", "v4", "v3"]
    # By age: 90 days after the writes, everything goes; a deleted id then is 404.
    assert await store.prune_changes(clock.now() + timedelta(days=90, seconds=1)) == 5
    assert (await changes(client, a["id"]))["total"] == 0
    assert_problem(await client.get(f"/schedules/{b['id']}/changes"), 404)


def test_the_tracked_columns_are_the_migrations() -> None:
    import importlib
    import pkgutil

    from periodic_manager import migrations

    versions = importlib.import_module(f"{migrations.__name__}.versions")
    [name] = [
        m.name for m in pkgutil.iter_modules(versions.__path__) if "0012_change_history" in m.name
    ]
    migration = importlib.import_module(f"{versions.__name__}.{name}")
    assert migration.TRACKED == change_history.TRACKED
    assert migration.CUT == change_history.CUT
