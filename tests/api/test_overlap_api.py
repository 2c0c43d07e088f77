"""options.overlap through the API and the manager: validation (422, row errors, the import's
check), and what is shown (/entries, GET /schedules/{id}, run history, metrics, triggers)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis
from sqlalchemy import text

from periodic_manager.db.engine import create_engine
from periodic_manager.db.judge import target_check
from periodic_manager.errors import ConfigError
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.rules import TargetSet, validate_target
from periodic_manager.settings import Settings
from tests.support.celery_arq_rig import Rig, api_rig, at, iso
from tests.support.polling import eventually

GROUP = "workers"
BASE: dict[str, Any] = {"spec": "* * * * *", "task_type": "t"}


def make(**options: Any) -> PeriodicTaskConfig:
    return PeriodicTaskConfig.create(name="x", spec="@hourly", task_type="t", options=options)


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field", "reason"),
    [
        ({"overlap": "sometimes"}, "options.overlap", "must be one of allow, skip, hold"),
        ({"overlap": None}, "options.overlap", "must be one of allow, skip, hold"),
        ({"overlap": ["hold"]}, "options.overlap", "must be one of allow, skip, hold"),
        ({"overlap": "hold", "overlap_timeout": 0}, "options.overlap_timeout", "> 0"),
        ({"overlap": "hold", "overlap_timeout": -3}, "options.overlap_timeout", "> 0"),
        ({"overlap": "hold", "overlap_timeout": "60"}, "options.overlap_timeout", "seconds"),
        ({"overlap": "skip", "overlap_timeout": True}, "options.overlap_timeout", "seconds"),
        ({"overlap": "skip", "overlap_timeout": float("inf")}, "options.overlap_timeout", ""),
        ({"overlap_timeout": 60}, "options.overlap_timeout", "only applies with options.overlap"),
        ({"overlap": "allow", "overlap_timeout": 60}, "options.overlap_timeout", "only applies"),
    ],
)
def test_bad_overlap_options_name_the_field(
    options: dict[str, Any], field: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as err:
        make(**options)
    assert err.value.field == field and reason in err.value.reason


def test_good_overlap_options_are_kept() -> None:
    assert make(overlap="hold", overlap_timeout=90.5).options == {
        "overlap": "hold",
        "overlap_timeout": 90.5,
    }
    assert make(overlap="allow").options == {"overlap": "allow"}


def test_skip_and_hold_need_a_target_with_a_completion_signal() -> None:
    targets = TargetSet(("redis", "outbox"), {"redis": "set PM_REDIS_GROUP"})
    validate_target({"overlap": "hold", "target": "outbox"}, targets)
    validate_target({"overlap": "allow"}, targets)
    validate_target({}, targets)
    for options in ({"overlap": "hold"}, {"overlap": "skip", "target": "redis"}):
        with pytest.raises(ConfigError, match="the redis target cannot tell here: set PM_RE") as e:
            validate_target(options, targets)
        assert e.value.field == "options.overlap" and e.value.code == "no-completion-signal"
    validate_target({"overlap": "hold"}, ("redis",))  # plain names: only names are checked


def test_settings_say_which_targets_can_tell_that_a_task_finished() -> None:
    bare = Settings(target="redis", targets=("outbox", "arq", "celery"))
    assert set(bare.configured_targets().no_completion) == {"redis", "celery"}
    assert "PM_REDIS_GROUP" in bare.configured_targets().no_completion["redis"]
    assert "PM_CELERY_RESULT_BACKEND" in bare.configured_targets().no_completion["celery"]
    full = Settings(
        target="redis",
        targets=("celery",),
        redis_group=GROUP,
        celery_result_backend="redis://127.0.0.1:6379/0",
    )
    assert full.configured_targets().no_completion == {}
    assert Settings(redis_group="  ").redis_group is None
    check = target_check(Settings(target="redis").configured_targets())
    with pytest.raises(ConfigError, match="options.overlap"):
        check(make(overlap="skip"))
    target_check(Settings(target="redis", redis_group=GROUP).configured_targets())(
        make(overlap="skip")
    )


async def test_no_group_means_a_422_naming_options_overlap_and_a_row_error(
    db_url: str, redis_url: str, redis_prefix: str
) -> None:
    settings = Settings(
        database_url=db_url, target="redis", redis_url=redis_url, stream_prefix=redis_prefix
    )
    async with api_rig(db_url, settings) as rig:
        body = {**BASE, "name": "nightly", "options": {"overlap": "hold"}}
        resp = await rig.client.post("/schedules", json=body)
        assert resp.status_code == 422, resp.text
        [error] = resp.json()["errors"]
        assert error["field"] == "options.overlap" and error["code"] == "no-completion-signal"
        assert "PM_REDIS_GROUP" in error["reason"]
        created = await rig.create(name="fine", **BASE)
        resp = await rig.client.patch(
            f"/schedules/{created['id']}", json={"options": {"overlap": "skip"}}
        )
        assert resp.status_code == 422 and "options.overlap" in resp.text

        engine = create_engine(db_url)
        try:
            async with engine.begin() as conn:
                bad_id = (
                    await conn.execute(
                        text(
                            "INSERT INTO periodic_jobs (name, spec, timezone, task_type, options)"
                            " VALUES ('by.sql', '* * * * *', 'UTC', 't', :o) RETURNING id"
                        ),
                        {"o": json.dumps({"overlap": "skip"})},
                    )
                ).scalar_one()
        finally:
            await engine.dispose()
        await rig.advance_to(at(12, 0, 31))  # the sync at 12:00:30 reads it
        detail = (await rig.client.get(f"/schedules/{bad_id}")).json()
        assert "options.overlap" in json.dumps(detail["errors"])
        [entry] = [
            e
            for e in (await rig.client.get("/entries")).json()["items"]
            if e["schedule_id"] == bad_id
        ]
        assert entry["status"] == "error" and "PM_REDIS_GROUP" in entry["last_error"]


# -- what is shown ------------------------------------------------------------------------------


@pytest.fixture
async def rig(
    db_url: str, redis_client: aioredis.Redis, redis_url: str, redis_prefix: str
) -> AsyncIterator[Rig]:
    settings = Settings(
        database_url=db_url,
        target="redis",
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        redis_group=GROUP,
        grace=30,
        heartbeat_interval=5,
    )
    await redis_client.xgroup_create(
        f"{{{redis_prefix}:default}}:stream", GROUP, id="0", mkstream=True
    )
    async with api_rig(db_url, settings) as r:
        yield r


async def test_held_slot_and_previous_task_are_shown_and_counted(
    rig: Rig, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    stream = f"{{{redis_prefix}:default}}:stream"
    created = await rig.create(name="nightly", **BASE, options={"overlap": "hold"})
    sid = created["id"]
    await rig.advance_to(at(12, 1, 0))
    [[_, [(first, fields)]]] = await redis_client.xreadgroup(GROUP, "w1", {stream: ">"})
    await rig.advance_to(at(12, 2, 0))  # held: the 12:01 task runs

    [entry] = (await rig.client.get("/entries", params={"schedule_id": sid})).json()["items"]
    assert entry["held_slot"] == iso(at(12, 2))
    assert entry["previous_task"] == {"task_id": fields["id"], "state": "running"}
    detail = (await rig.client.get(f"/schedules/{sid}")).json()
    assert detail["overlap"]["held_slot"] == iso(at(12, 2))
    assert detail["overlap"]["previous_task"] == {"task_id": fields["id"], "state": "running"}
    assert detail["overlap"]["manager_id"] == entry["manager_id"]
    assert detail["state"]["last_status"] == "held" and detail["state"]["counts"]["held"] == 1

    runs = (await rig.client.get(f"/schedules/{sid}/runs", params={"status": "held"})).json()
    [held] = runs["items"]
    assert held["slot_at"] == iso(at(12, 2))
    assert held["error"] == f"overlap: the previous task {fields['id']} is running"

    trigger = await rig.client.post(f"/schedules/{sid}/trigger")
    assert trigger.status_code == 409, trigger.text
    assert trigger.json()["type"].endswith(":overlap") and "running" in trigger.json()["detail"]

    await redis_client.xack(stream, GROUP, first)
    await rig.advance_to(at(12, 2, 1))  # the next tick sends the held slot
    [entry] = (await rig.client.get("/entries", params={"schedule_id": sid})).json()["items"]
    assert entry["held_slot"] is None and entry["previous_task"]["state"] == "queued"
    items = (await rig.client.get(f"/schedules/{sid}/runs")).json()["items"]
    statuses = [(r["slot_at"], r["status"]) for r in items]
    assert (iso(at(12, 2)), "enqueued") in statuses and (iso(at(12, 2)), "held") in statuses
    [refused] = [r for r in items if r["error"] and r["error"].startswith("trigger:")]
    assert refused["status"] == "skipped" and "overlap" in refused["error"]
    metrics = (await rig.client.get("/metrics")).text
    assert (
        'periodic_manager_slots_by_reason_total{queue="default",reason="overlap",status="held",'
        'target="redis"} 1.0' in metrics
    )
    assert (
        'periodic_manager_slots_by_reason_total{queue="default",reason="overlap-released",'
        'status="enqueued",target="redis"} 1.0' in metrics
    )


async def test_a_schedule_on_allow_shows_no_overlap(rig: Rig) -> None:
    created = await rig.create(name="plain", **BASE)
    await rig.advance_to(at(12, 1, 0))
    [entry] = (await rig.client.get("/entries", params={"schedule_id": created["id"]})).json()[
        "items"
    ]
    assert entry["held_slot"] is None and entry["previous_task"] is None
    assert (await rig.client.get(f"/schedules/{created['id']}")).json()["overlap"] is None


def test_import_refuses_skip_or_hold_where_the_target_cannot_tell(
    sqlite_url: str,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from periodic_manager.cli.main import main
    from periodic_manager.db.migrate import upgrade_sync

    upgrade_sync(sqlite_url)
    doc = [{"name": "nightly", "spec": "@daily", "task_type": "t", "options": {"overlap": "hold"}}]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("PM_TARGET", "redis")
    assert main(["import", str(path), "--database-url", sqlite_url]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "entry 1 ('nightly'): options.overlap:" in line and "PM_REDIS_GROUP" in line
    monkeypatch.setenv("PM_REDIS_GROUP", GROUP)
    assert main(["import", str(path), "--database-url", sqlite_url]) == 0


async def test_registering_from_code_checks_the_target_too(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    from periodic_manager.runtime.manager import PeriodicTaskManager
    from periodic_manager.targets.memory import MemoryTarget
    from periodic_manager.targets.redis.streams import RedisStreamsTarget
    from periodic_manager.targets.routing import RoutingTarget

    hold = PeriodicTaskConfig.create(
        name="h", spec="@hourly", task_type="t", options={"overlap": "hold"}
    )
    manager = PeriodicTaskManager(None, MemoryTarget())
    with pytest.raises(ConfigError, match="no completion signal") as err:
        manager.register(hold)
    assert err.value.field == "options.overlap"
    routing = RoutingTarget(
        {
            "redis": RedisStreamsTarget(redis_client, prefix=redis_prefix, group=GROUP),
            "outbox": MemoryTarget(),
        },
        default="redis",
    )
    PeriodicTaskManager(None, routing).register(hold)  # the default, redis with a group: fine
    with pytest.raises(ConfigError, match="no completion signal"):
        PeriodicTaskManager(None, routing).register(
            PeriodicTaskConfig.create(
                name="o",
                spec="@hourly",
                task_type="t",
                options={"overlap": "skip", "target": "outbox"},
            )
        )
    manager.register(PeriodicTaskConfig.create(name="a", spec="@hourly", task_type="t"))


async def test_a_backfill_follows_options_overlap_skip(
    rig: Rig, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    """A backfilled slot whose previous task is unfinished is recorded skipped, not sent; once
    the worker acknowledged it, the same backfill sends the slot."""
    stream = f"{{{redis_prefix}:default}}:stream"
    sid = (await rig.create(name="guarded", **BASE, options={"overlap": "skip"}))["id"]
    await rig.advance_to(at(12, 1, 0))
    [[_, [(first, _fields)]]] = await redis_client.xreadgroup(GROUP, "w1", {stream: ">"})
    body = {"from": iso(at(11, 59)), "to": iso(at(12, 0, 30))}  # 11:59 and 12:00, never sent

    async def recorded() -> int:
        items = (await rig.client.get(f"/schedules/{sid}/runs")).json()["items"]
        return len(
            [
                r
                for r in items
                if r["status"] == "backfilled" or (r["error"] or "").startswith("backfill")
            ]
        )

    async def backfill() -> dict[str, Any]:
        """POST it; once both slots are recorded (the first pacing step), the clock moves the
        one step that ends the pace."""
        before = await recorded()
        call = asyncio.ensure_future(rig.client.post(f"/schedules/{sid}/backfill", json=body))

        async def both() -> bool:
            return await recorded() == before + 2

        await eventually(both, "the backfill's two slots recorded")
        await rig.advance_to(rig.clock.now() + timedelta(seconds=0.1))
        r = await asyncio.wait_for(call, 30)
        assert r.status_code == 200, r.text
        return dict(r.json())

    refused = await backfill()
    assert (refused["sent"], refused["skipped"], refused["slots"]) == (0, 2, 2)
    runs = (await rig.client.get(f"/schedules/{sid}/runs", params={"status": "skipped"})).json()
    assert {r["slot_at"] for r in runs["items"]} == {iso(at(11, 59)), iso(at(12, 0))}
    assert all(r["error"].startswith("backfill: overlap") for r in runs["items"])
    await redis_client.xack(stream, GROUP, first)
    done = await backfill()
    assert done["sent"] == 1 and done["skipped"] == 1  # 11:59 goes out and is now unfinished
    sent = [f for _, f in await redis_client.xrange(stream)]
    assert [f["scheduled_at"] for f in sent] == [iso(at(12, 1)), iso(at(11, 59))]
