"""``POST /schedules/{id}/pause`` with an optional note: the note, when and by whom are stored,
shown as ``paused`` while the schedule is paused and cleared when it resumes; plain SQL pauses are
by ``sql``; the columns are untrusted on read; none of it is part of a schedule's content."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.clock import VirtualClock
from periodic_manager.db.engine import on_sqlite
from periodic_manager.db.provider import DatabaseProvider
from periodic_manager.schedules.definition import PeriodicTaskConfig
from tests.support.api import T0, assert_error, create, iso


async def test_pause_with_a_note_is_stored_and_shown_and_resume_clears_it(
    client: httpx.AsyncClient, clock: VirtualClock
) -> None:
    s = await create(client)
    assert s["paused"] is None
    await clock.advance(5)
    r = await client.post(f"/schedules/{s['id']}/pause", json={"note": "db maintenance ✓"})
    assert r.status_code == 200, r.text
    paused = {"note": "db maintenance ✓", "at": iso(T0 + timedelta(seconds=5)), "by": "api"}
    assert r.json()["paused"] == paused and r.json()["status"] == "paused"
    got = await client.get(f"/schedules/{s['id']}")
    assert got.json()["paused"] == paused
    listed = (await client.get("/schedules")).json()["items"]
    assert [i["paused"] for i in listed] == [paused]
    # Pausing again changes nothing: the first note stays.
    again = await client.post(f"/schedules/{s['id']}/pause", json={"note": "other"})
    assert again.json()["paused"] == paused and again.headers["etag"] == got.headers["etag"]

    r = await client.post(f"/schedules/{s['id']}/resume")
    assert r.status_code == 200, r.text
    assert r.json()["paused"] is None
    # Paused again without a body: no note, stamped anew.
    r = await client.post(f"/schedules/{s['id']}/pause")
    assert r.status_code == 200, r.text
    assert r.json()["paused"] == {"note": None, "at": iso(T0 + timedelta(seconds=5)), "by": "api"}
    r = await client.post(f"/schedules/{s['id']}/resume")
    r = await client.post(f"/schedules/{s['id']}/pause", json={})
    assert r.status_code == 200 and r.json()["paused"]["note"] is None
    # Created paused: by the API, at its creation.
    created = await create(client, name="born.paused", enabled=False)
    assert created["paused"] == {"note": None, "at": iso(T0 + timedelta(seconds=5)), "by": "api"}


@pytest.mark.parametrize(
    "body",
    [
        {"note": 5},
        {"note": ["x"]},
        {"note": "x" * 501},
        {"note": "a\nb"},
        {"note": "a\x00b"},
        {"note": "a\x1b[31m"},
        {"note": "\u0085"},
    ],
)
async def test_a_bad_note_is_422_naming_note(client: httpx.AsyncClient, body: object) -> None:
    s = await create(client)
    r = await client.post(f"/schedules/{s['id']}/pause", json=body)
    assert_error(r, 422, ["body", "note"])
    assert (await client.get(f"/schedules/{s['id']}")).json()["enabled"] is True


async def test_unknown_fields_are_refused_and_a_note_of_500_is_fine(
    client: httpx.AsyncClient,
) -> None:
    s = await create(client)
    r = await client.post(f"/schedules/{s['id']}/pause", json={"notes": "x"})
    assert_error(r, 422, ["body", "notes"])
    r = await client.post(f"/schedules/{s['id']}/pause", json={"note": "é" * 500})
    assert r.status_code == 200 and r.json()["paused"]["note"] == "é" * 500


async def test_sql_pause_is_by_sql_and_sql_resume_clears(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    s = await create(client)
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE periodic_jobs SET enabled = false"))
    paused = (await client.get(f"/schedules/{s['id']}")).json()["paused"]
    assert paused["by"] == "sql" and paused["note"] is None and paused["at"] is not None
    # The API resumes it, SQL pauses it, SQL resumes it.
    assert (await client.post(f"/schedules/{s['id']}/resume")).json()["paused"] is None
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE periodic_jobs SET enabled = false, paused_note = 'by hand'")
        )
    paused = (await client.get(f"/schedules/{s['id']}")).json()["paused"]
    assert (paused["by"], paused["note"]) == ("sql", "by hand")
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE periodic_jobs SET enabled = true"))
    async with engine.connect() as conn:
        row = (
            await conn.execute(text("SELECT paused_note, paused_at, paused_by FROM periodic_jobs"))
        ).one()
    assert tuple(row) == (None, None, None)
    # A PATCH that pauses is by the API too.
    r = await client.patch(f"/schedules/{s['id']}", json={"enabled": False})
    assert r.json()["paused"]["by"] == "api"


async def test_hostile_pause_columns_read_as_null_with_an_error(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    s = await create(client, enabled=False)
    sqlite = on_sqlite(engine)
    async with engine.begin() as conn:
        if sqlite:
            await conn.execute(
                text(
                    "UPDATE periodic_jobs SET paused_note = X'FF00', paused_at = 'yesterday',"
                    " paused_by = 7"
                )
            )
        else:  # no instant: infinity, or MariaDB/MySQL's zero date
            at = "'infinity'" if engine.dialect.name == "postgresql" else "'0000-00-00 00:00:00'"
            await conn.execute(
                text(f"UPDATE periodic_jobs SET paused_at = {at}, paused_by = 'ops'")
            )
    r = await client.get(f"/schedules/{s['id']}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["paused"]["at"] is None
    fields = {e["field"] for e in body["errors"]}
    assert "paused_at" in fields
    if sqlite:
        assert body["paused"]["note"] is None and "paused_note" in fields
        assert body["paused"]["by"] == "7"
    else:
        assert body["paused"]["by"] == "ops"
    assert body["status"] == "paused"  # only shown, never judged: the row stays usable
    assert (await client.post(f"/schedules/{s['id']}/resume")).json()["paused"] is None
    assert (await client.get("/schedules")).status_code == 200


async def test_the_note_is_no_part_of_the_schedule_content(
    client: httpx.AsyncClient, engine: AsyncEngine, clock: VirtualClock
) -> None:
    """Pausing with a note then resuming leaves the row as a pause without one would (the same
    stamps, nothing of the pause left); a stray note on an enabled row changes no content hash
    (nothing a manager compares, so no entry restarts)."""
    a = await create(client, name="a")
    b = await create(client, name="b")
    await clock.advance(5)
    await client.post(f"/schedules/{a['id']}/pause", json={"note": "why"})
    await client.post(f"/schedules/{b['id']}/pause")
    await clock.advance(5)
    await client.post(f"/schedules/{a['id']}/resume")
    await client.post(f"/schedules/{b['id']}/resume")
    ra = (await client.get(f"/schedules/{a['id']}")).json()
    rb = (await client.get(f"/schedules/{b['id']}")).json()
    for key in ("updated_at", "next_runs", "status", "paused", "errors"):
        assert ra[key] == rb[key], key
    assert ra["paused"] is None and ra["updated_at"] == iso(T0 + timedelta(seconds=10))
    query = (
        "SELECT effective_at, paused_note, paused_at, paused_by FROM periodic_jobs ORDER BY name"
    )
    async with engine.connect() as conn:
        rows = [tuple(r) for r in (await conn.execute(text(query))).all()]
    assert rows[0] == rows[1] and rows[0][1:] == (None, None, None)

    def hashes(configs: Sequence[PeriodicTaskConfig]) -> dict[str, str]:
        return {c.name: c.content_hash for c in configs}

    before = hashes((await DatabaseProvider(engine).get_configs()).configs)
    assert set(before) == {"a", "b"}
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE periodic_jobs SET paused_note = 'stray', paused_by = 'x'"))
    assert hashes((await DatabaseProvider(engine).get_configs()).configs) == before
    assert (await client.get(f"/schedules/{a['id']}")).json()["paused"] is None  # not paused
