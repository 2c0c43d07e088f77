"""The dashboard's JSON (``/views``) and its shell (``/ui``), without a browser, on both databases.

The browser drives the same endpoints in ``test_ui_browser.py``; here each answer is checked
exactly against rows written by the test, with a virtual clock.
"""

from __future__ import annotations

import math
import random
import re
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

import httpx
import pytest
from sqlalchemy import delete, insert, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.api import create_app
from periodic_manager.clock import VirtualClock
from periodic_manager.db.models import entries_table, jobs_table, managers_table, runs_table
from periodic_manager.settings import Settings
from tests.support.api import HEARTBEAT_S, T0

TOKEN = "write-token-0123456789"
READ_TOKEN = "read-token-0123456789"


async def create(client: httpx.AsyncClient, name: str, spec: str, **fields: Any) -> int:
    body = {"name": name, "spec": spec, "task_type": fields.pop("task_type", "t"), **fields}
    r = await client.post("/schedules", json=body)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


async def live_manager(
    engine: AsyncEngine, manager_id: str = "m1", *, leader: bool = True, age_s: float = 1.0
) -> None:
    """A manager whose last heartbeat was ``age_s`` before T0 (dead after 3 heartbeats)."""
    async with engine.begin() as conn:
        await conn.execute(
            insert(managers_table).values(
                manager_id=manager_id,
                hostname="host",
                pid=1,
                version="0.1.0",
                started_at=T0 - timedelta(hours=1),
                heartbeat_at=T0 - timedelta(seconds=age_s),
                is_leader=leader,
                last_sync_at=T0 - timedelta(seconds=2),
                entry_count=2,
            )
        )


async def add_entry(
    engine: AsyncEngine, key: str, status: str = "active", manager_id: str = "m1", **extra: Any
) -> None:
    values = {
        "manager_id": manager_id,
        "entry_id": f"e-{key}",
        "schedule_key": key,
        "name": f"job.{key}",
        "content_hash": "ab" * 32,
        "status": status,
        "registered_at": T0 - timedelta(minutes=5),
        **extra,
    }
    async with engine.begin() as conn:
        await conn.execute(insert(entries_table).values(values))


async def add_runs(engine: AsyncEngine, rows: list[dict[str, Any]]) -> None:
    async with engine.begin() as conn:
        await conn.execute(insert(runs_table), rows)


def run(
    key: str, slot_at: datetime, status: str = "enqueued", lateness_ms: int = 5
) -> dict[str, Any]:
    return {
        "schedule_key": key,
        "name": f"job.{key}",
        "slot_at": slot_at,
        "status": status,
        "at": slot_at + timedelta(milliseconds=lateness_ms),
        "lateness_ms": lateness_ms,
        "message_id": None,
        "error": None,
    }


# -- the schedule list ---------------------------------------------------------------------------


async def test_list_is_sorted_by_next_slot_then_unusable_then_paused(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    hourly = await create(client, "b.hourly", "0 * * * *")  # 13:00
    minute = await create(client, "c.minute", "* * * * *")  # 12:01
    daily = await create(client, "a.daily", "0 6 * * *", timezone="Europe/Berlin")  # 05:00Z
    paused = await create(client, "d.paused", "* * * * *", enabled=False)
    async with engine.begin() as conn:  # a row written with SQL that no manager can use
        bad = (
            await conn.execute(
                insert(jobs_table)
                .values(name="e.bad", spec="not cron", task_type="t", created_at=T0, updated_at=T0)
                .returning(jobs_table.c.id)
            )
        ).scalar_one()

        # Rows whose spec is fine but that no manager can use either: they have no next slot
        # and sort with the unusable rows, not first by their every-minute spec.
        broken = [
            (
                await conn.execute(
                    insert(jobs_table)
                    .values(name=name, spec="* * * * *", created_at=T0, updated_at=T0, **fields)
                    .returning(jobs_table.c.id)
                )
            ).scalar_one()
            for name, fields in (
                ("f.no-type", {"task_type": " "}),
                ("g.bad-option", {"task_type": "t", "options": {"retries": 3}}),
            )
        ]
    page = (await client.get("/views/schedules")).json()
    assert [i["id"] for i in page["items"]] == [minute, hourly, daily, bad, *broken, paused]
    assert page["total"] == 7 and page["sort"] == "next"
    for item in page["items"][3:6]:
        assert item["next"] is None and item["error"], item
    by_id = {i["id"]: i for i in page["items"]}
    assert by_id[minute]["next"]["at"] == "2026-03-01T12:01:00Z"
    assert by_id[daily]["next"] == {
        "at": "2026-03-02T05:00:00Z",
        "local": "2026-03-02T06:00:00+01:00",
        "abbreviation": "CET",
    }
    assert by_id[daily]["description"] == "At 06:00"
    assert by_id[paused]["next"] is None and by_id[paused]["error"] is None
    assert by_id[bad]["next"] is None and "field-count" in by_id[bad]["error"]

    second = (await client.get("/views/schedules", params={"limit": 2, "offset": 2})).json()
    assert [i["id"] for i in second["items"]] == [daily, bad]
    assert second["total"] == 7
    by_name = (await client.get("/views/schedules", params={"sort": "name"})).json()
    assert [i["name"] for i in by_name["items"]] == sorted(i["name"] for i in page["items"])

    # The order follows edits: a repaired row takes its slot, a broken one leaves its place.
    async with engine.begin() as conn:
        await conn.execute(
            update(jobs_table).where(jobs_table.c.id == broken[0]).values(task_type="t")
        )
        await conn.execute(update(jobs_table).where(jobs_table.c.id == minute).values(options=[1]))
    after = (await client.get("/views/schedules")).json()["items"]
    assert [i["id"] for i in after] == [broken[0], hourly, daily, minute, bad, broken[1], paused]


async def test_list_filters_by_prefix_type_queue_state_and_error(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    a = await create(client, "reports.a", "* * * * *", options={"queue": "reports"})
    b = await create(client, "reports.b", "0 * * * *", task_type="mail")
    c = await create(client, "cleanup", "0 3 * * *", enabled=False, options={"queue": "reports"})
    await live_manager(engine)
    await live_manager(engine, "dead", leader=False, age_s=3 * HEARTBEAT_S + 1)
    await add_entry(engine, str(b), "error", last_error="spec: rejected for the test")
    await add_entry(engine, str(a), "error", manager_id="dead", last_error="old")

    async def ids(**params: Any) -> list[int]:
        r = await client.get("/views/schedules", params=params)
        assert r.status_code == 200, r.text
        return sorted(i["id"] for i in r.json()["items"])

    assert await ids(name_prefix="reports.") == [a, b]
    assert await ids(name_prefix="Reports.") == []  # case-sensitive
    assert await ids(task_type="mail") == [b]
    assert await ids(queue="reports") == [a, c]
    assert await ids(queue="default") == [b]
    assert await ids(enabled="false") == [c]
    assert await ids(in_error="true") == [b]
    assert await ids(in_error="false") == [a, c]
    assert await ids(name_prefix="reports.", enabled="true", queue="reports") == [a]
    rows = (await client.get("/views/schedules", params={"in_error": "true"})).json()["items"]
    assert rows[0]["error"] == "spec: rejected for the test"


async def test_list_shows_the_newest_run_with_its_lateness(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    sid = await create(client, "job", "* * * * *")
    key = str(sid)
    await add_runs(
        engine,
        [
            run(key, T0 - timedelta(minutes=2), "enqueued", 12),
            run(key, T0 - timedelta(minutes=1), "skipped", 45_000),
            run("999", T0, "failed", 1),  # another schedule's
        ],
    )
    item = (await client.get("/views/schedules")).json()["items"][0]
    assert item["last_run"]["status"] == "skipped"
    assert item["last_run"]["lateness_ms"] == 45_000
    assert item["last_run"]["slot_at"] == "2026-03-01T11:59:30Z"


async def test_next_slot_cache_follows_the_clock(
    client: httpx.AsyncClient, clock: VirtualClock
) -> None:
    await create(client, "job", "*/5 * * * *")
    first = (await client.get("/views/schedules")).json()["items"][0]["next"]["at"]
    assert first == "2026-03-01T12:05:00Z"
    await clock.advance(300)  # exactly on the slot: the next one is strictly after
    assert (await client.get("/views/schedules")).json()["items"][0]["next"]["at"] == (
        "2026-03-01T12:10:00Z"
    )
    clock.set(T0 - timedelta(hours=1))  # the clock stepped back: not the remembered answer
    assert (await client.get("/views/schedules")).json()["items"][0]["next"]["at"] == (
        "2026-03-01T11:05:00Z"
    )


async def test_the_order_follows_edits_deletes_sql_writes_and_time(
    client: httpx.AsyncClient, engine: AsyncEngine, clock: VirtualClock
) -> None:
    async def names() -> list[str]:
        r = await client.get("/views/schedules")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["total"] == len(body["items"])  # nothing counted that is not there
        return [i["name"] for i in body["items"]]

    a = await create(client, "a", "0 13 * * *")
    await create(client, "b", "30 12 * * *")
    assert await names() == ["b", "a"]
    assert (await client.patch(f"/schedules/{a}", json={"spec": "* * * * *"})).status_code == 200
    assert await names() == ["a", "b"]
    assert (await client.post(f"/schedules/{a}/pause")).status_code == 200
    assert await names() == ["b", "a"]
    assert (await client.delete(f"/schedules/{a}")).status_code == 204
    assert await names() == ["b"]
    async with engine.begin() as conn:  # plain SQL, seen through the revision like any write
        await conn.execute(
            insert(jobs_table).values(
                name="c", spec="*/2 * * * *", task_type="t", created_at=T0, updated_at=T0
            )
        )
    assert await names() == ["c", "b"]
    async with engine.begin() as conn:
        await conn.execute(delete(jobs_table).where(jobs_table.c.name == "c"))
    assert await names() == ["b"]
    await create(client, "d", "0 13 * * *")
    assert await names() == ["b", "d"]
    await clock.advance(30 * 60)  # 12:30:30: b's slot passed, its next one is tomorrow
    assert await names() == ["d", "b"]


# -- slots with daylight-saving marks ----------------------------------------------------------


async def test_slots_mark_the_spring_forward_shift(
    client: httpx.AsyncClient, clock: VirtualClock
) -> None:
    clock.set(datetime(2024, 3, 29, 12, 0, tzinfo=UTC))
    sid = await create(client, "berlin", "30 2 * * *", timezone="Europe/Berlin")
    body = (await client.get(f"/views/schedules/{sid}/slots", params={"n": 4})).json()
    slots = body["slots"]
    assert [s["at"] for s in slots] == [
        "2024-03-30T01:30:00Z",
        "2024-03-31T01:30:00Z",  # 02:30 CET does not exist: 03:30 CEST
        "2024-04-01T00:30:00Z",
        "2024-04-02T00:30:00Z",
    ]
    assert [s["marks"] for s in slots] == [[], ["offset-change", "shifted"], [], []]
    assert slots[1]["local"] == "2024-03-31T03:30:00+02:00" and slots[1]["abbreviation"] == "CEST"
    assert "02:30 did not exist" in slots[1]["notes"][1]
    assert body["description"] == "At 02:30" and body["error"] is None


async def test_slots_mark_both_passes_of_a_repeated_hour(
    client: httpx.AsyncClient, clock: VirtualClock
) -> None:
    clock.set(datetime(2024, 10, 26, 23, 0, tzinfo=UTC))
    sid = await create(client, "hourly", "30 * * * *", timezone="Europe/Berlin")
    slots = (await client.get(f"/views/schedules/{sid}/slots", params={"n": 4})).json()["slots"]
    assert [s["local"] for s in slots] == [
        "2024-10-27T01:30:00+02:00",
        "2024-10-27T02:30:00+02:00",
        "2024-10-27T02:30:00+01:00",
        "2024-10-27T03:30:00+01:00",
    ]
    assert [s["marks"] for s in slots] == [
        [],
        ["repeated-hour"],
        ["offset-change", "repeated-hour"],
        [],
    ]
    assert "first pass" in slots[1]["notes"][0] and "second pass" in slots[2]["notes"][1]


async def test_slots_of_an_unusable_row_say_why(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    async with engine.begin() as conn:
        bad = (
            await conn.execute(
                insert(jobs_table)
                .values(
                    name="bad",
                    spec="* * * * *",
                    timezone="Mars/Olympus",
                    task_type="t",
                    created_at=T0,
                    updated_at=T0,
                )
                .returning(jobs_table.c.id)
            )
        ).scalar_one()
    body = (await client.get(f"/views/schedules/{bad}/slots")).json()
    assert body["slots"] == [] and "Mars/Olympus" in body["error"]
    assert (await client.get("/views/schedules/424242/slots")).status_code == 404


# -- overview -------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite"])  # PostgreSQL's boolean holds true or false only
async def test_each_count_is_the_total_of_the_list_it_links_to(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """A row whose ``enabled`` SQL set to 'yes' is neither enabled nor paused: a row error, shown
    as one, after the usable rows, and "in error" once a live manager reports it."""
    await create(client, "on", "* * * * *")
    await create(client, "off", "* * * * *", enabled=False)
    async with engine.begin() as conn:
        odd = (
            await conn.execute(
                text(
                    "INSERT INTO periodic_jobs (name, spec, timezone, task_type, enabled, "
                    "created_at, updated_at) VALUES ('odd', '* * * * *', 'UTC', 't', 'yes', "
                    "'2026-03-01 12:00:00', '2026-03-01 12:00:00') RETURNING id"
                )
            )
        ).scalar_one()

    async def total(**params: str) -> int:
        return int((await client.get("/views/schedules", params=params)).json()["total"])

    async def counts() -> dict[str, int]:
        return dict((await client.get("/views/overview")).json()["counts"])

    assert await counts() == {"schedules": 3, "enabled": 1, "paused": 1, "in_error": 0}
    assert (await total(enabled="true"), await total(enabled="false")) == (1, 1)
    items = (await client.get("/views/schedules")).json()["items"]
    assert [i["name"] for i in items] == ["on", "odd", "off"]
    assert items[1]["enabled"] is None and items[1]["error"].startswith("enabled: must be true")
    await live_manager(engine)
    await add_entry(engine, str(odd), "error", last_error=items[1]["error"])
    assert await counts() == {"schedules": 3, "enabled": 1, "paused": 1, "in_error": 1}
    assert await total(in_error="true") == 1


async def test_overview_counts_series_and_exact_percentiles(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    a = await create(client, "a", "* * * * *")
    await create(client, "b", "* * * * *", enabled=False)
    await live_manager(engine)
    await add_entry(engine, str(a), "error", last_error="bad")
    minute = T0.replace(second=0)  # 12:00, the newest bucket
    # 100 enqueued slots with lateness 1..100 ms in the newest minute, 2 skipped 10 minutes ago,
    # 1 failed 59 minutes ago (the oldest bucket), and one run before the window.
    rows = [run(str(a), minute + timedelta(milliseconds=i), "enqueued", i) for i in range(1, 101)]
    rows += [run(str(a), minute - timedelta(minutes=10), "skipped", 40_000)] * 2
    rows += [run(str(a), minute - timedelta(minutes=59), "failed", 3)]
    rows += [run(str(a), minute - timedelta(minutes=61), "enqueued", 99_999)]
    rows += [run(str(a), minute - timedelta(minutes=5), "resent", 20)]  # a lost confirmation
    await add_runs(engine, rows)

    body = (await client.get("/views/overview")).json()
    assert body["counts"] == {"schedules": 2, "enabled": 1, "paused": 1, "in_error": 1}
    assert body["window_start_at"] == "2026-03-01T11:01:00Z"
    series = body["series"]
    assert len(series) == 60 and series[-1]["start_at"] == "2026-03-01T12:00:00Z"
    assert series[-1]["enqueued"] == 100
    assert series[-11]["skipped"] == 2 and series[-11]["start_at"] == "2026-03-01T11:50:00Z"
    assert series[0]["failed"] == 1
    assert series[-6]["resent"] == 1 and sum(p["resent"] for p in series) == 1
    assert sum(p["enqueued"] for p in series) == 100  # the run before the window is not counted
    assert body["lateness"] == {
        "count": 100,
        "p50_ms": 50,
        "p90_ms": 90,
        "p99_ms": 99,
        "max_ms": 100,
    }
    assert body["managers"] == {"live": 1, "leader": "m1"}


async def test_lateness_percentiles_are_over_the_newest_slots_only(
    client: httpx.AsyncClient, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from periodic_manager.api.ui import stats

    monkeypatch.setattr(stats, "LATENESS_SAMPLE", 50)
    minute = T0.replace(second=0)
    # Lateness i ms at minute + i ms: the 50 newest are 51..100 ms.
    await add_runs(engine, [run("1", minute, "enqueued", i) for i in range(1, 101)])
    body = (await client.get("/views/overview")).json()
    assert body["lateness"] == {
        "count": 50,
        "p50_ms": 75,
        "p90_ms": 95,
        "p99_ms": 100,
        "max_ms": 100,
    }
    assert body["series"][-1]["enqueued"] == 100  # the counts are not sampled


async def test_overview_of_an_empty_database(client: httpx.AsyncClient) -> None:
    body = (await client.get("/views/overview")).json()
    assert body["counts"] == {"schedules": 0, "enabled": 0, "paused": 0, "in_error": 0}
    assert body["lateness"]["count"] == 0 and body["lateness"]["p50_ms"] is None
    assert all(p["enqueued"] == 0 for p in body["series"])
    assert body["managers"] == {"live": 0, "leader": None}


async def test_overview_numbers_match_the_history_counted_here(
    client: httpx.AsyncClient, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every number of the overview recomputed in Python from the rows this test writes: counts
    per minute and status, nearest-rank percentiles of the newest enqueued slots, and "in error"
    as exactly the schedules the list's ``in_error=true`` filter returns."""
    from periodic_manager.api.ui import stats

    monkeypatch.setattr(stats, "LATENESS_SAMPLE", 207)  # p * 207 is not whole: ranks round up
    rng = random.Random(14)
    ids = [await create(client, f"job.{i:02d}", "* * * * *", enabled=i % 4 != 0) for i in range(12)]
    async with engine.begin() as conn:  # unusable for the API's judge, but rejected by no manager
        await conn.execute(
            insert(jobs_table).values(
                name="sql.bad", spec="not cron", task_type="t", created_at=T0, updated_at=T0
            )
        )
    await live_manager(engine, "m1")
    await live_manager(engine, "m2", leader=False)
    await live_manager(engine, "gone", leader=False, age_s=3 * HEARTBEAT_S + 1)
    await add_entry(engine, str(ids[1]), "error", last_error="x")
    await add_entry(engine, str(ids[1]), "error", manager_id="m2", last_error="x")  # counted once
    await add_entry(engine, str(ids[4]), "error", manager_id="m2", last_error="x")  # a paused row
    await add_entry(engine, str(ids[5]), "active")
    await add_entry(engine, str(ids[6]), "error", manager_id="gone", last_error="x")  # dead
    await add_entry(engine, f"00{ids[7]}", "error", last_error="x")  # not that row's key
    await add_entry(engine, "987654", "error", last_error="x")  # no such row

    start = T0.replace(second=0) - timedelta(minutes=59)  # 11:01:00
    end = start + timedelta(minutes=60)
    statuses = [*stats.STATUSES, "enqueued", "enqueued", "enqueued", "other"]
    rows = []
    for i in range(800):
        lateness = rng.choice([7, 40, rng.randrange(10_000), rng.randrange(10_000)])
        if i % 8 == 0:  # on a minute's edge, or a microsecond before it (never enqueued: ties)
            at = start + timedelta(minutes=rng.randrange(-2, 62))
            at -= timedelta(microseconds=rng.choice([0, 1]))
            status = rng.choice([st for st in statuses if st != "enqueued"])
        else:  # distinct instants: "the newest N enqueued" is well defined
            at = start + timedelta(seconds=rng.uniform(-150, 3750), microseconds=i)
            status = rng.choice(statuses)
        rows.append({**run(str(rng.choice(ids)), at, status, lateness), "at": at})
    rows += [{**run("1", edge, "skipped"), "at": edge} for edge in (start, end)]
    await add_runs(engine, rows)

    series = [dict.fromkeys(stats.STATUSES, 0) for _ in range(60)]
    for r in rows:
        if start <= r["at"] < end and r["status"] in stats.STATUSES:
            series[int((r["at"] - start).total_seconds() // 60)][r["status"]] += 1
    enqueued = sorted(
        (r for r in rows if r["status"] == "enqueued" and r["at"] >= start),
        key=lambda r: r["at"],
        reverse=True,
    )
    assert len(enqueued) > 207  # the sample leaves the oldest out
    values = sorted(r["lateness_ms"] for r in enqueued[:207])

    def rank(p: float) -> int:
        return values[max(1, math.ceil(p * len(values))) - 1]

    body = (await client.get("/views/overview")).json()
    assert [{k: point[k] for k in stats.STATUSES} for point in body["series"]] == series
    assert series[0]["skipped"] and sum(sum(point.values()) for point in series) > 500
    assert sum(point["held"] for point in series) > 10  # held slots are counted too
    assert body["lateness"] == {
        "count": 207,
        "p50_ms": rank(0.5),
        "p90_ms": rank(0.9),
        "p99_ms": rank(0.99),
        "max_ms": values[-1],
    }
    listed = (await client.get("/views/schedules", params={"in_error": "true"})).json()
    assert sorted(item["id"] for item in listed["items"]) == [ids[1], ids[4]]
    assert body["counts"] == {
        "schedules": 13,
        "enabled": 1 + sum(1 for i in range(12) if i % 4 != 0),
        "paused": 3,
        "in_error": listed["total"],
    }


# -- managers and entries ----------------------------------------------------------------------


async def test_managers_and_entries_rejected_first(
    client: httpx.AsyncClient, engine: AsyncEngine, clock: VirtualClock
) -> None:
    await live_manager(engine, "m1")
    await live_manager(engine, "m2", leader=False)
    await add_entry(engine, "1", spec="* * * * *", timezone="UTC", queue="default")
    await add_entry(engine, "2", "error", last_error="spec: nope")
    await add_entry(engine, "3", manager_id="m2")
    body = (await client.get("/views/managers")).json()
    assert [m["manager_id"] for m in body["items"]] == ["m1", "m2"]
    m1 = body["items"][0]
    assert (m1["is_leader"], m1["entries_active"], m1["entries_error"]) == (True, 1, 1)
    assert m1["heartbeat_age_s"] == 1.0
    page = (await client.get("/views/entries", params={"limit": 2})).json()
    assert page["total"] == 3
    assert [(e["schedule_key"], e["status"]) for e in page["items"]] == [
        ("2", "error"),
        ("1", "active"),
    ]
    assert page["items"][0]["schedule_id"] == 2 and page["items"][0]["last_error"] == "spec: nope"
    only = (await client.get("/views/entries", params={"manager_id": "m2"})).json()
    assert [e["schedule_key"] for e in only["items"]] == ["3"]
    # PM_COORDINATION=partitions: the leases naming each manager, as numbers and ranges.
    async with engine.begin() as conn:
        p = conn.dialect.identifier_preparer.quote("partition")  # a reserved word on MySQL
        await conn.execute(
            text(f"UPDATE pm_partitions SET holder = 'm2' WHERE {p} <= 21 OR {p} = 40")
        )
        await conn.execute(text(f"UPDATE pm_partitions SET holder = 'm1' WHERE {p} = 63"))
    shown = {m["manager_id"]: m for m in (await client.get("/views/managers")).json()["items"]}
    assert shown["m2"]["partition_ranges"] == "0-21, 40" and len(shown["m2"]["partitions"]) == 23
    assert (shown["m1"]["partition_ranges"], shown["m1"]["entry_count"]) == ("63", 2)
    await clock.advance(3 * HEARTBEAT_S)  # both managers are now dead
    assert (await client.get("/views/managers")).json()["items"] == []
    assert (await client.get("/views/entries")).json()["total"] == 0


# -- the shell and its assets -------------------------------------------------------------------


async def test_every_page_url_serves_the_shell_and_root_redirects(
    client: httpx.AsyncClient,
) -> None:
    r = await client.get("/")
    assert r.status_code == 307 and r.headers["location"] == "/ui"
    for path in (
        "/ui",
        "/ui/",
        "/ui/schedules",
        "/ui/schedules/new",
        "/ui/schedules/7",
        "/ui/schedules/7/edit",
        "/ui/managers",
    ):
        r = await client.get(path)
        assert r.status_code == 200, path
        assert r.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in r.headers["content-security-policy"]
        assert re.search(r'<script type="module" src="/ui/static/[0-9a-f]{12}/app.js">', r.text)
    assert (await client.get("/ui/elsewhere")).status_code == 404
    assert (await client.get("/ui/static/0/nothing.js")).status_code == 404
    assert "/ui" not in str((await client.get("/openapi.json")).json()["paths"])


async def test_assets_are_kept_by_version_and_the_shell_revalidated(
    client: httpx.AsyncClient,
) -> None:
    shell = await client.get("/ui")
    assert shell.headers["cache-control"] == "no-cache"
    again = await client.get("/ui/schedules", headers={"if-none-match": shell.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    found = re.search(r"/ui/static/([0-9a-f]{12})/app.js", shell.text)
    assert found is not None
    r = await client.get(found.group(0))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    assert r.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert 'from "./api.js"' in r.text  # modules import by relative URL: the same version
    old = await client.get("/ui/static/000000000000/app.js")
    assert old.status_code == 200 and old.headers["cache-control"] == "no-cache"
    assert old.content == r.content


def test_the_dashboard_loads_nothing_from_another_host() -> None:
    """Every URL in the shipped files is same-origin (offline use, CSP ``'self'``)."""
    folder = resources.files("periodic_manager.api.ui") / "static"
    names = [item.name for item in folder.iterdir()]
    assert {"index.html", "app.js", "app.css", "api.js", "dom.js"} <= set(names)
    for item in folder.iterdir():
        text = item.read_text(encoding="utf-8")
        # The one absolute URL allowed is the SVG namespace name (an identifier, never fetched).
        text = text.replace('"http://www.w3.org/2000/svg"', "")
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.I), item.name
        for ref in re.findall(r'(?:src|href)="([^"]+)"', text):
            assert ref.startswith(("/", "#")), (item.name, ref)


async def test_with_tokens_the_shell_is_open_and_the_data_is_not(
    db_url: str, engine: AsyncEngine, clock: VirtualClock
) -> None:
    settings = Settings(database_url=db_url, api_token=TOKEN, api_read_token=READ_TOKEN)
    app = create_app(settings, clock=clock, engine=engine)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            assert (await c.get("/")).status_code == 307
            assert (await c.get("/ui/schedules/3")).status_code == 200
            assert (await c.get("/ui/static/0/app.js")).status_code == 200
            assert (await c.post("/ui/schedules")).status_code == 405  # nothing to write there
            for path in ("/views/whoami", "/views/schedules", "/views/overview"):
                assert (await c.get(path)).status_code == 401, path

            def who(token: str) -> dict[str, str]:
                return {"authorization": f"Bearer {token}"}

            r = await c.get("/views/whoami", headers=who(TOKEN))
            assert r.json() == {"auth": True, "can_write": True, "scope": "admin", "key": None}
            r = await c.get("/views/whoami", headers=who(READ_TOKEN))
            assert r.json() == {"auth": True, "can_write": False, "scope": "read", "key": None}
            assert (await c.get("/views/schedules", headers=who(READ_TOKEN))).status_code == 200


async def test_without_tokens_everyone_may_write(client: httpx.AsyncClient) -> None:
    assert (await client.get("/views/whoami")).json() == {
        "auth": False,
        "can_write": True,
        "scope": "admin",
        "key": None,
    }


# -- daylight-saving marks, straight from the module ----------------------------------------------


def marks_of(spec: str, tz: str, after: datetime, n: int) -> list[tuple[str, list[str]]]:
    from periodic_manager.api.ui.slots import marked_slots

    return [(s.local.isoformat(), s.marks) for s in marked_slots(spec, tz, None, after, n)]


def test_a_wildcard_hour_skips_the_gap_and_is_not_marked_shifted() -> None:
    assert marks_of(
        "*/30 * * * *", "Europe/Berlin", datetime(2024, 3, 31, 0, 15, tzinfo=UTC), 3
    ) == [
        ("2024-03-31T01:30:00+01:00", []),
        ("2024-03-31T03:00:00+02:00", ["offset-change"]),
        ("2024-03-31T03:30:00+02:00", []),
    ]


def test_every_slot_of_a_fixed_hour_in_the_gap_is_shifted() -> None:
    assert marks_of(
        "0,30 2 * * *", "Europe/Berlin", datetime(2024, 3, 30, 23, 0, tzinfo=UTC), 3
    ) == [
        ("2024-03-31T03:00:00+02:00", ["offset-change", "shifted"]),
        ("2024-03-31T03:30:00+02:00", ["shifted"]),
        ("2024-04-01T02:00:00+02:00", []),
    ]


def test_a_half_hour_gap_shifts_by_half_an_hour() -> None:
    # Lord Howe springs forward from 02:00 to 02:30: 02:20 fires at 02:50, after the real 02:40.
    assert marks_of(
        "20,40 2 * * *", "Australia/Lord_Howe", datetime(2024, 10, 5, 12, tzinfo=UTC), 3
    ) == [
        ("2024-10-06T02:40:00+11:00", ["offset-change"]),
        ("2024-10-06T02:50:00+11:00", ["shifted"]),
        ("2024-10-07T02:20:00+11:00", []),
    ]


def test_an_interval_is_never_shifted_but_its_offset_changes_are_marked() -> None:
    assert marks_of("@every 12h", "Europe/Berlin", datetime(2024, 3, 30, 13, tzinfo=UTC), 3) == [
        ("2024-03-31T01:00:00+01:00", []),
        ("2024-03-31T14:00:00+02:00", ["offset-change"]),
        ("2024-04-01T02:00:00+02:00", []),
    ]
