"""Exclusion calendars (``options.exclude``) through a real manager in the API's process, on
PostgreSQL (Redis Streams and outbox) and SQLite (outbox), on a VirtualClock: a slot whose local
date (the schedule's zone) is in a calendar is not sent and is recorded ``skipped`` with an
``excluded: ...`` error; previews leave it out; a calendar edited through the API or with plain
SQL reaches the running manager; a missing calendar is a row error until it is created; the public
holidays of a country and subdivision work."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tests.runtime.test_last_good import manager_errors, running
from tests.support import rawsql
from tests.support.e2e import Rig, at, iso

START = datetime(2024, 5, 1, 21, 50, 0, 500000, tzinfo=UTC)  # 23:50 on 1 May in Berlin


@pytest.fixture
def rig_start() -> datetime:
    return START


def utc(hh: int, mm: int, day: int = 1) -> datetime:
    return datetime(2024, 5, day, hh, mm, tzinfo=UTC)


async def runs(rig: Rig, sid: int) -> list[dict[str, Any]]:
    body = (await rig.client.get(f"/schedules/{sid}/runs", params={"limit": 500})).json()
    return sorted(body["items"], key=lambda r: r["slot_at"])


async def test_slots_on_excluded_local_dates_are_not_sent_and_edits_reach_the_manager(
    rig: Rig, combo: tuple[str, str]
) -> None:
    url, _ = combo
    r = await rig.client.put("/calendars/maint", json={"dates": ["2024-05-02"]})
    assert r.status_code == 201, r.text
    job = {
        "name": "berlin.5m",
        "spec": "*/5 * * * *",
        "timezone": "Europe/Berlin",
        "task_type": "t",
        "options": {"exclude": ["maint"]},
    }
    r = await rig.client.post("/schedules", json=job)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    # Berlin is at +02:00: 21:55Z is 23:55 on 1 May there (sent); from 22:00Z on it is 2 May
    # (excluded) although the UTC date is 1 May, until 22:00Z on 2 May (3 May there).
    assert r.json()["next_runs"] == [iso(utc(21, 55)), iso(utc(22, 0, 2)), iso(utc(22, 5, 2))]
    slots = (await rig.client.get(f"/views/schedules/{sid}/slots", params={"n": 3})).json()
    assert [s["marks"] for s in slots["slots"]] == [[], ["excluded"], ["excluded"]], slots

    await rig.advance_to(utc(22, 7))
    assert await rig.slots("berlin.5m") == [iso(utc(21, 55))]
    skipped = [h for h in await runs(rig, sid) if h["status"] == "skipped"]
    assert [h["slot_at"] for h in skipped] == [iso(utc(22, 0)), iso(utc(22, 5))]
    assert all(h["error"] == "excluded: 2024-05-02 is in calendar 'maint'" for h in skipped), (
        skipped
    )

    # An API edit of the calendar reaches the running manager: 2 May (Berlin) is sent again.
    r = await rig.client.put("/calendars/maint", json={"dates": ["2024-05-01"]})
    assert r.status_code == 200, r.text
    assert r.json()["used_by"] == ["berlin.5m"]
    await rig.advance_to(utc(22, 12))
    assert await rig.slots("berlin.5m") == [iso(utc(21, 55)), iso(utc(22, 10))]

    # So does a plain SQL edit (the trigger renews the revision of the rows that name it).
    await rawsql.execute(
        url, """UPDATE pm_calendars SET spec = '{"dates":["2024-05-02"]}' WHERE name = 'maint'"""
    )
    await rig.advance_to(utc(22, 17))
    assert await rig.slots("berlin.5m") == [iso(utc(21, 55)), iso(utc(22, 10))]
    last = (await runs(rig, sid))[-1]
    assert (last["slot_at"], last["status"]) == (iso(utc(22, 15)), "skipped"), last


async def test_a_missing_calendar_is_a_row_error_until_it_is_created(
    rig: Rig, combo: tuple[str, str]
) -> None:
    url, _ = combo
    r = await rig.client.post(
        "/schedules",
        json={
            "name": "api.nope",
            "spec": "* * * * *",
            "task_type": "t",
            "options": {"exclude": ["nope"]},
        },
    )
    assert r.status_code == 422, r.text
    [err] = r.json()["errors"]
    assert err["field"] == "options.exclude" and "no calendar named 'nope'" in err["reason"], err

    sid = await rawsql.insert(url, "sql.nope", options="""'{"exclude": ["later"]}'""")
    await rig.advance_to(at(21, 52, 30))
    assert await rig.slots("sql.nope") == []
    [merr] = await manager_errors(rig, sid)
    assert merr["field"] == "options.exclude" and "'later'" in merr["reason"], merr
    api = (await rig.client.get(f"/schedules/{sid}")).json()
    assert api["status"] == "error" and api["errors"][0]["field"] == "options.exclude"

    # Creating the calendar (with SQL here) makes the row good: its slots are sent from then on.
    await rawsql.execute(
        url,
        """INSERT INTO pm_calendars (name, spec) VALUES ('later', '{"dates":["2030-01-01"]}')""",
    )
    await rig.advance_to(at(21, 54, 30))
    assert await rig.slots("sql.nope") == [iso(at(21, 53)), iso(at(21, 54))]
    assert await manager_errors(rig, sid) == []


async def test_a_calendar_in_use_is_not_deleted(rig: Rig) -> None:
    assert (await rig.client.put("/calendars/c1", json={"dates": []})).status_code == 201
    assert (await rig.client.put("/calendars/c2", json={"dates": []})).status_code == 201
    job = {"name": "uses.c1", "spec": "* * * * *", "task_type": "t", "options": {"exclude": ["c1"]}}
    assert (await rig.client.post("/schedules", json=job)).status_code == 201
    r = await rig.client.delete("/calendars/c1")
    assert r.status_code == 409 and r.json()["used_by"] == ["uses.c1"], r.text
    assert "uses.c1" in r.json()["detail"]
    assert (await rig.client.get("/calendars/c1")).status_code == 200
    assert (await rig.client.delete("/calendars/c2")).status_code == 204
    assert (await rig.client.get("/calendars/c2")).status_code == 404
    names = [c["name"] for c in (await rig.client.get("/calendars")).json()["items"]]
    assert names == ["c1"]


async def test_the_public_holidays_of_bavaria_are_not_sent(db_url: str) -> None:
    start = datetime(2026, 12, 24, 22, 50, tzinfo=UTC)  # 23:50 on 24 December in Munich
    async with running(db_url, start) as rig:
        r = await rig.client.put(
            "/calendars/de-by", json={"holidays": {"country": "DE", "subdiv": "BY"}}
        )
        assert r.status_code == 201, r.text
        assert {"2026-12-25", "2026-12-26"} <= set(r.json()["dates"])
        excluded = {
            "timezone": "Europe/Berlin",
            "task_type": "t",
            "options": {"exclude": ["de-by"]},
        }
        r = await rig.client.post(
            "/schedules", json={"name": "daily.nine", "spec": "0 9 * * *", **excluded}
        )
        assert r.status_code == 201, r.text
        nine = [datetime(2026, 12, d, 8, tzinfo=UTC) for d in (27, 28, 29)]  # 09:00 CET
        assert r.json()["next_runs"] == [iso(t) for t in nine]  # not 25 nor 26 December
        r = await rig.client.post(
            "/schedules", json={"name": "every.5m", "spec": "*/5 * * * *", **excluded}
        )
        assert r.status_code == 201, r.text
        await rig.advance_to(datetime(2026, 12, 24, 23, 12, tzinfo=UTC))
        # 22:55Z is 23:55 on 24 December in Munich; from 23:00Z on it is Christmas Day there.
        assert await rig.slots("every.5m") == [iso(datetime(2026, 12, 24, 22, 55, tzinfo=UTC))]


async def test_a_calendar_deleted_with_sql_leaves_the_running_version_running(
    rig: Rig, combo: tuple[str, str]
) -> None:
    url, _ = combo
    assert (
        await rig.client.put("/calendars/noon", json={"dates": ["2024-05-02"]})
    ).status_code == 201
    job = {
        "name": "minutely",
        "spec": "* * * * *",
        "task_type": "t",
        "options": {"exclude": ["noon"]},
    }
    sid = (await rig.client.post("/schedules", json=job)).json()["id"]
    await rig.advance_to(at(21, 51, 30))
    assert await rig.slots("minutely") == [iso(at(21, 51))]
    # The API refuses; SQL does it anyway: the row turns bad, the version held keeps running.
    assert (await rig.client.delete("/calendars/noon")).status_code == 409
    await rawsql.execute(url, "DELETE FROM pm_calendars WHERE name = 'noon'")
    await rig.advance_to(at(21, 53, 30))
    assert await rig.slots("minutely") == [iso(at(21, m)) for m in (51, 52, 53)]
    [err] = await manager_errors(rig, sid)
    assert err["field"] == "options.exclude" and err["last_good_since"] is not None, err
