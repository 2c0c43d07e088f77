"""API contract items of issue 11 and the agreement of the API with the manager on odd rows, on
PostgreSQL and SQLite: no-op PATCHes, the payload size limit (413), the OpenAPI document's
nullability, what ``enabled`` and ``options`` mean whoever wrote them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.api import create_app
from periodic_manager.clock import VirtualClock
from periodic_manager.db.engine import reads_bytes
from periodic_manager.db.judge import Rules, judge_content
from periodic_manager.db.provider import DatabaseProvider
from periodic_manager.db.rows import columns
from periodic_manager.settings import Settings
from tests.support import rawsql
from tests.support.api import JOB, assert_error, assert_problem, create


def url_of(engine: AsyncEngine) -> str:
    return engine.url.render_as_string(hide_password=False)


# --- PATCH that changes nothing -----------------------------------------------------------------


async def test_an_empty_patch_changes_nothing(
    client: httpx.AsyncClient, clock: VirtualClock
) -> None:
    job = await create(client, payload={"n": 1}, options={"queue": "q"})
    before = await client.get(f"/schedules/{job['id']}")
    clock.set(clock.now() + timedelta(minutes=5))  # a write now would show a new updated_at
    r = await client.patch(f"/schedules/{job['id']}", json={})
    assert r.status_code == 200, r.text
    assert r.headers["etag"] == before.headers["etag"]
    assert r.json()["updated_at"] == before.json()["updated_at"] == job["updated_at"]
    after = await client.get(f"/schedules/{job['id']}")
    assert after.headers["etag"] == before.headers["etag"]


async def test_a_patch_sending_the_stored_values_changes_nothing(
    client: httpx.AsyncClient, clock: VirtualClock
) -> None:
    job = await create(
        client, payload={"n": 1, "a": [1, 2]}, anchor="2024-01-01T02:00:00+02:00", spec="@every 1h"
    )
    tag = (await client.get(f"/schedules/{job['id']}")).headers["etag"]
    clock.set(clock.now() + timedelta(minutes=5))
    same = {
        "name": job["name"],
        "spec": job["spec"],
        "payload": {"a": [1, 2], "n": 1},  # keys in another order: the same JSON
        "options": {},
        "enabled": True,
        "anchor": "2024-01-01T00:00:00Z",  # the same instant, written another way
        "description": None,
    }
    r = await client.patch(f"/schedules/{job['id']}", json=same)
    assert r.status_code == 200, r.text
    assert r.headers["etag"] == tag and r.json()["updated_at"] == job["updated_at"]
    # A value that differs only in JSON type is a change (1 is not 1.0 is not true).
    r = await client.patch(f"/schedules/{job['id']}", json={"payload": {"a": [1, 2], "n": 1.0}})
    assert r.headers["etag"] != tag and r.json()["updated_at"] != job["updated_at"]


# --- size limit ---------------------------------------------------------------------------------


async def test_payload_or_options_over_the_limit_is_413_naming_the_field(
    client: httpx.AsyncClient,
) -> None:
    big = "x" * 65_536  # 65,538 bytes as JSON text: just over the default 64 KiB
    r = await client.post("/schedules", json={**JOB, "payload": big})
    body = assert_problem(r, 413)
    assert body["type"].endswith(":payload-too-large")
    assert body["errors"][0]["field"] == "payload" and body["errors"][0]["code"] == "too-large"
    r = await client.post("/schedules", json={**JOB, "options": {"extra": {"blob": big}}})
    assert assert_problem(r, 413)["errors"][0]["field"] == "options"

    job = await create(client, payload="x" * 65_000)  # under the limit
    r = await client.patch(f"/schedules/{job['id']}", json={"payload": big})
    assert assert_problem(r, 413)["errors"][0]["field"] == "payload"
    assert (await client.get(f"/schedules/{job['id']}")).json()["payload"] == "x" * 65_000


async def test_the_limit_is_a_setting_counted_in_utf8_bytes(
    db_url: str, engine: AsyncEngine, clock: VirtualClock
) -> None:
    app = create_app(
        Settings(database_url=db_url, max_payload_bytes=100), clock=clock, engine=engine
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            # 49 two-byte characters: 51 characters of JSON but 100 bytes; one more is over.
            assert (
                await c.post("/schedules", json={**JOB, "payload": "é" * 49})
            ).status_code == 201
            r = await c.post("/schedules", json={**JOB, "name": "b", "payload": "é" * 50})
            assert_problem(r, 413)
            # A stored row over the limit (written with SQL): shown with the error, payload null.
            row = await rawsql.insert(url_of(engine), "sql.big", payload="'\"" + "y" * 200 + "\"'")
            got = (await c.get(f"/schedules/{row}")).json()
            assert got["payload"] is None and got["errors"][0]["field"] == "payload"
            assert "202 bytes" in got["errors"][0]["reason"]


# --- the OpenAPI document -----------------------------------------------------------------------


async def test_openapi_declares_only_clearable_patch_fields_nullable(
    client: httpx.AsyncClient,
) -> None:
    doc = (await client.get("/openapi.json")).json()
    props = doc["components"]["schemas"]["ScheduleUpdate"]["properties"]

    def nullable(schema: dict[str, Any]) -> bool:
        return any(s.get("type") == "null" for s in schema.get("anyOf", [])) or "type" not in schema

    assert {name for name, s in props.items() if nullable(s)} == {
        "payload",
        "description",
        "anchor",
    }
    assert all("default" not in s for s in props.values())
    for name in ("name", "spec", "timezone", "task_type", "options", "enabled"):
        r = await client.patch("/schedules/1", json={name: None})
        assert_error(r, 422, ["body", name])
    patch = doc["paths"]["/schedules/{schedule_id}"]["patch"]["responses"]
    assert "413" in patch and "413" in doc["paths"]["/schedules"]["post"]["responses"]
    schedule = doc["components"]["schemas"]["Schedule"]["properties"]
    assert schedule["options"]["type"] == "object" and "errors" in schedule


# --- enabled and options, whoever wrote them ----------------------------------------------------


async def test_options_null_reads_as_no_options_for_the_api_and_the_manager(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    row = await rawsql.insert(url_of(engine), "sql.null.options", options="'null'")
    got = (await client.get(f"/schedules/{row}")).json()
    assert got["options"] == {} and got["errors"] == [] and got["next_runs"]
    [config] = (await DatabaseProvider(engine).get_configs()).configs
    assert config.schedule_id == row and dict(config.options) == {}


@pytest.mark.parametrize("backend", ["sqlite"])  # PostgreSQL's boolean holds true or false only
async def test_enabled_neither_true_nor_false_is_an_error_for_both(
    client: httpx.AsyncClient, engine: AsyncEngine, backend: str
) -> None:
    url = url_of(engine)
    odd = {
        label: await rawsql.insert(url, f"odd.{label}", enabled=sql)
        for label, sql in [("yes", "'yes'"), ("two", "2"), ("blob", "X'31'"), ("text-one", "'1'")]
    }
    on = await rawsql.insert(url, "on", enabled="1")
    off = await rawsql.insert(url, "off", enabled="0")
    # '1' as text is stored as the integer 1 (numeric affinity); X'31' is the bytes of "1".
    truly_odd = {odd["yes"], odd["two"]}
    enabled_ids = {on, odd["blob"], odd["text-one"]}

    async def ids(**params: Any) -> set[int]:
        return {i["id"] for i in (await client.get("/schedules", params=params)).json()["items"]}

    assert await ids(enabled="true") == enabled_ids
    assert await ids(enabled="false") == {off}
    for row in truly_odd:
        got = (await client.get(f"/schedules/{row}")).json()
        assert got["enabled"] is None and got["errors"][0]["field"] == "enabled", got
    snap = await DatabaseProvider(engine).get_configs()
    assert {c.schedule_id for c in snap.configs} == enabled_ids
    assert {(e.schedule_id, e.field) for e in snap.errors} == {(r, "enabled") for r in truly_odd}


async def test_unreadable_description_or_timestamp_is_shown_as_null_and_does_not_stop_the_row(
    client: httpx.AsyncClient, engine: AsyncEngine, backend: str
) -> None:
    url = url_of(engine)
    if backend == "sqlite":
        cols = {"description": "X'FF'", "created_at": "'the day before'"}
    elif backend == "mysql":  # zero dates
        cols = {"created_at": "'0000-00-00 00:00:00'", "updated_at": "'2024-00-00 00:00:00'"}
    else:
        cols = {"created_at": "'10000-01-01 00:00:00+00'", "updated_at": "'infinity'"}
    row = await rawsql.insert(url, "odd.columns", **cols)
    got = (await client.get(f"/schedules/{row}")).json()
    for column in cols:
        assert got[column] is None
    assert {e["field"] for e in got["errors"]} == set(cols)
    assert got["next_runs"], "a column only people read does not make the row unusable"
    assert [c.schedule_id for c in (await DatabaseProvider(engine).get_configs()).configs] == [row]
    # A PATCH of another field leaves the unreadable column as it is, and works.
    r = await client.patch(f"/schedules/{row}", json={"spec": "@every 1m"})
    assert r.status_code == 200 and r.json()["spec"] == "@every 1m", r.text
    r = await client.post(f"/schedules/{row}/trigger")
    assert r.status_code == 202, r.text


async def test_the_manager_and_the_api_use_the_same_target_check(
    db_url: str, engine: AsyncEngine, clock: VirtualClock
) -> None:
    row = await rawsql.insert(url_of(engine), "to.celery", options="""'{"target": "celery"}'""")
    app = create_app(Settings(database_url=db_url, target="outbox"), clock=clock, engine=engine)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            got = (await c.get(f"/schedules/{row}")).json()
    assert got["errors"][0]["field"] == "options.target" and got["next_runs"] == []


async def test_the_api_stamps_effective_at_with_its_clock_on_creation_timing_edits_and_resume(
    client: httpx.AsyncClient, engine: AsyncEngine, clock: VirtualClock
) -> None:
    async def effective_at(row_id: int) -> Any:
        sqlite = reads_bytes(engine)
        async with engine.connect() as conn:
            [raw] = (
                await conn.execute(select(*columns(sqlite)).where(columns(sqlite)[0] == row_id))
            ).all()
        config = judge_content(Rules(sqlite), tuple(raw))  # paused rows too
        assert not hasattr(config, "field"), config
        return config.effective_at  # type: ignore[union-attr]

    job = await create(client)
    born = clock.now()
    assert await effective_at(job["id"]) == born
    for body, moves in [
        ({"payload": {"n": 1}, "task_type": "other", "description": "d"}, False),
        ({"spec": "*/5 * * * *"}, True),
        ({"options": {"queue": "q"}}, False),
        ({"name": "renamed"}, True),
        ({"timezone": "Europe/Berlin"}, True),
        ({"anchor": "2024-01-01T00:00:00Z"}, True),
    ]:
        before = await effective_at(job["id"])
        clock.set(clock.now() + timedelta(minutes=1))
        r = await client.patch(f"/schedules/{job['id']}", json=body)
        assert r.status_code == 200, r.text
        assert await effective_at(job["id"]) == (clock.now() if moves else before), body
    clock.set(clock.now() + timedelta(minutes=1))
    await client.post(f"/schedules/{job['id']}/pause")
    paused_at = await effective_at(job["id"])
    assert paused_at != clock.now()  # pausing starts nothing
    clock.set(clock.now() + timedelta(minutes=1))
    await client.post(f"/schedules/{job['id']}/resume")
    assert await effective_at(job["id"]) == clock.now()


async def test_sqlite_check_merge_write_holds_the_write_lock_against_other_writers(
    tmp_path: Any,
) -> None:
    """SQLite has no row locks: the API's read of a row it is about to change (PATCH, DELETE,
    pause, resume) takes the database's write lock, so a plain-SQL writer in between waits and
    If-Match cannot be checked against a row that changes before the write."""
    import sqlite3

    from periodic_manager.db import schedule_reader, schedule_writer
    from periodic_manager.db.engine import create_engine
    from periodic_manager.db.migrate import upgrade

    path = tmp_path / "lock.db"
    url = f"sqlite+aiosqlite:///{path}"
    await upgrade(url)
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO periodic_jobs (name, spec, task_type) VALUES ('j', '@every 1s', 't')"
        )
    engine = create_engine(url)
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        async with engine.connect() as conn:
            assert await schedule_writer.lock(conn, 1) is not None
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("UPDATE periodic_jobs SET description = 'meanwhile' WHERE name = 'j'")
            await conn.commit()
        other.execute("UPDATE periodic_jobs SET description = 'after' WHERE name = 'j'")
        # A plain read takes no write lock (a GET never blocks writers).
        async with engine.connect() as conn:
            await schedule_reader.row_named(conn, "j")
            other.execute("UPDATE periodic_jobs SET description = 'during a read' WHERE name = 'j'")
    finally:
        other.close()
        await engine.dispose()
