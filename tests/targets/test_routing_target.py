"""Choosing a target: settings (PM_TARGET, PM_TARGETS), the RoutingTarget, the write-time 422 and
the sync-time row error for a schedule naming a target the deployment does not run."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError
from sqlalchemy import text

from periodic_manager.contracts import Task
from periodic_manager.db.engine import create_engine
from periodic_manager.db.judge import target_check
from periodic_manager.errors import ConfigError, TargetError, TaskRefused
from periodic_manager.providers import StaticProvider
from periodic_manager.runtime.assemble import build_target
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.settings import Settings
from periodic_manager.targets.arq import ArqTarget
from periodic_manager.targets.base import task_id_for
from periodic_manager.targets.celery.target import CeleryTarget
from periodic_manager.targets.memory import MemoryTarget
from periodic_manager.targets.outbox import OutboxTarget
from periodic_manager.targets.redis.streams import RedisStreamsTarget
from periodic_manager.targets.routing import RoutingTarget
from tests.support.celery_arq_rig import Rig, api_rig, at, iso

SLOT = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)


def task(name: str, target: str | None = None) -> Task:
    key = f"{name}:{iso(SLOT)}"
    options = {} if target is None else {"target": target}
    return Task(
        id=task_id_for(key),
        name=name,
        task_type="t",
        payload=None,
        queue="default",
        options=options,
        idempotency_key=key,
        scheduled_at=SLOT,
        expires_at=SLOT + timedelta(seconds=30),
    )


# -- RoutingTarget ------------------------------------------------------------------------------


async def test_routing_sends_each_task_to_its_target_in_one_call_each_and_keeps_order() -> None:
    outbox, redis = MemoryTarget(), MemoryTarget()
    routing = RoutingTarget({"outbox": outbox, "redis": redis}, default="outbox")
    batch = [task("a"), task("b", "redis"), task("c", "outbox"), task("d", "redis")]
    results = await routing.enqueue(batch, SLOT)
    assert [r.task.name for r in results] == ["a", "b", "c", "d"]
    assert [r.status for r in results] == ["enqueued"] * 4
    assert [[t.name for t in b] for b in outbox.batches] == [["a", "c"]]
    assert [[t.name for t in b] for b in redis.batches] == [["b", "d"]]
    again = await routing.enqueue(batch, SLOT)
    assert [r.status for r in again] == ["duplicate"] * 4


async def test_a_failing_target_fails_its_tasks_only_and_all_failing_raises() -> None:
    outbox, redis = MemoryTarget(), MemoryTarget()
    routing = RoutingTarget({"outbox": outbox, "redis": redis}, default="outbox")
    redis.fail_with = "redis is down"
    batch = [task("a"), task("b", "redis"), task("c", "arq")]
    results = await routing.enqueue(batch, SLOT)
    assert [r.status for r in results] == ["enqueued", "failed", "failed"]
    assert results[1].error == "redis: redis is down"
    assert results[2].error == "target 'arq' is not configured"
    # A target down may come back (retried); a target not configured never will (refused).
    assert [r.permanent for r in results] == [False, False, True]
    outbox.fail_with = "outbox is down"
    with pytest.raises(TargetError, match="outbox: outbox is down; redis: redis is down"):
        await routing.enqueue([task("x"), task("y", "redis")], SLOT)
    with pytest.raises(ValueError, match="default target"):
        RoutingTarget({"redis": redis}, default="outbox")


async def test_a_group_its_target_refuses_for_good_stays_refused() -> None:
    outbox, redis = MemoryTarget(), MemoryTarget()
    routing = RoutingTarget({"outbox": outbox, "redis": redis}, default="outbox")

    async def refuse(tasks: object, now: object) -> object:
        raise TaskRefused("redis: WRONGTYPE the stream is a string")

    redis.enqueue = refuse  # type: ignore[method-assign, assignment]
    outbox.fail_with = "outbox is down"
    # Every target failed, but one group was refused for good: per-task results say which.
    results = await routing.enqueue([task("x"), task("y", "redis")], SLOT)
    assert [(r.status, r.permanent) for r in results] == [("failed", False), ("failed", True)]


# -- settings and wiring ------------------------------------------------------------------------


def test_pm_targets_is_a_comma_separated_list_beside_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PM_TARGET", "redis")
    monkeypatch.setenv("PM_TARGETS", " celery, ARQ ,redis,")
    settings = Settings()
    assert settings.targets == ("celery", "arq", "redis")
    assert settings.configured_targets() == ("redis", "celery", "arq")
    monkeypatch.setenv("PM_TARGETS", "celery,rabbit")
    with pytest.raises(ValidationError, match="targets"):
        Settings()
    monkeypatch.delenv("PM_TARGETS")
    monkeypatch.setenv("PM_TARGET", "sqs")
    with pytest.raises(ValidationError, match="target"):
        Settings()


async def test_build_target_routes_when_more_than_one_target_is_configured(
    sqlite_url: str,
) -> None:
    engine = create_engine(sqlite_url)
    try:
        single = build_target(Settings(database_url=sqlite_url), engine)
        assert isinstance(single, OutboxTarget)
        settings = Settings(
            database_url=sqlite_url,
            target="outbox",
            targets=("redis", "celery", "arq"),
            redis_url="redis://127.0.0.1:6379/3",
            arq_redis_url="redis://127.0.0.1:6379/4",
        )
        routing = build_target(settings, engine)
        assert isinstance(routing, RoutingTarget) and routing.default == "outbox"
        kinds = {name: type(t) for name, t in routing.targets.items()}
        assert kinds == {
            "outbox": OutboxTarget,
            "redis": RedisStreamsTarget,
            "celery": CeleryTarget,
            "arq": ArqTarget,
        }
        celery = routing.targets["celery"]
        arq = routing.targets["arq"]
        assert isinstance(celery, CeleryTarget) and isinstance(arq, ArqTarget)
        # Celery's broker defaults to PM_REDIS_URL, its claims live beside the messages.
        assert celery.app.conf.broker_url == "redis://127.0.0.1:6379/3"
        assert celery.claims.client.connection_pool.connection_kwargs["db"] == 3
        assert arq.client.connection_pool.connection_kwargs["db"] == 4
        await routing.close()
        # A broker that is not Redis keeps the claims in PM_REDIS_URL.
        amqp = Settings(
            database_url=sqlite_url,
            target="celery",
            celery_broker_url="amqp://guest@127.0.0.1//",
            redis_url="redis://127.0.0.1:6379/5",
        )
        celery = build_target(amqp, engine)
        assert isinstance(celery, CeleryTarget)
        assert celery.claims.client.connection_pool.connection_kwargs["db"] == 5
        await celery.close()
    finally:
        await engine.dispose()


def test_the_manager_check_refuses_a_schedule_naming_an_unconfigured_target() -> None:
    check = target_check(Settings(target="outbox", targets=("redis",)).configured_targets())
    check(
        PeriodicTaskConfig.create(
            name="ok", spec="@hourly", task_type="t", options={"target": "redis"}
        )
    )
    check(PeriodicTaskConfig.create(name="default", spec="@hourly", task_type="t"))
    off = PeriodicTaskConfig.create(
        name="off", spec="@hourly", task_type="t", options={"target": "celery"}
    )
    with pytest.raises(ConfigError, match="target 'celery' is not configured") as err:
        check(off)
    assert err.value.field == "options.target" and err.value.code == "unconfigured-target"
    with pytest.raises(
        ConfigError, match="options.target: must be one of arq, .*celery, dramatiq, .*outbox"
    ):
        PeriodicTaskConfig.create(
            name="x", spec="@hourly", task_type="t", options={"target": "sqs"}
        )
    with pytest.raises(ConfigError, match="target 'arq' is not configured"):
        PeriodicTaskConfig.create(
            name="x",
            spec="@hourly",
            task_type="t",
            options={"target": "arq"},
            allowed_targets=("outbox",),
        )


# -- through the API and the manager ---------------------------------------------------------


@pytest.fixture
async def rig(
    db_url: str, redis_client: aioredis.Redis, redis_url: str, redis_prefix: str
) -> AsyncIterator[Rig]:
    """Outbox by default and Redis Streams beside it, built from the settings (RoutingTarget)."""
    settings = Settings(
        database_url=db_url,
        target="outbox",
        targets=("redis",),
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        sync_interval=30,
        grace=30,
        heartbeat_interval=5,
    )
    async with api_rig(db_url, settings) as r:
        yield r


async def test_unconfigured_or_unknown_target_is_a_422_at_write_time(rig: Rig) -> None:
    base: dict[str, Any] = {"name": "w", "spec": "* * * * *", "task_type": "t"}
    resp = await rig.client.post("/schedules", json={**base, "options": {"target": "celery"}})
    assert resp.status_code == 422, resp.text
    assert "options" in resp.text and "'celery' is not configured" in resp.text
    resp = await rig.client.post("/schedules", json={**base, "options": {"target": "sqs"}})
    assert resp.status_code == 422 and "must be one of" in resp.text
    created = await rig.create(**base, options={"target": "redis"})
    resp = await rig.client.patch(
        f"/schedules/{created['id']}", json={"options": {"target": "arq"}}
    )
    assert resp.status_code == 422 and "'arq' is not configured" in resp.text


async def _stream(client: aioredis.Redis, prefix: str, queue: str) -> list[dict[str, str]]:
    return [fields for _, fields in await client.xrange(f"{{{prefix}:{queue}}}:stream")]


async def test_each_schedule_reaches_its_target_and_a_row_naming_another_is_reported(
    rig: Rig, db_url: str, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    await rig.create(name="to.outbox", task_type="t", options={"queue": "q"})
    await rig.create(name="to.redis", task_type="t", options={"queue": "q", "target": "redis"})
    engine = create_engine(db_url)
    try:
        async with engine.begin() as conn:
            result = await conn.execute(
                text(
                    "INSERT INTO periodic_jobs (name, spec, timezone, task_type, payload, options,"
                    " enabled) VALUES ('to.celery', '* * * * *', 'UTC', 't', 'null',"
                    " :options, true) RETURNING id"
                ),
                {"options": json.dumps({"target": "celery"})},
            )
            bad_id = result.scalar_one()
        await rig.advance_to(at(12, 2, 30))  # the sync at 12:00:30 reads the SQL row
        async with engine.connect() as conn:
            rows = (await conn.execute(text("SELECT name, scheduled_at FROM pm_outbox"))).all()
    finally:
        await engine.dispose()
    assert sorted(name for name, _ in rows) == ["to.outbox", "to.outbox"]
    stream = await _stream(redis_client, redis_prefix, "q")
    assert [m["name"] for m in stream] == ["to.redis", "to.redis"]
    assert [m["scheduled_at"] for m in stream] == [iso(at(12, 1)), iso(at(12, 2))]

    detail = (await rig.client.get(f"/schedules/{bad_id}")).json()
    assert "'celery' is not configured" in json.dumps(detail["errors"])
    items = (await rig.client.get("/entries")).json()
    items = items["items"] if isinstance(items, dict) else items
    [bad] = [e for e in items if e["schedule_id"] == bad_id]
    assert bad["status"] == "error" and "options.target" in bad["last_error"]


async def test_a_task_failed_alone_is_counted_and_reported_on_its_entry() -> None:
    from periodic_manager.clock import VirtualClock
    from periodic_manager.runtime.manager import PeriodicTaskManager

    outbox, redis = MemoryTarget(), MemoryTarget()
    redis.fail_with = "redis is down"
    configs = [
        PeriodicTaskConfig.create(name="fine", spec="* * * * *", task_type="t"),
        PeriodicTaskConfig.create(
            name="down", spec="* * * * *", task_type="t", options={"target": "redis"}
        ),
    ]
    clock = VirtualClock(datetime(2024, 5, 1, 12, 0, 30, tzinfo=UTC))
    routing = RoutingTarget({"outbox": outbox, "redis": redis}, default="outbox")
    manager = PeriodicTaskManager(StaticProvider(configs), routing, clock=clock)
    await manager.start()
    try:
        await clock.advance_to(at(12, 1, 10), settle=lambda: manager.wait_settled(clock.now()))
    finally:
        await manager.stop()
    entries = {e.config.name: e for e in manager.entries()}
    assert outbox.slots("fine") == [at(12, 1)]
    assert entries["fine"].last_error is None
    assert entries["down"].last_error == "redis: redis is down"
    # Counted by outcome in the run history (the memory store's per-schedule state).
    state = manager.store.state  # type: ignore[attr-defined]
    assert state[entries["fine"].key].counts == {"enqueued": 1}
    assert state[entries["down"].key].counts == {"failed": 1}


@pytest.mark.parametrize(
    ("target", "urls", "setting"),
    [
        ("redis", {"redis_url": "oracle://h/0"}, "PM_REDIS_URL"),
        ("rq", {"rq_redis_url": "oracle://h/0"}, "PM_RQ_REDIS_URL"),
        ("rq", {"redis_url": "oracle://h/0"}, "PM_REDIS_URL"),  # rq falls back to redis_url
        ("arq", {"arq_redis_url": "oracle://h/0"}, "PM_ARQ_REDIS_URL"),
        ("arq", {"redis_url": "oracle://h/0"}, "PM_REDIS_URL"),
    ],
)
def test_a_url_refused_when_the_target_is_built_names_the_setting_it_came_from(
    target: str, urls: dict[str, str], setting: str, sqlite_url: str
) -> None:
    settings = Settings(database_url=sqlite_url, target=target, **urls)  # type: ignore[arg-type]
    assert settings.url_setting(target) == setting
    with pytest.raises(ConfigError) as caught:
        build_target(settings, engine=None)  # type: ignore[arg-type]
    assert caught.value.field == setting and str(caught.value).startswith(f"{setting}: "), (
        caught.value
    )
