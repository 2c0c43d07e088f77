"""options.max_runs through the API: a 422 naming options.max_runs for a bad value (POST and
PATCH, the old version kept), a row error for one written with SQL, runs_left (null without
the option) and every preview (next_runs, the dashboard's slots and list, ``periodic-manager
next --max-runs``) showing no slot past the last run."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.db.models import jobs_table, schedule_state_table
from tests.support.api import JOB, T0, assert_error, create


@pytest.mark.parametrize(
    "value", [0, -1, 1_000_000_001, True, False, 2.0, "3", None, [3], {"n": 3}]
)
async def test_a_bad_max_runs_is_a_422_naming_it(client: httpx.AsyncClient, value: Any) -> None:
    r = await client.post("/schedules", json={**JOB, "options": {"max_runs": value}})
    assert_error(r, 422, ["body", "options", "max_runs"])
    assert "must be an integer from 1 to 1000000000" in r.json()["errors"][0]["reason"]


async def test_the_bounds_of_max_runs_are_accepted(client: httpx.AsyncClient) -> None:
    for n in (1, 1_000_000_000):
        made = await create(client, name=f"n{n}", options={"max_runs": n})
        assert made["runs_left"] == n and len(made["next_runs"]) == min(n, 3)


async def test_a_bad_patch_keeps_the_old_version(client: httpx.AsyncClient) -> None:
    made = await create(client, options={"max_runs": 2})
    r = await client.patch(f"/schedules/{made['id']}", json={"options": {"max_runs": True}})
    assert_error(r, 422, ["body", "options", "max_runs"])
    kept = (await client.get(f"/schedules/{made['id']}")).json()
    assert kept["options"] == {"max_runs": 2} and kept["runs_left"] == 2


async def test_runs_left_is_null_without_max_runs(client: httpx.AsyncClient) -> None:
    made = await create(client)
    assert made["runs_left"] is None and len(made["next_runs"]) == 3
    assert (await client.get(f"/schedules/{made['id']}")).json()["runs_left"] is None


async def test_a_row_written_with_sql_with_a_bad_max_runs_is_a_row_error(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    async with engine.begin() as conn:
        row_id = (
            await conn.execute(
                insert(jobs_table)
                .values(
                    name="by.sql",
                    spec="@hourly",
                    task_type="t",
                    created_at=T0,
                    updated_at=T0,
                    options={"max_runs": "ten"},
                )
                .returning(jobs_table.c.id)
            )
        ).scalar_one()
    body = (await client.get(f"/schedules/{row_id}")).json()
    [error] = body["errors"]
    assert error["field"] == "options.max_runs" and "integer from 1" in error["reason"]
    assert body["next_runs"] == [] and body["status"] == "error"
    slots = (await client.get(f"/views/schedules/{row_id}/slots")).json()
    assert slots["slots"] == [] and slots["error"].startswith("options.max_runs")


async def test_every_preview_stops_after_the_last_run(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    made = await create(client, options={"max_runs": 5})
    sid = made["id"]
    # Three runs recorded, as a manager writes them.
    async with engine.begin() as conn:
        await conn.execute(
            insert(schedule_state_table).values(
                schedule_key=str(sid),
                name=JOB["name"],
                updated_at=T0,
                runs_count=3,
                last_done_at=T0,
            )
        )
    got = (await client.get(f"/schedules/{sid}")).json()
    assert got["runs_left"] == 2 and len(got["next_runs"]) == 2 and got["status"] == "active"
    slots = (await client.get(f"/views/schedules/{sid}/slots", params={"n": 10})).json()
    assert [s["at"] for s in slots["slots"]] == got["next_runs"]
    [row] = (await client.get("/views/schedules")).json()["items"]
    assert row["status"] == "active"
    async with engine.begin() as conn:
        await conn.execute(schedule_state_table.update().values(runs_count=5))
    got = (await client.get(f"/schedules/{sid}")).json()
    assert got["runs_left"] == 0 and got["next_runs"] == [] and got["status"] == "ended"
    slots = (await client.get(f"/views/schedules/{sid}/slots")).json()
    assert slots["slots"] == [] and slots["error"] is None
    [row] = (await client.get("/views/schedules")).json()["items"]
    assert row["status"] == "ended"
