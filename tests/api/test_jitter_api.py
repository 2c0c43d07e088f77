"""options.jitter through the API: a 422 naming the field for a bad value or one not under the
schedule's shortest gap (POST and PATCH, the old version kept), a row error for one written with
SQL, and previews (next_runs) showing the nominal slots."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.db.models import jobs_table
from tests.support.api import JOB, T0, assert_error, create


@pytest.mark.parametrize(
    ("spec", "jitter", "words"),
    [
        ("@hourly", True, "number of seconds"),
        ("@hourly", "30", "number of seconds"),
        ("@hourly", 0, "> 0"),
        ("@hourly", -5, "> 0"),
        ("@hourly", 10**30, "at most 31622400"),
        ("@hourly", 3600, "shortest gap between slots (3600 s)"),
        ("@every 90s", 90.5, "shortest gap between slots (90 s)"),
        ("*/15 * * * *", 900, "shortest gap between slots (900 s)"),
    ],
)
async def test_a_bad_jitter_is_a_422_naming_the_field(
    client: httpx.AsyncClient, spec: str, jitter: Any, words: str
) -> None:
    r = await client.post("/schedules", json={**JOB, "spec": spec, "options": {"jitter": jitter}})
    assert_error(r, 422, ["body", "options", "jitter"])
    assert words in r.json()["errors"][0]["reason"]


async def test_a_good_jitter_keeps_nominal_previews_and_a_bad_patch_keeps_the_old_version(
    client: httpx.AsyncClient,
) -> None:
    plain = await create(client, name="plain")
    made = await create(client, options={"jitter": 30})
    assert made["options"] == {"jitter": 30}
    assert made["next_runs"] == plain["next_runs"]  # nominal slots, not send instants
    r = await client.patch(
        f"/schedules/{made['id']}", json={"spec": "* * * * *", "options": {"jitter": 60}}
    )
    assert_error(r, 422, ["body", "options", "jitter"])
    kept = (await client.get(f"/schedules/{made['id']}")).json()
    assert kept["options"] == {"jitter": 30} and kept["spec"] == made["spec"]


async def test_a_row_written_with_sql_with_a_bad_jitter_is_a_row_error(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    async with engine.begin() as conn:
        row_id = (
            await conn.execute(
                insert(jobs_table)
                .values(
                    name="by.sql",
                    spec="@every 10s",
                    task_type="t",
                    created_at=T0,
                    updated_at=T0,
                    options={"jitter": 10},
                )
                .returning(jobs_table.c.id)
            )
        ).scalar_one()
    body = (await client.get(f"/schedules/{row_id}")).json()
    [error] = body["errors"]
    assert error["field"] == "options.jitter" and "shortest gap" in error["reason"]
    assert body["status"] == "error"
