"""The REST API against real PostgreSQL and SQLite, with a virtual clock so slots are exact."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.api import create_app
from periodic_manager.api.state import state_of
from periodic_manager.clock import VirtualClock
from periodic_manager.db import schedule_writer
from periodic_manager.db.models import (
    entries_table,
    jobs_table,
    managers_table,
    schedule_state_table,
)
from tests.support.api import (
    HEARTBEAT_S,
    JOB,
    T0,
    assert_error,
    assert_problem,
    create,
    iso,
    manager_row,
    settings_for,
)

# --- create / read ---------------------------------------------------------------------------


async def test_post_returns_201_location_and_exact_next_runs(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/schedules",
        json={**JOB, "payload": {"n": [1, 2]}, "options": {"queue": "reports"}, "description": "d"},
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert r.headers["location"] == f"/schedules/{body['id']}"
    assert body["next_runs"] == [
        "2026-03-01T12:15:00Z",
        "2026-03-01T12:30:00Z",
        "2026-03-01T12:45:00Z",
    ]
    assert body["created_at"] == body["updated_at"] == iso(T0)
    assert body["payload"] == {"n": [1, 2]} and body["options"] == {"queue": "reports"}
    assert body["timezone"] == "UTC" and body["enabled"] is True and body["anchor"] is None


async def test_next_runs_follow_zone_and_anchor(client: httpx.AsyncClient) -> None:
    berlin = await create(client, name="berlin", spec="0 9 * * *", timezone="Europe/Berlin")
    assert berlin["next_runs"] == [
        "2026-03-02T08:00:00Z",
        "2026-03-03T08:00:00Z",
        "2026-03-04T08:00:00Z",
    ]
    every = await create(
        client, name="every", spec="@every 90s", anchor="2026-03-01T13:00:00+01:00"
    )
    assert every["anchor"] == "2026-03-01T12:00:00Z"
    assert every["next_runs"] == [
        "2026-03-01T12:01:30Z",
        "2026-03-01T12:03:00Z",
        "2026-03-01T12:04:30Z",
    ]
    paused = await create(client, name="paused", enabled=False)
    assert paused["next_runs"] == []


async def test_get_one_and_paginated_list(client: httpx.AsyncClient, clock: VirtualClock) -> None:
    created = [await create(client, name=f"job.{i}") for i in range(5)]
    clock.set(T0 + timedelta(minutes=20))

    one = (await client.get(f"/schedules/{created[0]['id']}")).json()
    assert one["name"] == "job.0" and one["state"] is None and one["errors"] == []
    assert one["next_runs"] == [
        "2026-03-01T12:30:00Z",
        "2026-03-01T12:45:00Z",
        "2026-03-01T13:00:00Z",
    ]

    page = (await client.get("/schedules", params={"limit": 2, "offset": 1})).json()
    assert page["total"] == 5 and page["limit"] == 2 and page["offset"] == 1
    assert [s["name"] for s in page["items"]] == ["job.1", "job.2"]
    default = (await client.get("/schedules")).json()
    assert [s["id"] for s in default["items"]] == sorted(s["id"] for s in created)
    assert default["limit"] == 50 and default["offset"] == 0
    assert (await client.get("/schedules", params={"offset": 5})).json()["items"] == []

    assert_error(await client.get("/schedules", params={"limit": 0}), 422, ["query", "limit"])
    assert_error(await client.get("/schedules", params={"limit": 501}), 422, ["query", "limit"])
    assert_error(await client.get("/schedules", params={"offset": -1}), 422, ["query", "offset"])
    assert_error(await client.get("/schedules", params={"limit": "x"}), 422, ["query", "limit"])


# --- update / delete -------------------------------------------------------------------------


async def test_patch_changes_spec_and_next_runs(
    client: httpx.AsyncClient, clock: VirtualClock
) -> None:
    job = await create(client, payload={"keep": True})
    clock.set(T0 + timedelta(hours=1))
    r = await client.patch(f"/schedules/{job['id']}", json={"spec": "0 * * * *"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["spec"] == "0 * * * *" and body["payload"] == {"keep": True}
    assert body["next_runs"] == [
        "2026-03-01T14:00:00Z",
        "2026-03-01T15:00:00Z",
        "2026-03-01T16:00:00Z",
    ]
    assert body["created_at"] == iso(T0)
    assert body["updated_at"] == iso(T0 + timedelta(hours=1))
    again = (await client.get(f"/schedules/{job['id']}")).json()
    assert again["spec"] == "0 * * * *" and again["next_runs"] == body["next_runs"]

    cleared = await client.patch(
        f"/schedules/{job['id']}", json={"payload": None, "enabled": False}
    )
    assert cleared.status_code == 200, cleared.text
    assert cleared.json()["payload"] is None and cleared.json()["next_runs"] == []


async def test_invalid_patch_is_422_and_leaves_row_unchanged(client: httpx.AsyncClient) -> None:
    job = await create(client)
    await create(client, name="other")
    before = (await client.get(f"/schedules/{job['id']}")).json()
    cases: list[tuple[dict[str, Any], list[Any]]] = [
        ({"spec": "61 * * * *"}, ["body", "spec"]),
        ({"timezone": "Mars/Olympus_Mons"}, ["body", "timezone"]),
        ({"options": {"queu": "x"}}, ["body", "options", "queu"]),
        ({"options": {"timeout": 0}}, ["body", "options", "timeout"]),
        ({"name": None}, ["body", "name"]),
        ({"name": "has space"}, ["body", "name"]),
        ({"anchor": "2026-01-01T00:00:00"}, ["body", "anchor"]),
        ({"colour": "red"}, ["body", "colour"]),
    ]
    for patch, loc in cases:
        assert_error(await client.patch(f"/schedules/{job['id']}", json=patch), 422, loc)
    assert_error(
        await client.patch(f"/schedules/{job['id']}", json={"name": "other"}), 409, ["body", "name"]
    )
    assert (await client.get(f"/schedules/{job['id']}")).json() == before
    r = await client.patch("/schedules/999", json={"spec": "* * * * *"})
    assert assert_problem(r, 404)["detail"] == "schedule 999 not found"


async def test_delete_then_404_and_state_removed(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    job = await create(client)
    async with engine.begin() as conn:
        await conn.execute(
            insert(schedule_state_table).values(
                schedule_key=str(job["id"]), name=job["name"], updated_at=T0
            )
        )
    r = await client.delete(f"/schedules/{job['id']}")
    assert r.status_code == 204 and r.content == b""
    r = await client.get(f"/schedules/{job['id']}")
    assert assert_problem(r, 404)["detail"] == f"schedule {job['id']} not found"
    assert (await client.delete(f"/schedules/{job['id']}")).status_code == 404
    async with engine.connect() as conn:
        assert (
            await conn.execute(select(func.count()).select_from(schedule_state_table))
        ).scalar_one() == 0


# --- bad input -------------------------------------------------------------------------------

BAD_BODIES: list[tuple[dict[str, Any], list[Any]]] = [
    ({"spec": "61 * * * *"}, ["body", "spec"]),
    ({"spec": "x" * 201}, ["body", "spec"]),
    ({"spec": 5}, ["body", "spec"]),
    ({"timezone": "Mars/Olympus_Mons"}, ["body", "timezone"]),
    ({"options": {"queu": "reports"}}, ["body", "options", "queu"]),
    ({"options": {"max_retry": -1}}, ["body", "options", "max_retry"]),
    ({"options": {"max_retry": "3"}}, ["body", "options", "max_retry"]),
    ({"options": {"queue": "no spaces"}}, ["body", "options", "queue"]),
    ({"options": [1, 2]}, ["body", "options"]),
    ({"anchor": "2026-03-01T12:00:00"}, ["body", "anchor"]),
    ({"anchor": 1700000000}, ["body", "anchor"]),
    ({"anchor": "0001-01-01T00:00:00+14:00"}, ["body", "anchor"]),
    ({"name": "bad name!"}, ["body", "name"]),
    ({"name": "trailing.newline\n"}, ["body", "name"]),
    ({"options": {"queue": "q\n"}}, ["body", "options", "queue"]),
    ({"name": ""}, ["body", "name"]),
    ({"name": 42}, ["body", "name"]),
    ({"task_type": ""}, ["body", "task_type"]),
    ({"enabled": "yes"}, ["body", "enabled"]),
    ({"payload": {"text": "nul\u0000byte"}}, ["body", "payload"]),
    ({"description": "nul\u0000byte"}, ["body", "description"]),
    ({"colour": "red"}, ["body", "colour"]),
]


async def test_bad_bodies_are_422_naming_the_field(client: httpx.AsyncClient) -> None:
    failures = []
    for override, loc in BAD_BODIES:
        r = await client.post("/schedules", json={**JOB, **override})
        try:
            assert_error(r, 422, loc)
        except AssertionError as exc:
            failures.append(f"{override!r}: {exc}")
    r = await client.post("/schedules", json={"spec": "* * * * *", "task_type": "t"})
    assert_error(r, 422, ["body", "name"], "missing")
    assert not failures, "\n".join(failures)
    assert (await client.get("/schedules")).json()["total"] == 0


async def test_cron_error_carries_its_code(client: httpx.AsyncClient) -> None:
    r = await client.post("/schedules", json={**JOB, "spec": "0 0 31 2 *"})
    assert_error(r, 422, ["body", "spec"], "never-fires")


RAW_BODIES: list[tuple[bytes, str]] = [
    (b'{"name": "x", ', "json_invalid"),  # truncated
    (b"\xff\xfe{}", "json_invalid"),  # not UTF-8
    (b"[" * 100_000, "json_invalid"),  # nesting beyond the recursion limit
    (
        b'{"name":"x","spec":"* * * * *","task_type":"t","payload":' + b"9" * 5000 + b"}",
        "json_invalid",
    ),
    (b"[1, 2]", "model_attributes_type"),
]


async def test_raw_bodies_that_are_not_usable_json_are_422(client: httpx.AsyncClient) -> None:
    for raw, type_ in RAW_BODIES:
        r = await client.post(
            "/schedules", content=raw, headers={"content-type": "application/json"}
        )
        first = r.json()["errors"][0]
        assert_error(
            r,
            422,
            ["body", *(first["field"] or "").split(".")] if first["field"] else ["body"],
            type_,
        )
        assert first["location"] == "body"
    head = b'{"name":"x","spec":"* * * * *","task_type":"t",'
    for raw, loc in [
        (head + b'"payload": NaN}', ["body", "payload"]),
        (head + b'"options": {"timeout": 1e999}}', ["body", "options", "timeout"]),
        (head + b'"payload": ' + b"[" * 150 + b"]" * 150 + b"}", ["body", "payload"]),
    ]:
        r = await client.post(
            "/schedules", content=raw, headers={"content-type": "application/json"}
        )
        assert_error(r, 422, loc)
    # A body that is not declared JSON never reaches validation (see test_browser_guard.py).
    r = await client.post("/schedules", content=b"name=x", headers={"content-type": "text/plain"})
    assert assert_problem(r, 415)["type"].endswith(":unsupported-media-type")


async def test_huge_numbers_in_the_payload_are_stored_not_500(client: httpx.AsyncClient) -> None:
    big = 10**40
    job = await create(client, payload={"n": big, "f": 0.5})
    got = (await client.get(f"/schedules/{job['id']}")).json()
    assert got["payload"] == {"n": big, "f": 0.5} and got["errors"] == []


async def test_option_numbers_beyond_their_bounds_are_422_naming_the_option(
    client: httpx.AsyncClient,
) -> None:
    huge = 10**400  # math.isfinite() of it raises OverflowError: it must not get that far
    for options, field in [
        ({"max_retry": 10**40}, "options.max_retry"),
        ({"timeout": 1e300}, "options.timeout"),
        ({"timeout": huge}, "options.timeout"),
        ({"unique_ttl": huge}, "options.unique_ttl"),
        ({"misfire": "fire_once", "catchup_window": 1e300}, "options.catchup_window"),
        ({"misfire": "fire_once", "catchup_window": 1e12}, "options.catchup_window"),
        ({"catchup_window": 366 * 86400 + 1}, "options.catchup_window"),
        ({"extra": {"expires": huge}}, "options.extra.expires"),
        ({"extra": {"soft_time_limit": 1e12}}, "options.extra.soft_time_limit"),
        ({"extra": {"priority": 256}}, "options.extra.priority"),
        ({"extra": {"routing_key": ""}}, "options.extra.routing_key"),
    ]:
        r = await client.post("/schedules", json={**JOB, "options": options})
        assert_error(r, 422, ["body", field])
    at_bounds = {"timeout": 366 * 86400, "max_retry": 1000, "extra": {"priority": 255}}
    assert (await create(client, options=at_bounds))["options"] == at_bounds


async def test_bad_path_and_query_ids_are_422(client: httpx.AsyncClient) -> None:
    for path in (
        "/schedules/abc",
        "/schedules/0",
        "/schedules/99999999999999999999",
        "/schedules/1.5",
    ):
        assert_error(await client.get(path), 422, ["path", "schedule_id"])
    assert_error(await client.delete("/schedules/abc"), 422, ["path", "schedule_id"])
    assert_error(await client.patch("/schedules/abc", json={}), 422, ["path", "schedule_id"])
    assert_error(
        await client.get("/entries", params={"schedule_id": "x"}), 422, ["query", "schedule_id"]
    )


# --- conflicts -------------------------------------------------------------------------------


async def test_duplicate_name_is_409(client: httpx.AsyncClient) -> None:
    await create(client)
    r = await client.post("/schedules", json=JOB)
    assert assert_problem(r, 409) == {
        "type": "urn:periodic-manager:problem:name-conflict",
        "title": "Conflict",
        "status": 409,
        "detail": "a schedule named 'reports.daily' already exists",
        "errors": [
            {
                "location": "body",
                "field": "name",
                "reason": "a schedule named 'reports.daily' already exists",
                "code": "conflict",
            }
        ],
    }


async def test_unique_violation_from_the_database_is_409(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pre-check can lose a race; the database's unique constraint decides."""
    a, b = await asyncio.gather(*(client.post("/schedules", json=JOB) for _ in range(2)))
    assert sorted([a.status_code, b.status_code]) == [201, 409]

    async def never_taken(*_: object, **__: object) -> bool:
        return False

    monkeypatch.setattr(schedule_writer, "_name_taken", never_taken)
    assert_error(await client.post("/schedules", json=JOB), 409, ["body", "name"], "conflict")
    other = await create(client, name="other")
    r = await client.patch(f"/schedules/{other['id']}", json={"name": JOB["name"]})
    assert_error(r, 409, ["body", "name"], "conflict")
    assert (await client.get(f"/schedules/{other['id']}")).json()["name"] == "other"


# --- runtime view ----------------------------------------------------------------------------


def entry_row(manager_id: str, key: str, status: str = "active", **extra: Any) -> dict[str, Any]:
    optional = dict.fromkeys(("spec", "timezone", "anchor", "task_type", "queue", "last_error"))
    return {
        **optional,
        "manager_id": manager_id,
        "entry_id": f"{key}-{manager_id}",
        "schedule_key": key,
        "name": f"job.{key}",
        "content_hash": "ab" * 32,
        "status": status,
        "registered_at": T0 - timedelta(minutes=30),
        **extra,
    }


async def test_entries_show_live_managers_only(
    client: httpx.AsyncClient, engine: AsyncEngine, clock: VirtualClock
) -> None:
    good = await create(client)
    # A row written with SQL that no manager can use: the API must still show it, and why.
    async with engine.begin() as conn:
        bad_id = (
            await conn.execute(
                insert(jobs_table)
                .values(
                    name="bad.sql",
                    spec="not cron",
                    task_type="t",
                    options=[1],
                    created_at=T0,
                    updated_at=T0,
                )
                .returning(jobs_table.c.id)
            )
        ).scalar_one()
        await conn.execute(
            insert(managers_table),
            [
                manager_row("live", T0 - timedelta(seconds=3 * HEARTBEAT_S), leader=True),
                manager_row("dead", T0 - timedelta(seconds=3 * HEARTBEAT_S + 1), leader=False),
            ],
        )
        gk, bk = str(good["id"]), str(bad_id)
        await conn.execute(
            insert(entries_table),
            [
                entry_row(
                    "live",
                    gk,
                    spec="*/15 * * * *",
                    timezone="UTC",
                    task_type="reports.build",
                    queue="default",
                ),
                entry_row("live", bk, "error", name="bad.sql", last_error="spec: syntax: not cron"),
                entry_row(
                    "live", "name:code.job", name="code.job", spec="@every 1h", timezone="UTC"
                ),
                entry_row("dead", gk, spec="*/15 * * * *", timezone="UTC"),
                entry_row("dead", bk, "error", last_error="from a dead manager"),
            ],
        )
        await conn.execute(
            insert(schedule_state_table).values(
                schedule_key=gk,
                name=good["name"],
                last_slot_at=T0 - timedelta(seconds=30),
                last_enqueued_at=T0 - timedelta(seconds=29),
                last_message_id="m-1",
                last_status="enqueued",
                enqueued_count=7,
                failed_count=1,
                updated_at=T0,
            )
        )

    items = (await client.get("/entries")).json()["items"]
    assert {(i["manager_id"], i["schedule_key"]) for i in items} == {
        ("live", gk),
        ("live", bk),
        ("live", "name:code.job"),
    }
    by_key = {i["schedule_key"]: i for i in items}
    active = by_key[gk]
    assert active["schedule_id"] == good["id"] and active["status"] == "active"
    assert active["next_slot"] == "2026-03-01T12:15:00Z"
    assert active["previous_slot"] == "2026-03-01T12:00:00Z"
    assert active["hash"] == "ab" * 32 and active["queue"] == "default"
    assert active["manager_is_leader"] is True and active["last_error"] is None
    assert active["registered_at"] == "2026-03-01T11:30:30Z"
    assert by_key[bk]["status"] == "error" and by_key[bk]["next_slot"] is None
    assert by_key[bk]["last_error"] == "spec: syntax: not cron"
    assert by_key["name:code.job"]["schedule_id"] is None
    assert by_key["name:code.job"]["next_slot"] == "2026-03-01T13:00:00Z"

    only = (await client.get("/entries", params={"schedule_id": good["id"]})).json()["items"]
    assert [(i["manager_id"], i["entry_id"]) for i in only] == [("live", f"{gk}-live")]

    detail = (await client.get(f"/schedules/{good['id']}")).json()
    assert detail["state"] == {
        "last_slot_at": "2026-03-01T12:00:00Z",
        "last_enqueued_at": "2026-03-01T12:00:01Z",
        "last_message_id": "m-1",
        "last_status": "enqueued",
        "last_error": None,
        "counts": {
            "enqueued": 7,
            "duplicate": 0,
            "skipped": 0,
            "failed": 1,
            "held": 0,
            "resent": 0,
        },
    }
    bad = await client.get(f"/schedules/{bad_id}")
    assert bad.status_code == 200, bad.text
    # Options that are no object are shown as {}; the API's own judgement of the row comes
    # first (the first bad field a manager meets: options before spec), then the live manager's
    # report (this test's fake manager names the spec). The error shows what is stored.
    assert bad.json()["next_runs"] == [] and bad.json()["options"] == {}
    own, from_manager = bad.json()["errors"]
    assert own == {
        "source": "api",
        "field": "options",
        "reason": "must be a JSON object",
        "message": "options: must be a JSON object",
        "manager_id": None,
        "last_good_since": None,
        "stored": "[1]",
    }
    assert from_manager == {
        "source": "manager",
        "field": "spec",
        "reason": "syntax: not cron",
        "message": "spec: syntax: not cron",
        "manager_id": "live",
        "last_good_since": None,  # this fake manager runs no version of the row
        "stored": None,
    }

    # One second later the live manager has also missed three heartbeats.
    clock.set(T0 + timedelta(seconds=1))
    assert (await client.get("/entries")).json()["items"] == []
    errors = (await client.get(f"/schedules/{bad_id}")).json()["errors"]
    assert [e["source"] for e in errors] == ["api"]


# --- app wiring ------------------------------------------------------------------------------


class FakeManager:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.calls: list[str] = []

    async def start(self) -> None:
        self.calls.append("start")

    async def stop(self) -> None:
        self.calls.append("stop")

    def request_sync(self) -> None:
        self.calls.append("request_sync")


async def test_lifespan_owns_manager_and_writes_request_sync(
    db_url: str, clock: VirtualClock
) -> None:
    made: list[FakeManager] = []

    def factory(engine: AsyncEngine) -> FakeManager:
        made.append(FakeManager(engine))
        return made[-1]

    app = create_app(settings_for(db_url), clock=clock, manager_factory=factory)
    assert made == []
    async with app.router.lifespan_context(app):
        (manager,) = made
        assert manager.engine is state_of(app).engine and state_of(app).manager is manager
        assert state_of(app).clock is clock
        assert manager.calls == ["start"]
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            job = (await c.post("/schedules", json=JOB)).json()
            assert manager.calls == ["start", "request_sync"]
            await c.post("/schedules", json=JOB)  # 409
            await c.post("/schedules", json={**JOB, "name": "x", "spec": "bad"})  # 422
            await c.get(f"/schedules/{job['id']}")
            await c.get("/entries")
            assert manager.calls == ["start", "request_sync"]
            await c.patch(f"/schedules/{job['id']}", json={"spec": "@hourly"})
            await c.patch(f"/schedules/{job['id']}", json={"spec": "@never"})  # 422
            assert (await c.delete(f"/schedules/{job['id']}")).status_code == 204
            await c.delete(f"/schedules/{job['id']}")  # 404
            assert manager.calls == ["start", "request_sync", "request_sync", "request_sync"]
    assert manager.calls[-1] == "stop"


async def test_given_engine_is_not_disposed(db_url: str, engine: AsyncEngine) -> None:
    app = create_app(settings_for(db_url), engine=engine)
    async with app.router.lifespan_context(app):
        assert state_of(app).engine is engine
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            assert (await c.get("/healthz")).json() == {"status": "ok"}
            await create(c)  # SystemClock by default
    async with engine.connect() as conn:
        assert (await conn.execute(select(func.count()).select_from(jobs_table))).scalar_one() == 1


async def test_openapi_declares_the_bodies(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    post = spec["paths"]["/schedules"]["post"]
    assert post["responses"]["201"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ScheduleWithRuns"
    )
    assert "409" in post["responses"] and "422" in post["responses"]
    problem = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    assert post["responses"]["422"]["content"] == problem
    assert post["responses"]["409"]["content"] == problem
    assert set(spec["paths"]) == {
        "/schedules",
        "/schedules/by-name/{name}",
        "/schedules/{schedule_id}",
        "/schedules/{schedule_id}/pause",
        "/schedules/{schedule_id}/resume",
        "/schedules/{schedule_id}/trigger",
        "/schedules/{schedule_id}/backfill",
        "/schedules/{schedule_id}/runs",
        "/schedules/{schedule_id}/stats",
        "/dead-letters",
        "/dead-letters/replay",
        "/dead-letters/purge",
        "/dead-letters/{letter_id}/replay",
        "/calendars",
        "/calendars/{name}",
        "/keys",
        "/keys/{name}",
        "/schedules/{schedule_id}/changes",
        "/entries",
        "/managers",
        "/cron/next",
        "/healthz",
        "/readyz",
        "/metrics",
        # The dashboard's JSON (api/routes/views.py); the dashboard's pages are not documented.
        "/views/whoami",
        "/views/schedules",
        "/views/schedules/{schedule_id}/slots",
        "/views/overview",
        "/views/managers",
        "/views/entries",
        "/views/zones",
    }
    assert "HTTPValidationError" not in spec["components"]["schemas"]


async def test_names_and_queues_are_ascii_and_the_error_says_so(client: httpx.AsyncClient) -> None:
    """``é`` is a letter, but not one a name or a queue may hold: the reason says ASCII."""
    for fields, field in (
        ({"name": "café.daily"}, "name"),
        ({"name": "cafe.daily", "options": {"queue": "réports"}}, "options.queue"),
    ):
        r = await client.post("/schedules", json={"spec": "@daily", "task_type": "t", **fields})
        assert r.status_code == 422, r.text
        [error] = r.json()["errors"]
        assert error["field"] == field, error
        assert "an ASCII letter or digit, then ASCII letters, digits" in error["reason"], error
