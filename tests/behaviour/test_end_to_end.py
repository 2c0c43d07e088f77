"""The whole path on real services: HTTP or SQL edits -> periodic_jobs -> manager -> Redis / outbox.

Time is a VirtualClock shared by the API and the in-process manager; every wait is on the
manager having handled an instant, never on wall time.
"""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.schedules.rules import canonical_json
from periodic_manager.targets.base import task_id_for
from tests.support.e2e import T0, Rig, at, e2e_rig, iso
from tests.support.tcpproxy import TcpProxy


async def test_http_create_fire_patch_delete(rig: Rig) -> None:
    body = {
        "name": "reports.daily",
        "spec": "* * * * *",
        "task_type": "reports.build",
        "payload": {"format": "pdf", "n": 1},
        "options": {"queue": "reports", "max_retry": 3},
        "description": "every minute",
    }
    resp = await rig.client.post("/schedules", json=body)
    assert resp.status_code == 201, resp.text
    created = resp.json()
    sid = created["id"]
    assert resp.headers["location"].endswith(f"/schedules/{sid}")
    assert created["next_runs"] == [iso(at(12, 1)), iso(at(12, 2)), iso(at(12, 3))]

    await rig.advance_to(T0)  # the in-process manager picked the POST up at once
    entries = (await rig.client.get("/entries")).json()
    items = entries["items"] if isinstance(entries, dict) else entries
    [entry] = [e for e in items if e["schedule_id"] == sid]
    assert entry["next_slot"] == iso(at(12, 1)) and entry["manager_id"] == rig.manager.manager_id
    assert (
        entry["spec"] == "* * * * *"
        and entry["queue"] == "reports"
        and entry["task_type"] == "reports.build"
    )

    await rig.advance_to(at(12, 3, 30))
    msgs = await rig.messages("reports")
    assert [m["scheduled_at"] for m in msgs] == [iso(at(12, m)) for m in (1, 2, 3)]
    for m, minute in zip(msgs, (1, 2, 3), strict=True):
        key = f"reports.daily:{iso(at(12, minute))}"
        assert m == {
            "id": task_id_for(key),
            "type": "reports.build",
            "payload": canonical_json({"format": "pdf", "n": 1}),
            "queue": "reports",
            "name": "reports.daily",
            "idempotency_key": key,
            "scheduled_at": iso(at(12, minute)),
            "enqueued_at": iso(at(12, minute)),
            "options": canonical_json({"queue": "reports", "max_retry": 3}),
        }

    resp = await rig.client.patch(f"/schedules/{sid}", json={"spec": "*/2 * * * *"})
    assert resp.status_code == 200, resp.text
    await rig.advance_to(at(12, 8, 30))
    # New timing from the change on: no duplicate, no gap (12:04 is the first even minute after).
    assert await rig.slots("reports.daily", "reports") == [
        iso(at(12, m)) for m in (1, 2, 3, 4, 6, 8)
    ]
    items = (await rig.client.get("/entries")).json()
    items = items["items"] if isinstance(items, dict) else items
    [entry] = [e for e in items if e["schedule_id"] == sid]
    assert entry["previous_slot"] == iso(at(12, 8)) and entry["next_slot"] == iso(at(12, 10))

    resp = await rig.client.delete(f"/schedules/{sid}")
    assert resp.status_code == 204
    await rig.advance_to(at(12, 15))
    assert len(await rig.slots("reports.daily", "reports")) == 6
    items = (await rig.client.get("/entries")).json()
    items = items["items"] if isinstance(items, dict) else items
    assert [e for e in items if e["schedule_id"] == sid] == []


async def _sql(engine: AsyncEngine, stmt: str, **params: Any) -> Any:
    async with engine.begin() as conn:
        return await conn.execute(text(stmt), params)


async def test_plain_sql_insert_update_delete_are_seen_at_the_next_sync(rig: Rig) -> None:
    result = await _sql(
        rig.engine,
        "INSERT INTO periodic_jobs (name, spec, timezone, task_type, payload, options, enabled)"
        " VALUES ('sql.job', '* * * * *', 'UTC', 'sql.task', '{\"a\": 1}', '{}', true) RETURNING id",
    )
    sid = result.scalar_one()
    # The sync loop (every 30 s) finds the row; nothing was signalled.
    await rig.advance_to(at(12, 2, 30))
    assert await rig.slots("sql.job") == [iso(at(12, 1)), iso(at(12, 2))]
    first = (await rig.messages())[0]
    assert json.loads(first["payload"]) == {"a": 1} and first["type"] == "sql.task"

    # Changed at 12:02:30; the sync at 12:02:30.5 sees it, before the old 12:03 slot.
    await _sql(rig.engine, "UPDATE periodic_jobs SET spec = '*/5 * * * *' WHERE id = :id", id=sid)
    await rig.advance_to(at(12, 11))
    assert await rig.slots("sql.job") == [iso(at(12, m)) for m in (1, 2, 5, 10)]

    await _sql(rig.engine, "DELETE FROM periodic_jobs WHERE id = :id", id=sid)
    await rig.advance_to(at(12, 21))
    assert await rig.slots("sql.job") == [iso(at(12, m)) for m in (1, 2, 5, 10)]


async def test_bad_row_is_reported_while_the_others_fire(rig: Rig) -> None:
    good = await rig.client.post(
        "/schedules", json={"name": "good", "spec": "* * * * *", "task_type": "t"}
    )
    assert good.status_code == 201
    bad_id = (
        await _sql(
            rig.engine,
            "INSERT INTO periodic_jobs (name, spec, timezone, task_type, payload, options, enabled)"
            " VALUES ('bad', '61 * * * *', 'UTC', 't', 'null', '{}', true) RETURNING id",
        )
    ).scalar_one()
    await rig.advance_to(at(12, 3, 30))
    assert await rig.slots("good") == [iso(at(12, m)) for m in (1, 2, 3)]
    detail = (await rig.client.get(f"/schedules/{bad_id}")).json()
    assert detail["errors"] and "minute" in detail["errors"][0]["message"]
    items = (await rig.client.get("/entries")).json()
    items = items["items"] if isinstance(items, dict) else items
    [bad] = [e for e in items if e["schedule_id"] == bad_id]
    assert bad["status"] == "error" and "out-of-range" in bad["last_error"]


async def test_database_unreachable_during_a_sync_keeps_the_schedule_firing(
    proxied: tuple[str, TcpProxy], redis_client: aioredis.Redis, redis_prefix: str, redis_url: str
) -> None:
    url, proxy = proxied
    from periodic_manager.db.migrate import upgrade

    await upgrade(url)
    # Without leader election the manager keeps firing from memory while the database is away
    # (with it, a leader that cannot prove its leadership stops: see test_leadership.py).
    async for rig in e2e_rig(url, "redis", redis_prefix, redis_url, leader_election=False):
        assert (
            await rig.client.post(
                "/schedules", json={"name": "keep", "spec": "* * * * *", "task_type": "t"}
            )
        ).status_code == 201
        await rig.advance_to(at(12, 1, 30))
        await proxy.cut()
        report = await rig.manager.sync()
        assert not report.ok and rig.manager.last_sync_error
        await rig.advance_to(at(12, 4, 30))  # several sync intervals with the database gone
        assert len(rig.manager.entries()) == 1
        await proxy.restore()
        await rig.advance_to(at(12, 6, 30))
        assert rig.manager.last_sync_error is None
        assert await rig.slots("keep") == [iso(at(12, m)) for m in range(1, 7)]
