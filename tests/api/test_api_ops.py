"""Step 5 endpoints on PostgreSQL and SQLite: pause/resume, trigger, lookup by name, filters,
ETag/If-Match, history, cron preview, managers, readiness, metrics, auth, problem details."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.api import create_app
from periodic_manager.api.auth import is_loopback, warn_if_exposed
from periodic_manager.cli.logs import JsonFormatter
from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import EnqueueResult, RunRecord
from periodic_manager.db.models import jobs_table, managers_table, outbox_table, runs_table
from periodic_manager.db.store import DatabaseRuntimeStore
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.runtime.timing import Timing
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.settings import Settings
from periodic_manager.targets.memory import MemoryTarget
from tests.support.api import (
    HEARTBEAT_S,
    JOB,
    T0,
    assert_error,
    assert_problem,
    create,
    manager_row,
)

TOKEN = "s3cret-write-token"
READ_TOKEN = "s3cret-read-token"


async def app_client(
    settings: Settings, clock: VirtualClock, engine: AsyncEngine, **kw: Any
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, clock=clock, engine=engine, **kw)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            c.app = app  # type: ignore[attr-defined]
            yield c


# --- pause / resume / ETag / If-Match --------------------------------------------------------


async def test_pause_and_resume_toggle_enabled_and_etag(
    client: httpx.AsyncClient, clock: VirtualClock
) -> None:
    r = await client.post("/schedules", json=JOB)
    job, tag0 = r.json(), r.headers["etag"]
    assert tag0.startswith('"') and tag0.endswith('"')
    got = await client.get(f"/schedules/{job['id']}")
    assert got.headers["etag"] == tag0

    clock.set(T0 + timedelta(minutes=1))
    paused = await client.post(f"/schedules/{job['id']}/pause")
    assert paused.status_code == 200 and paused.json()["enabled"] is False
    assert paused.json()["next_runs"] == [] and paused.headers["etag"] != tag0
    again = await client.post(f"/schedules/{job['id']}/pause")  # idempotent
    assert again.headers["etag"] == paused.headers["etag"]
    resumed = await client.post(f"/schedules/{job['id']}/resume")
    assert resumed.json()["enabled"] is True
    assert resumed.json()["next_runs"][0] == "2026-03-01T12:15:00Z"
    assert_problem(await client.post("/schedules/999/pause"), 404)


async def test_if_match_refuses_stale_writes(
    client: httpx.AsyncClient, clock: VirtualClock
) -> None:
    r = await client.post("/schedules", json=JOB)
    sid, tag = r.json()["id"], r.headers["etag"]
    clock.set(T0 + timedelta(seconds=1))
    # Editor A writes with the tag it read: accepted, and the tag changes.
    a = await client.patch(f"/schedules/{sid}", json={"spec": "@hourly"}, headers={"If-Match": tag})
    assert a.status_code == 200, a.text
    new_tag = a.headers["etag"]
    assert new_tag != tag
    # Editor B still holds the old tag: refused, nothing overwritten.
    b = await client.patch(f"/schedules/{sid}", json={"spec": "@daily"}, headers={"If-Match": tag})
    body = assert_problem(b, 412)
    assert body["type"].endswith("precondition-failed") and "If-Match" in body["detail"]
    assert (await client.get(f"/schedules/{sid}")).json()["spec"] == "@hourly"
    weak = await client.patch(f"/schedules/{sid}", json={}, headers={"If-Match": f"W/{new_tag}"})
    assert weak.status_code == 412  # If-Match uses the strong comparison
    listed = await client.patch(
        f"/schedules/{sid}", json={"description": "x"}, headers={"If-Match": f'"nope", {new_tag}'}
    )
    assert listed.status_code == 200
    star = await client.patch(
        f"/schedules/{sid}", json={"description": "y"}, headers={"If-Match": "*"}
    )
    assert star.status_code == 200
    assert (
        await client.post(f"/schedules/{sid}/pause", headers={"If-Match": tag})
    ).status_code == 412
    assert (await client.delete(f"/schedules/{sid}", headers={"If-Match": tag})).status_code == 412
    assert (await client.get(f"/schedules/{sid}")).status_code == 200
    current = (await client.get(f"/schedules/{sid}")).headers["etag"]
    assert (
        await client.delete(f"/schedules/{sid}", headers={"If-Match": current})
    ).status_code == 204


async def test_etag_changes_with_content_even_at_the_same_instant(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post("/schedules", json=JOB)
    sid, tag = r.json()["id"], r.headers["etag"]
    p = await client.patch(
        f"/schedules/{sid}", json={"payload": {"v": 2}}, headers={"If-Match": tag}
    )
    assert p.status_code == 200 and p.headers["etag"] != tag


# --- lookup and filters ----------------------------------------------------------------------


async def test_lookup_by_name(client: httpx.AsyncClient) -> None:
    job = await create(client, name="team/reports:daily")
    r = await client.get("/schedules/by-name/team/reports:daily")
    assert r.status_code == 200 and r.json()["id"] == job["id"]
    assert r.headers["etag"] == (await client.get(f"/schedules/{job['id']}")).headers["etag"]
    assert "state" in r.json() and "errors" in r.json()
    assert assert_problem(await client.get("/schedules/by-name/missing"), 404)["detail"]


async def test_list_filters_and_pagination(client: httpx.AsyncClient, engine: AsyncEngine) -> None:
    await create(client, name="a.one", task_type="t1", options={"queue": "q1"})
    await create(client, name="a.two", task_type="t2", enabled=False)
    await create(client, name="A.three", task_type="t1", options={"queue": "q1"})
    await create(client, name="a_x", task_type="t1")
    async with engine.begin() as conn:  # a row written with SQL whose options are not an object
        await conn.execute(
            insert(jobs_table).values(
                name="a.bad",
                spec="* * * * *",
                task_type="t1",
                options=[1],
                created_at=T0,
                updated_at=T0,
            )
        )

    async def names(**params: Any) -> list[str]:
        r = await client.get("/schedules", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["total"] == len(page["items"]) or "limit" in params
        return [s["name"] for s in page["items"]]

    assert await names(enabled="false") == ["a.two"]
    assert await names(enabled="true", task_type="t1") == ["a.one", "A.three", "a_x", "a.bad"]
    assert await names(queue="q1") == ["a.one", "A.three"]
    assert await names(queue="default") == ["a.two", "a_x", "a.bad"]  # no queue option
    assert await names(name_prefix="a.") == ["a.one", "a.two", "a.bad"]  # case-sensitive
    assert await names(name_prefix="a_") == ["a_x"]  # "_" is no LIKE wildcard
    page = (
        await client.get("/schedules", params={"task_type": "t1", "limit": 2, "offset": 1})
    ).json()
    assert page["total"] == 4 and [s["name"] for s in page["items"]] == ["A.three", "a_x"]
    assert_error(
        await client.get("/schedules", params={"enabled": "maybe"}), 422, ["query", "enabled"]
    )


# --- trigger and history ---------------------------------------------------------------------


async def outbox(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as conn:
        return list((await conn.execute(select(outbox_table).order_by(outbox_table.c.seq))).all())


async def history(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as conn:
        return list((await conn.execute(select(runs_table).order_by(runs_table.c.id))).all())


async def test_trigger_enqueues_now_with_its_own_key(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    job = await create(client, payload={"n": 1}, options={"queue": "reports"}, enabled=False)
    r1 = await client.post(f"/schedules/{job['id']}/trigger")
    r2 = await client.post(f"/schedules/{job['id']}/trigger")
    assert r1.status_code == 202, r1.text
    t1, t2 = r1.json(), r2.json()
    assert t1["idempotency_key"].startswith("reports.daily:trigger:2026-03-01T12:00:30Z:")
    assert t1["idempotency_key"] != t2["idempotency_key"] and t1["task_id"] != t2["task_id"]
    assert t1["status"] == "enqueued" and t1["queue"] == "reports" and t1["message_id"]
    assert t1["enqueued_at"] == "2026-03-01T12:00:30Z"
    msgs = await outbox(engine)
    assert [m.idempotency_key for m in msgs] == [t1["idempotency_key"], t2["idempotency_key"]]
    assert msgs[0].queue == "reports" and json.loads(msgs[0].payload) == {"n": 1}
    runs = (await client.get(f"/schedules/{job['id']}/runs")).json()
    assert runs["total"] == 2 and {i["status"] for i in runs["items"]} == {"triggered"}
    assert runs["items"][0]["lateness_ms"] == 0 and runs["items"][0]["message_id"]
    assert_problem(await client.post("/schedules/999/trigger"), 404)


async def test_trigger_of_an_unusable_row_is_409(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    async with engine.begin() as conn:
        bad_id = (
            await conn.execute(
                insert(jobs_table)
                .values(
                    name="bad",
                    spec="* * * * *",
                    task_type="t",
                    options={"queu": 1},
                    created_at=T0,
                    updated_at=T0,
                )
                .returning(jobs_table.c.id)
            )
        ).scalar_one()
    r = await client.post(f"/schedules/{bad_id}/trigger")
    body = assert_problem(r, 409)
    assert body["errors"][0]["field"] == "options.queu"
    assert await outbox(engine) == []


class BrokenTarget:
    name = "broken"

    def __init__(self, alone: bool = False) -> None:
        self.alone = alone  # refuse the task in its result instead of raising

    async def enqueue(self, tasks: Any, now: Any) -> Any:
        if self.alone:
            return [EnqueueResult(t, "failed", error="broker down") for t in tasks]
        raise RuntimeError("broker down")

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("alone", [False, True])
async def test_trigger_when_the_target_fails_is_503_and_recorded(
    alone: bool, db_url: str, engine: AsyncEngine, clock: VirtualClock
) -> None:
    class Fake:
        target = BrokenTarget(alone)

        async def start(self) -> None: ...

        async def stop(self) -> None: ...

        def request_sync(self) -> None: ...

    async for c in app_client(
        Settings(database_url=db_url), clock, engine, manager_factory=lambda e: Fake()
    ):
        job = await create(c)
        body = assert_problem(await c.post(f"/schedules/{job['id']}/trigger"), 503)
        assert "broker down" in body["detail"]
        [run] = await history(engine)
        assert run.status == "failed" and "broker down" in run.error


async def test_runs_history_is_paginated_newest_first_and_deleted_with_the_schedule(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    job = await create(client)
    other = await create(client, name="other")
    key = str(job["id"])
    slots = [T0 + timedelta(minutes=15 * i) for i in range(1, 6)]
    store = DatabaseRuntimeStore(engine)
    await store.record_runs(
        [
            RunRecord(key, JOB["name"], s, "enqueued", s + timedelta(milliseconds=40), f"m{i}")
            for i, s in enumerate(slots)
        ]
        + [
            RunRecord(
                key,
                JOB["name"],
                slots[-1] + timedelta(minutes=15),
                "skipped",
                slots[-1] + timedelta(minutes=16),
                error="60.000 s late",
                reason="late",
            )
        ]
        + [RunRecord(str(other["id"]), "other", slots[0], "failed", slots[0], error="down")]
    )
    page = (await client.get(f"/schedules/{key}/runs", params={"limit": 2})).json()
    assert page["total"] == 6 and page["limit"] == 2 and page["offset"] == 0
    first = page["items"][0]
    assert (
        first["status"] == "skipped"
        and first["lateness_ms"] == 60_000
        and first["error"] == "60.000 s late"
        and first["reason"] == "late"
    )
    assert page["items"][1] == {
        "id": page["items"][1]["id"],
        "slot_at": "2026-03-01T13:15:30Z",
        "status": "enqueued",
        "at": "2026-03-01T13:15:30.040000Z",
        "lateness_ms": 40,
        "message_id": "m4",
        "error": None,
        "reason": None,
    }
    enq = (
        await client.get(f"/schedules/{key}/runs", params={"status": "enqueued", "offset": 3})
    ).json()
    assert enq["total"] == 5 and [i["message_id"] for i in enq["items"]] == ["m1", "m0"]
    assert_error(
        await client.get(f"/schedules/{key}/runs", params={"status": "odd"}),
        422,
        ["query", "status"],
    )
    assert_problem(await client.get("/schedules/999/runs"), 404)
    assert (await client.delete(f"/schedules/{key}")).status_code == 204
    assert {r.schedule_key for r in await history(engine)} == {str(other["id"])}


# --- preview ---------------------------------------------------------------------------------


async def test_cron_next_previews_slots_and_describes(client: httpx.AsyncClient) -> None:
    r = await client.get("/cron/next", params={"spec": "0 6 * * *", "tz": "Europe/Moscow", "n": 2})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "spec": "0 6 * * *",
        "timezone": "Europe/Moscow",
        "description": "At 06:00",
        "next": [
            {"at": "2026-03-02T03:00:00Z", "local": "2026-03-02T06:00:00+03:00"},
            {"at": "2026-03-03T03:00:00Z", "local": "2026-03-03T06:00:00+03:00"},
        ],
    }
    default = (await client.get("/cron/next", params={"spec": "@every 90s"})).json()
    assert len(default["next"]) == 5 and default["description"] == "Every 90 seconds"
    assert default["next"][0]["at"] == "2026-03-01T12:01:30Z"
    # Vixie day rule: "*/2" is unrestricted, so this is AND; the library would say "or".
    assert (await client.get("/cron/next", params={"spec": "0 0 */2 * 1"})).json()[
        "description"
    ] is None
    assert (await client.get("/cron/next", params={"spec": "*/25 * * * *"})).json()[
        "description"
    ] is None
    assert_error(
        await client.get("/cron/next", params={"spec": "61 * * * *"}), 422, ["query", "spec"]
    )
    assert_error(
        await client.get("/cron/next", params={"spec": "0 0 31 2 *"}),
        422,
        ["query", "spec"],
        "never-fires",
    )
    assert_error(
        await client.get("/cron/next", params={"spec": "@daily", "tz": "Mars/X"}),
        422,
        ["query", "tz"],
    )
    assert_error(
        await client.get("/cron/next", params={"spec": "@daily", "n": 0}), 422, ["query", "n"]
    )
    assert_error(await client.get("/cron/next"), 422, ["query", "spec"], "missing")


def test_descriptions_of_macros_and_intervals() -> None:
    from periodic_manager.schedules.describe import describe

    assert describe("@daily") == "At 00:00"
    assert describe("@WEEKLY") == "At 00:00, only on Sunday"
    assert describe("@every 1h30m") == "Every 1 hour and 30 minutes"
    assert (
        describe("0 0 1 * 1") == "At 00:00, on day 1 of the month, or on Monday"
    )  # OR: both restricted
    assert describe("0 0 * * 0-7") is None
    assert describe("*/15 * * * *") == "Every 15 minutes"


# --- managers, readiness, metrics --------------------------------------------------------------


def mrow(manager_id: str, heartbeat_at: Any, *, leader: bool) -> dict[str, Any]:
    # Every column in every row: one executemany needs the same keys in each.
    base = {"entry_count": 0, "last_sync_at": None, "last_sync_error": None}
    return {**base, **manager_row(manager_id, heartbeat_at, leader=leader)}


async def test_managers_lists_live_ones_leader_first(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            insert(managers_table),
            [
                {**mrow("b-standby", T0 - timedelta(seconds=2), leader=False), "entry_count": 3},
                {
                    **mrow("c-leader", T0 - timedelta(seconds=1), leader=True),
                    "last_sync_at": T0,
                    "last_sync_error": "boom",
                },
                mrow("a-dead", T0 - timedelta(seconds=3 * HEARTBEAT_S + 1), leader=True),
            ],
        )
    items = (await client.get("/managers")).json()["items"]
    assert [m["manager_id"] for m in items] == ["c-leader", "b-standby"]
    assert items[0]["is_leader"] is True and items[0]["heartbeat_age_s"] == 1.0
    assert (
        items[0]["last_sync_at"] == "2026-03-01T12:00:30Z" and items[0]["last_sync_error"] == "boom"
    )
    assert items[1]["entry_count"] == 3 and items[1]["version"] == "0.1.0"


async def test_readyz(db_url: str, engine: AsyncEngine, clock: VirtualClock) -> None:
    class Fake:
        is_leader = False
        failed: BaseException | None = None
        standing_down: str | None = None
        target = MemoryTarget()
        clock = "ok"

        def clock_check(self) -> str:
            return self.clock

        async def start(self) -> None: ...

        async def stop(self) -> None: ...

        def request_sync(self) -> None: ...

        def health(self) -> str | None:
            return None if self.failed is None else f"the fake's health: {self.failed!r}"

    fake = Fake()
    async for c in app_client(
        Settings(database_url=db_url), clock, engine, manager_factory=lambda e: fake
    ):
        r = await c.get("/readyz")
        assert r.status_code == 200 and r.json() == {
            "status": "ready",
            # A target that cannot be pinged (not Pingable) counts as reachable.
            "checks": {
                "database": "ok",
                "schema": "ok",
                "target": "ok",
                "manager": "standby",
                "clock": "ok",
            },
        }
        fake.clock = "skewed: this clock is 3.0 s ahead of the database's (bound 2 s)"
        assert (await c.get("/readyz")).status_code == 200  # said, still ready
        fake.clock = "failed: this clock is 9.0 s ahead of the database's (bound 2 s)"
        assert assert_problem(await c.get("/readyz"), 503)["checks"]["clock"] == fake.clock
        fake.clock = "ok"
        fake.is_leader = True
        assert (await c.get("/readyz")).json()["checks"]["manager"] == "leader"
        fake.failed = RuntimeError("scheduler died")
        body = assert_problem(await c.get("/readyz"), 503)
        assert (
            body["checks"]["manager"] == "failed: the fake's health: RuntimeError('scheduler died')"
        )
        assert body["checks"]["database"] == "ok" and body["detail"] == "not ready: manager"
        # A manager standing down (its targets fail their pings) is alive but not ready.
        fake.failed = None
        fake.standing_down = (
            "every target fails its ping (redis: connection refused): holding no work"
        )
        body = assert_problem(await c.get("/readyz"), 503)
        assert body["checks"]["manager"] == f"standing down: {fake.standing_down}"
        assert (await c.get("/healthz")).status_code == 200
    async for c in app_client(Settings(database_url=db_url), clock, engine):
        assert (await c.get("/readyz")).json()["checks"] == {
            "database": "ok",
            "schema": "ok",
            "target": "absent",
            "manager": "absent",
            "clock": "absent",
        }


async def test_metrics_of_the_in_process_manager_and_the_api(
    db_url: str, engine: AsyncEngine, clock: VirtualClock
) -> None:
    target = MemoryTarget()
    made: list[PeriodicTaskManager] = []

    def factory(_: AsyncEngine) -> PeriodicTaskManager:
        made.append(PeriodicTaskManager(None, target, clock=clock, timing=Timing(grace=30)))
        return made[-1]

    async for c in app_client(
        Settings(database_url=db_url), clock, engine, manager_factory=factory
    ):
        await create(c)
        manager = made[0]
        manager.register(
            PeriodicTaskConfig.create(
                name="m", spec="* * * * *", task_type="t", options={"queue": "q"}
            )
        )

        async def settle(mgr: PeriodicTaskManager = made[0]) -> None:
            await mgr.wait_settled(clock.now())

        await clock.advance_to(T0 + timedelta(minutes=2), settle=settle)
        r = await c.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        text = r.text
        q = 'queue="q",target="memory"'
        assert (
            'periodic_manager_slots_total{queue="q",status="enqueued",target="memory"} 2.0' in text
        )
        assert f"periodic_manager_enqueue_lateness_seconds_count{{{q}}} 2.0" in text
        assert f'periodic_manager_enqueue_lateness_seconds_bucket{{le="0.005",{q}}} 2.0' in text
        assert "periodic_manager_entries 1.0" in text
        assert "periodic_manager_leader 1.0" in text
        assert "periodic_manager_sync_duration_seconds_count" in text
        assert 'periodic_manager_schedules{enabled="true"} 1.0' in text
        assert "periodic_manager_api_database_up 1.0" in text


async def test_metrics_count_schedules_as_judged_and_managers_by_the_database(
    client: httpx.AsyncClient, engine: AsyncEngine, backend: str
) -> None:
    """``periodic_manager_schedules`` counts rows whose ``enabled`` is judged true or false (as
    the list's filter does): a row SQL gave ``'yes'`` or 2 (SQLite) is neither. Live managers and
    leaders are counts, whatever else the manager rows hold."""
    values = ["TRUE", "TRUE", "TRUE", "FALSE"]
    if backend == "sqlite":
        values += ["'yes'", "2", "'1'"]  # '1' becomes integer 1 (numeric affinity): enabled
    async with engine.begin() as conn:
        for i, value in enumerate(values):
            await conn.execute(
                text(
                    "INSERT INTO periodic_jobs (name, spec, task_type, enabled)"
                    f" VALUES ('m{i}', '@every 1h', 't', {value})"
                )
            )
        await conn.execute(
            insert(managers_table),
            [
                mrow("lead", T0 - timedelta(seconds=1), leader=True),
                mrow("stand", T0 - timedelta(seconds=1), leader=False),
                mrow("dead", T0 - timedelta(seconds=3 * HEARTBEAT_S + 1), leader=True),
            ],
        )
        if backend == "sqlite":
            await conn.execute(
                text("UPDATE pm_managers SET is_leader = 'yes' WHERE manager_id = 'stand'")
            )
    body = (await client.get("/metrics")).text
    enabled = 4 if backend == "sqlite" else 3
    assert f'periodic_manager_schedules{{enabled="true"}} {enabled}.0' in body
    assert 'periodic_manager_schedules{enabled="false"} 1.0' in body
    assert "periodic_manager_live_managers 2.0" in body
    assert "periodic_manager_live_leaders 1.0" in body
    assert "periodic_manager_api_database_up 1.0" in body


def test_metrics_registries_are_per_manager() -> None:
    a = PeriodicTaskManager(None, MemoryTarget())
    b = PeriodicTaskManager(None, MemoryTarget())
    assert a.metrics.registry is not b.metrics.registry
    a.metrics.observe_runs([RunRecord("name:x", "x", T0, "skipped", T0 + timedelta(minutes=1))])
    assert (
        a.metrics.registry.get_sample_value(
            "periodic_manager_slots_total",
            {"queue": "unknown", "status": "skipped", "target": "unknown"},
        )
        == 1
    )
    assert (
        b.metrics.registry.get_sample_value(
            "periodic_manager_slots_total",
            {"queue": "unknown", "status": "skipped", "target": "unknown"},
        )
        is None
    )


# --- auth ------------------------------------------------------------------------------------


async def test_auth_on(
    db_url: str, engine: AsyncEngine, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = Settings(database_url=db_url, api_token=TOKEN, api_read_token=READ_TOKEN)
    write = {"Authorization": f"Bearer {TOKEN}"}
    read = {"Authorization": f"bearer {READ_TOKEN}"}
    async for c in app_client(settings, clock, engine):
        assert (await c.get("/healthz")).status_code == 200
        assert (await c.get("/readyz")).status_code == 200  # probes need no token
        for path in ("/schedules", "/openapi.json", "/metrics", "/managers", "/nowhere", "/docs"):
            r = await c.get(path)
            assert_problem(r, 401)
            assert r.headers["www-authenticate"].startswith("Bearer")
        for bad in ("Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer"):
            assert (await c.get("/schedules", headers={"Authorization": bad})).status_code == 401
        created = await c.post("/schedules", json=JOB, headers=write)
        assert created.status_code == 201
        sid = created.json()["id"]
        assert (await c.get(f"/schedules/{sid}", headers=read)).status_code == 200
        assert (await c.get("/openapi.json", headers=read)).json()["components"]["securitySchemes"]
        for method, path in (
            ("POST", f"/schedules/{sid}/pause"),
            ("PATCH", f"/schedules/{sid}"),
            ("DELETE", f"/schedules/{sid}"),
        ):
            r = await c.request(method, path, headers=read, json={} if method == "PATCH" else None)
            assert assert_problem(r, 403)["type"].endswith("forbidden")
        assert (await c.post(f"/schedules/{sid}/pause", headers=write)).status_code == 200
    assert all(
        TOKEN not in rec.getMessage() and READ_TOKEN not in rec.getMessage()
        for rec in caplog.records
    )


async def test_wrong_tokens_are_slowed_down_per_client(
    db_url: str, engine: AsyncEngine, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """After 20 wrong tokens within a minute a client gets 429 for every request with a token,
    the right one included (a 429 must not tell a wrong guess from a right one), until the
    window ends; requests without a token are not guesses; the log line names no token."""
    from periodic_manager.api.auth import GUESS_WINDOW_S, GUESSES

    settings = Settings(database_url=db_url, api_token=TOKEN)
    write = {"Authorization": f"Bearer {TOKEN}"}
    async for c in app_client(settings, clock, engine):
        for _ in range(30):
            assert (await c.get("/schedules")).status_code == 401  # no token: not counted
        for i in range(GUESSES):
            r = await c.get("/schedules", headers={"Authorization": f"Bearer guess-{i}"})
            assert r.status_code == 401
        for headers in ({"Authorization": "Bearer guess-x"}, write):
            r = await c.get("/schedules", headers=headers)
            assert_problem(r, 429)
            assert 0 < int(r.headers["retry-after"]) <= GUESS_WINDOW_S
        assert (await c.get("/healthz")).status_code == 200
        await clock.advance(GUESS_WINDOW_S)
        assert (await c.get("/schedules", headers=write)).status_code == 200
    said = [r.getMessage() for r in caplog.records if "wrong API tokens" in r.getMessage()]
    assert len(said) == 1 and "guess" not in said[0] and TOKEN not in said[0]


async def test_auth_off_and_exposure_warning(caplog: pytest.LogCaptureFixture) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    with caplog.at_level(logging.WARNING, logger="periodic_manager.api.auth"):
        assert warn_if_exposed(Settings(host="0.0.0.0")) is True
        assert warn_if_exposed(Settings(host="0.0.0.0", api_token=TOKEN)) is False
        assert warn_if_exposed(Settings()) is False
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "0.0.0.0" in caplog.records[
        0
    ].getMessage()
    assert repr(Settings(api_token=TOKEN)).count(TOKEN) == 0


async def test_every_error_is_a_problem(client: httpx.AsyncClient) -> None:
    assert assert_problem(await client.get("/nowhere"), 404)["type"] == "about:blank"
    assert_problem(await client.put("/schedules"), 405)
    body = assert_problem(await client.post("/schedules", json={**JOB, "spec": "61 * * * *"}), 422)
    assert body["type"] == "urn:periodic-manager:problem:validation-error"
    assert body["detail"] == "1 invalid field"
    assert body["errors"] == [
        {
            "location": "body",
            "field": "spec",
            "reason": body["errors"][0]["reason"],
            "code": body["errors"][0]["code"],
        }
    ]


def test_json_log_lines_keep_extra_keys() -> None:
    record = logging.LogRecord(
        "periodic_manager.engine.scheduler",
        logging.WARNING,
        __file__,
        1,
        "skipping %s",
        ("x",),
        None,
    )
    record.schedule = "reports.daily"
    record.slot = "2026-03-01T12:00:00+00:00"
    doc = json.loads(JsonFormatter().format(record))
    assert doc["message"] == "skipping x" and doc["level"] == "WARNING"
    assert doc["schedule"] == "reports.daily" and doc["slot"] == "2026-03-01T12:00:00+00:00"
    assert doc["logger"] == "periodic_manager.engine.scheduler" and doc["ts"].endswith("Z")
