"""The runtime tables (``pm_runs``, ``pm_managers``, ``pm_entries``, ``pm_schedule_state``) are
written by managers, but anyone with SQL access can write them too: every endpoint that reads
them decodes each row alone and shows a broken value as unknown (null), never a 500."""

from __future__ import annotations

from datetime import timedelta

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.api.test_api import T0, create

pytest_plugins = ["tests.api.test_api"]  # the clock, engine and client fixtures

LIVE = (T0 - timedelta(seconds=1)).strftime("%Y-%m-%d %H:%M:%S")


def _hostile(backend: str) -> dict[str, str]:
    """SQL literals the database accepts in a column of that type but no reader expects."""
    if backend == "sqlite":  # any value of any type
        return {
            "instant": "'not a time'",
            "instant2": "X'FFFE'",
            "int": "'many'",
            "int4": "'many'",
            "huge": "1e400",  # +Infinity as a REAL
            "text": "X'FF00C3'",  # not UTF-8
            "bool": "'yes'",
        }
    if backend == "mysql":  # zero dates; a TINYINT that is neither 0 nor 1
        return {
            "instant": "'0000-00-00 00:00:00'",
            "instant2": "'2024-00-00 00:00:00'",
            "int": "9223372036854775807",
            "int4": "-2147483648",
            "huge": "2147483647",
            "text": "'x'",
            "bool": "2",
        }
    return {  # PostgreSQL enforces types, not Python's ranges
        "instant": "'infinity'",
        "instant2": "'20000-01-01 00:00:00+00'",
        "int": "9223372036854775807",
        "int4": "-2147483648",
        "huge": "2147483647",
        "text": "'x'",
        "bool": "TRUE",
    }


async def _write(engine: AsyncEngine, backend: str, schedule_id: int) -> None:
    h = _hostile(backend)
    key = f"'{schedule_id}'"
    live = f"'{LIVE}+00'" if backend == "postgresql" else f"'{LIVE}'"
    statements = [
        # A manager: live by its heartbeat, every other column hostile.
        "INSERT INTO pm_managers (manager_id, hostname, pid, version, started_at, heartbeat_at,"
        f" is_leader, last_sync_at, last_sync_error, entry_count) VALUES ('m1', {h['text']},"
        f" {h['int4']}, {h['text']}, {h['instant']}, {live}, {h['bool']}, {h['instant2']},"
        f" {h['text']}, {h['huge']})",
        # Entries of it: hostile instants and text.
        "INSERT INTO pm_entries (manager_id, entry_id, schedule_key, name, content_hash, status,"
        " registered_at, anchor, held_slot_at, last_good_since, last_error) VALUES ('m1', 'e1',"
        f" {key}, {h['text']}, {h['text']}, 'error', {h['instant']}, {h['instant2']},"
        f" {h['instant']}, {h['instant2']}, {h['text']})",
        "INSERT INTO pm_entries (manager_id, entry_id, schedule_key, name, content_hash, status,"
        f" registered_at) VALUES ('m1', 'e2', {key}, 'n', 'h', {h['text']}, {h['instant2']})",
        # State: hostile counts and instants.
        "INSERT INTO pm_schedule_state (schedule_key, name, last_slot_at, last_done_at,"
        " last_enqueued_at, last_message_id, last_status, last_error, enqueued_count,"
        f" duplicate_count, skipped_count, updated_at) VALUES ({key}, {h['text']},"
        f" {h['instant']}, {h['instant2']}, {h['instant']}, {h['text']}, {h['text']},"
        f" {h['text']}, {h['int']}, {h['huge']}, -1, {h['instant']})",
        # Runs: each one hostile in another column.
        "INSERT INTO pm_runs (schedule_key, name, slot_at, status, at, lateness_ms, message_id,"
        f" error) VALUES ({key}, 'n', {h['instant']}, 'enqueued', {live}, 5, {h['text']},"
        f" {h['text']})",
        "INSERT INTO pm_runs (schedule_key, name, slot_at, status, at, lateness_ms) VALUES"
        f" ({key}, 'n', {live}, {h['text']}, {h['instant2']}, {h['int']})",
        "INSERT INTO pm_runs (schedule_key, name, slot_at, status, at, lateness_ms) VALUES"
        f" ({key}, 'n', {live}, 'enqueued', {live}, {h['huge']})",
        "INSERT INTO pm_runs (schedule_key, name, slot_at, status, at, lateness_ms) VALUES"
        f" ({key}, 'n', {h['instant2']}, 'failed', {live}, -5)",
    ]
    async with engine.begin() as conn:
        for stmt in statements:
            await conn.execute(text(stmt))


async def test_hostile_runtime_rows_are_shown_never_a_500(
    client: httpx.AsyncClient, engine: AsyncEngine, backend: str
) -> None:
    schedule_id = (await create(client))["id"]
    await _write(engine, backend, schedule_id)
    paths = [
        f"/schedules/{schedule_id}/runs",
        f"/schedules/{schedule_id}/runs?status=enqueued",
        f"/schedules/{schedule_id}",
        "/schedules",
        "/entries",
        f"/entries?schedule_id={schedule_id}",
        "/managers",
        "/metrics",
        "/views/overview",
        "/views/managers",
        "/views/entries",
        "/views/schedules",
        f"/views/schedules/{schedule_id}/slots",
        "/ui",
    ]
    failed = {}
    for path in paths:
        try:
            r = await client.get(path)
        except Exception as exc:  # the app's exception, raised through the test transport
            failed[path] = (500, repr(exc)[:300])
            continue
        if r.status_code != 200:
            failed[path] = (r.status_code, r.text[:300])
    assert not failed, "\n".join(f"{p}: {v}" for p, v in failed.items())
    runs = (await client.get(f"/schedules/{schedule_id}/runs")).json()
    assert runs["total"] == 4 and len(runs["items"]) == 4
    managers = (await client.get("/managers")).json()["items"]
    assert [m["manager_id"] for m in managers] == ["m1"]
    entries = (await client.get("/entries")).json()["items"]
    assert sorted(e["entry_id"] for e in entries) == ["e1", "e2"]
    # Broken cells are shown as unknown, the rest of each row as stored.
    assert any(r["slot_at"] is None for r in runs["items"])
    assert any(r["at"] is None for r in runs["items"])
    if backend == "sqlite":  # 'many' and 1e400 are no lateness
        assert sum(r["lateness_ms"] is None for r in runs["items"]) == 2
    (m,) = managers
    assert m["started_at"] is None and m["last_sync_at"] is None
    assert m["is_leader"] is (backend == "postgresql")  # SQLite's 'yes', MySQL's 2 are not true
    by_id = {e["entry_id"]: e for e in entries}
    assert by_id["e1"]["registered_at"] is None and by_id["e2"]["registered_at"] is None
    state = (await client.get(f"/schedules/{schedule_id}")).json()["state"]
    assert state["last_slot_at"] is None
    expected = 0 if backend == "sqlite" else 9223372036854775807  # 'many' is no count
    assert state["counts"]["enqueued"] == expected
