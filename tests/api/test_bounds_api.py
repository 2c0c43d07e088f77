"""options.start_at / options.end_at through the API: a 422 naming the field for a bad value
(POST and PATCH, the old version kept), a row error for one written with SQL, and every preview
(next_runs, the dashboard's slots and list, ``periodic-manager next``) agreeing with the engine:
beginning at start_at, stopping before end_at, and a schedule past its end shown ``ended``."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.cli import files as cli_files
from periodic_manager.clock import VirtualClock
from periodic_manager.db.models import jobs_table
from tests.support.api import JOB, T0, assert_error, create, iso

START = T0.replace(minute=0, second=0) + timedelta(hours=1)  # 13:00
END = START + timedelta(minutes=30)  # 13:30: slots 13:00 and 13:15 only (spec */15)


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"start_at": "2026-03-01T13:00:00"}, "options.start_at", "naive"),
        ({"start_at": "2026-03-01"}, "options.start_at", "explicit UTC offset"),
        ({"end_at": 1772370000}, "options.end_at", "must be a string"),
        ({"end_at": "tomorrow"}, "options.end_at", "ISO 8601"),
        ({"end_at": "0000-12-31T00:00:00Z"}, "options.end_at", "ISO 8601"),
        ({"start_at": "0001-01-01T00:00:00+05:00"}, "options.start_at", "between 0001-01-02"),
        ({"end_at": "9999-12-31T23:00:00-05:00"}, "options.end_at", "between 0001-01-02"),
        ({"start_at": iso(END), "end_at": iso(START)}, "options.end_at", "after options.start_at"),
        (
            {"start_at": iso(START), "end_at": iso(START)},
            "options.end_at",
            "after options.start_at",
        ),
    ],
)
async def test_a_bad_bound_is_a_422_naming_the_field(
    client: httpx.AsyncClient, options: dict[str, Any], field: str, words: str
) -> None:
    r = await client.post("/schedules", json={**JOB, "options": options})
    assert_error(r, 422, ["body", *field.split(".")])
    assert words in r.json()["errors"][0]["reason"]


async def test_a_bad_patch_keeps_the_old_version(client: httpx.AsyncClient) -> None:
    made = await create(client, options={"end_at": iso(END)})
    r = await client.patch(f"/schedules/{made['id']}", json={"options": {"end_at": "13:30"}})
    assert_error(r, 422, ["body", "options", "end_at"])
    kept = (await client.get(f"/schedules/{made['id']}")).json()
    assert kept["options"] == {"end_at": iso(END)} and kept["status"] == "active"


async def test_a_row_written_with_sql_with_a_naive_bound_is_a_row_error(
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
                    options={"start_at": "2026-03-01T13:00:00"},
                )
                .returning(jobs_table.c.id)
            )
        ).scalar_one()
    body = (await client.get(f"/schedules/{row_id}")).json()
    [error] = body["errors"]
    assert error["field"] == "options.start_at" and "naive" in error["reason"]
    assert body["next_runs"] == [] and body["status"] == "error"
    slots = (await client.get(f"/views/schedules/{row_id}/slots")).json()
    assert slots["slots"] == [] and slots["error"].startswith("options.start_at")


async def test_every_preview_begins_at_start_at_and_stops_before_end_at(
    client: httpx.AsyncClient, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = [START, START + timedelta(minutes=15)]
    made = await create(client, options={"start_at": iso(START), "end_at": iso(END)})
    assert made["next_runs"] == [iso(t) for t in expected] and made["status"] == "active"
    got = (await client.get(f"/schedules/{made['id']}")).json()
    assert got["next_runs"] == made["next_runs"]

    slots = (await client.get(f"/views/schedules/{made['id']}/slots", params={"n": 10})).json()
    assert [s["at"] for s in slots["slots"]] == made["next_runs"]
    assert (slots["start_at"], slots["end_at"]) == (iso(START), iso(END))
    [row] = (await client.get("/views/schedules")).json()["items"]
    assert row["next"]["at"] == iso(START) and row["status"] == "active"

    # periodic-manager next, at the same instant, with the same bounds.
    lines = _cli_next(monkeypatch, clock, "*/15 * * * *", iso(START), iso(END))
    assert [line.split()[0] for line in lines] == made["next_runs"]

    clock.set(START + timedelta(minutes=20))  # after the last slot, before end_at
    got = (await client.get(f"/schedules/{made['id']}")).json()
    assert got["next_runs"] == [] and got["status"] == "ended"  # no slot is left
    [row] = (await client.get("/views/schedules")).json()["items"]
    assert row["next"] is None and row["status"] == "ended"  # no slot is left

    assert _cli_next(monkeypatch, clock, "*/15 * * * *", iso(START), iso(END)) == []
    clock.set(END)  # at end_at: ended everywhere
    got = (await client.get(f"/schedules/{made['id']}")).json()
    assert got["next_runs"] == [] and got["status"] == "ended"
    slots = (await client.get(f"/views/schedules/{made['id']}/slots")).json()
    assert slots["slots"] == [] and slots["error"] is None
    assert _cli_next(monkeypatch, clock, "*/15 * * * *", iso(START), iso(END)) == []


async def test_an_ended_schedule_may_still_be_edited(
    client: httpx.AsyncClient, clock: VirtualClock
) -> None:
    made = await create(client, options={"end_at": iso(T0 + timedelta(minutes=1))})
    clock.set(T0 + timedelta(hours=1))
    r = await client.patch(f"/schedules/{made['id']}", json={"description": "done"})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "ended"


def _cli_next(
    monkeypatch: pytest.MonkeyPatch, clock: VirtualClock, spec: str, start: str, end: str
) -> list[str]:
    printed: list[str] = []
    monkeypatch.setattr(cli_files, "SystemClock", lambda: clock)
    monkeypatch.setattr("builtins.print", lambda *a, **k: printed.append(" ".join(map(str, a))))
    args = argparse.Namespace(
        spec=spec,
        tz="UTC",
        n=10,
        anchor=None,
        describe=False,
        start_at=start,
        end_at=end,
        exclude_dates=None,
        exclude_holidays=None,
        max_runs=None,
    )
    try:
        assert cli_files.print_next(args) == 0
    finally:
        monkeypatch.undo()
    return printed


def test_cli_next_refuses_a_naive_bound(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(
        spec="@hourly",
        tz="UTC",
        n=3,
        anchor=None,
        describe=False,
        start_at="2026-03-01T13:00:00",
        end_at=None,
        max_runs=None,
        exclude_dates=None,
        exclude_holidays=None,
    )
    assert cli_files.print_next(args) == 2
    assert "--start-at: must have an explicit UTC offset" in capsys.readouterr().err
