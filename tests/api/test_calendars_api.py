"""Exclusion calendars through the API, on both databases: ``PUT /calendars/{name}`` checks the
name and the content (422 naming the field), ``GET`` shows dates (a holidays calendar: this year's
and next year's) and who names it; ``options.exclude`` is a 422 naming the field when it names no
calendar or is malformed, and a PATCH that breaks it keeps the old version; a calendar written
badly with SQL is shown with its error and makes the schedules that name it row errors."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import T0, assert_error, create


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"dates": ["2026-13-01"]}, ["body", "dates[0]"]),
        ({"dates": ["2026-12-24", "24.12.2026"]}, ["body", "dates[1]"]),
        ({"dates": ["2026-12-24"], "holidays": {"country": "DE"}}, ["body", "calendar"]),
        ({}, ["body", "calendar"]),
        ({"holidays": {"country": "XX"}}, ["body", "holidays.country"]),
        ({"holidays": {"country": "DE", "subdiv": "QQ"}}, ["body", "holidays.subdiv"]),
        ({"dates": ["2026-01-01"] * 10_001}, ["body", "dates"]),
        ({"holidays": {"country": "DE", "city": "x"}}, ["body", "holidays", "city"]),
    ],
)
async def test_a_bad_calendar_is_a_422_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, Any], loc: list[str]
) -> None:
    r = await client.put("/calendars/c", json=body)
    assert_error(r, 422, loc)
    assert (await client.get("/calendars/c")).status_code == 404


@pytest.mark.parametrize("name", ["-x", "a b", "x" * 65, "ü"])
async def test_a_bad_calendar_name_is_a_422(client: httpx.AsyncClient, name: str) -> None:
    r = await client.put(f"/calendars/{name}", json={"dates": []})
    assert r.status_code == 422, r.text


async def test_put_get_and_who_names_it(client: httpx.AsyncClient) -> None:
    r = await client.put(
        "/calendars/xmas", json={"dates": ["2024-12-25", "2024-12-24", "2024-12-25"]}
    )
    assert r.status_code == 201, r.text
    assert r.json()["kind"] == "dates" and r.json()["dates"] == ["2024-12-24", "2024-12-25"]
    r = await client.put("/calendars/de", json={"holidays": {"country": "DE"}})
    assert r.status_code == 201
    # T0 is in 2026: the dates of 2026 and 2027 are shown.
    assert T0.year == 2026
    assert {"2026-10-03", "2027-10-03"} <= set(r.json()["dates"])
    assert "2025-10-03" not in r.json()["dates"]
    made = await create(client, options={"exclude": ["xmas", "de"]})
    assert made["options"] == {"exclude": ["xmas", "de"]}
    assert (await client.get("/calendars/xmas")).json()["used_by"] == [made["name"]]
    assert (await client.put("/calendars/xmas", json={"dates": []})).status_code == 200


@pytest.mark.parametrize(
    ("exclude", "loc", "words"),
    [
        (["nope"], ["body", "options", "exclude"], "no calendar named 'nope'"),
        ("xmas", ["body", "options", "exclude"], "list of 1 to 20"),
        ([], ["body", "options", "exclude"], "list of 1 to 20"),
        (["xmas", "xmas"], ["body", "options", "exclude"], "twice"),
        (["bad name"], ["body", "options", "exclude[0]"], "calendar name"),
    ],
)
async def test_a_bad_exclude_is_a_422_naming_the_field(
    client: httpx.AsyncClient, exclude: Any, loc: list[str], words: str
) -> None:
    assert (await client.put("/calendars/xmas", json={"dates": ["2024-12-25"]})).status_code == 201
    r = await client.post(
        "/schedules",
        json={"name": "x", "spec": "@daily", "task_type": "t", "options": {"exclude": exclude}},
    )
    assert_error(r, 422, loc)
    assert words in r.json()["errors"][0]["reason"], r.json()


async def test_a_patch_naming_a_missing_calendar_keeps_the_old_version(
    client: httpx.AsyncClient,
) -> None:
    assert (await client.put("/calendars/ok", json={"dates": []})).status_code == 201
    made = await create(client, options={"exclude": ["ok"]})
    r = await client.patch(f"/schedules/{made['id']}", json={"options": {"exclude": ["missing"]}})
    assert_error(r, 422, ["body", "options", "exclude"])
    assert (await client.get(f"/schedules/{made['id']}")).json()["options"] == {"exclude": ["ok"]}


async def test_a_calendar_written_badly_with_sql_is_shown_and_its_schedules_are_row_errors(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    assert (await client.put("/calendars/cal", json={"dates": ["2024-12-25"]})).status_code == 201
    made = await create(client, options={"exclude": ["cal"]})
    async with engine.begin() as conn:
        await conn.execute(text("""UPDATE pm_calendars SET spec = '{"dates": ["soon"]}'"""))
    got = (await client.get("/calendars/cal")).json()
    assert got["kind"] is None and "dates[0]" in got["error"], got
    body = (await client.get(f"/schedules/{made['id']}")).json()
    assert body["status"] == "error" and body["errors"][0]["field"] == "options.exclude"


async def test_a_calendar_deleted_with_sql_under_its_schedules_makes_them_row_errors(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    assert (await client.put("/calendars/gone", json={"dates": []})).status_code == 201
    made = await create(client, options={"exclude": ["gone"]})
    assert (await client.get(f"/schedules/{made['id']}")).json()["status"] == "active"
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM pm_calendars WHERE name = 'gone'"))
    body = (await client.get(f"/schedules/{made['id']}")).json()
    [error] = body["errors"]
    assert error["field"] == "options.exclude" and "'gone'" in error["reason"], error
    assert (await client.get("/calendars/gone")).status_code == 404


async def test_previews_skip_excluded_slots_and_an_all_excluded_schedule_shows_none(
    client: httpx.AsyncClient,
) -> None:
    # T0 is 2026-03-01 12:00:30Z: 2 March is excluded, so the next daily 06:00 slot is 3 March.
    assert (await client.put("/calendars/mar2", json={"dates": ["2026-03-02"]})).status_code == 201
    made = await create(client, name="skips", spec="0 6 * * *", options={"exclude": ["mar2"]})
    assert made["next_runs"] == [
        "2026-03-03T06:00:00Z",
        "2026-03-04T06:00:00Z",
        "2026-03-05T06:00:00Z",
    ]
    listed = {i["name"]: i for i in (await client.get("/views/schedules")).json()["items"]}
    assert listed["skips"]["next"]["at"] == "2026-03-03T06:00:00Z"
    # Every slot of a yearly 2 March schedule is on an excluded date in 2026, and only 2026 is
    # excluded: previews look ahead a bounded number of slots and show the 2027 one.
    yearly = await create(client, name="yearly", spec="0 6 2 3 *", options={"exclude": ["mar2"]})
    assert yearly["next_runs"][0] == "2027-03-02T06:00:00Z"
    # A calendar of every day of 2026-2027 under a minutely schedule: 10,000 slots looked at, none
    # sent: no preview, no loop, the schedule is still active.
    days = [
        f"{y}-{m:02d}-{d:02d}" for y in (2026, 2027) for m in range(1, 13) for d in range(1, 29)
    ]
    assert (await client.put("/calendars/all", json={"dates": days})).status_code == 201
    every = await create(client, name="never", spec="* * * * *", options={"exclude": ["all"]})
    assert every["next_runs"] == [] and every["status"] == "active"
    listed = {i["name"]: i for i in (await client.get("/views/schedules")).json()["items"]}
    assert listed["never"]["next"] is None and listed["never"]["error"] is None
    slots = (await client.get(f"/views/schedules/{every['id']}/slots", params={"n": 3})).json()
    assert [s["marks"] for s in slots["slots"]] == [["excluded"]] * 3


async def test_concurrent_puts_of_a_new_calendar_create_it_once(client: httpx.AsyncClient) -> None:
    """Eight writers at once, three rounds: on MariaDB/MySQL they deadlock on the new row's gap
    and are retried (one round in six failed when the retries came without a pause)."""
    for round_ in range(3):
        name = f"race-{round_}"
        answers = await asyncio.gather(
            *(
                client.put(f"/calendars/{name}", json={"dates": [f"2030-01-{d:02d}"]})
                for d in range(1, 9)
            )
        )
        assert sorted(a.status_code for a in answers) == [200] * 7 + [201], [
            a.text for a in answers
        ]
        assert len((await client.get(f"/calendars/{name}")).json()["dates"]) == 1
