"""asynq's own tools see the manager: its entries published as asynq's scheduler publishes them
(``asynq:schedulers``, ``asynq:schedulers:{<manager id>}``), each enqueue in the entry's history
(``asynq:scheduler_history:<entry id>``), decoded here with the reference consumer's own protobuf
decoder (tests/support/asynq_consumer.py), as ``asynq cron ls`` and ``asynq cron history`` read
them. On a private ``redis-server`` (asynq's key names are fixed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis

from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import AnnouncedEntry, Task
from periodic_manager.engine.entry import ScheduledEntry
from periodic_manager.providers import StaticProvider
from periodic_manager.runtime.announcing import Announcer
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.runtime.memory_store import MemoryRuntimeStore
from periodic_manager.runtime.timing import Timing
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.targets.asynq import scheduler
from periodic_manager.targets.asynq.target import AsynqTarget
from periodic_manager.targets.base import task_id_for
from tests.support.asynq_consumer import (
    SCHEDULER_ENQUEUE_EVENT,
    SCHEDULER_ENTRY,
    Consumer,
    decode,
    encode_pairs,
)
from tests.support.servers import RedisServer

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
GO_ZERO = (scheduler.GO_ZERO_TIME_S, 0)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(persist=False) as made:
        yield made


@pytest.fixture
async def client(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    made = aioredis.from_url(server.url)
    await made.flushall()
    yield made
    await made.aclose()


@pytest.fixture
async def target(server: RedisServer, client: aioredis.Redis) -> AsyncIterator[AsynqTarget]:
    made = AsynqTarget.from_url(server.url, prefix="pm")
    yield made
    await made.close()


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (30, "30s"),
        (90, "1m30s"),
        (3600, "1h0m0s"),
        (86400, "24h0m0s"),
        (1.5, "1.5s"),
        (3661.25, "1h1m1.25s"),
        (0.5, "500ms"),
        (0.0015, "1.5ms"),
    ],
)
def test_durations_read_as_go_prints_them(seconds: float, text: str) -> None:
    assert scheduler.go_duration(seconds) == text


async def entries_of(client: aioredis.Redis, manager_id: str) -> list[dict[str, object]]:
    raw = await client.lrange(scheduler.entries_key(manager_id), 0, -1)
    return [decode(item, SCHEDULER_ENTRY) for item in raw]


async def test_announced_entries_read_as_asynq_scheduler_entries(
    target: AsynqTarget, client: aioredis.Redis
) -> None:
    options = {
        "queue": "mail",
        "max_retry": 5,
        "timeout": 90,
        "unique_ttl": 3600,
        "extra": {"retention": 86400},
    }
    berlin = AnnouncedEntry(
        "digest.alice",
        "0 7 * * *",
        "Europe/Berlin",
        "email:digest",
        '{"to":"alice@example.com"}',
        options,
        datetime(2024, 5, 2, 5, 0, tzinfo=UTC),
        datetime(2024, 5, 1, 5, 0, 0, 250000, tzinfo=UTC),
    )
    fresh = AnnouncedEntry("cleanup", "@every 90s", "UTC", "db:cleanup", "null", {}, None, None)
    await target.announce("host-1-ab", [berlin, fresh], T0)

    key = "asynq:schedulers:{host-1-ab}"
    assert await client.zrange(scheduler.ALL_SCHEDULERS, 0, -1, withscores=True) == [
        (key.encode(), T0.timestamp() + scheduler.ANNOUNCE_TTL_S)
    ]
    assert 0 < await client.ttl(key) <= scheduler.ANNOUNCE_TTL_S
    got = sorted(await entries_of(client, "host-1-ab"), key=lambda e: str(e["id"]))
    assert got == [
        {
            "id": "cleanup",
            "spec": "@every 90s",
            "task_type": "db:cleanup",
            "task_payload": b"",
            "enqueue_options": ['Queue("default")'],
            "next_enqueue_time": GO_ZERO,
            "prev_enqueue_time": GO_ZERO,
        },
        {
            "id": "digest.alice",
            "spec": "CRON_TZ=Europe/Berlin 0 7 * * *",
            "task_type": "email:digest",
            "task_payload": b'{"to":"alice@example.com"}',
            "enqueue_options": [
                'Queue("mail")',
                "MaxRetry(5)",
                "Timeout(1m30s)",
                "Unique(1h0m0s)",
                "Retention(24h0m0s)",
            ],
            "next_enqueue_time": (int(datetime(2024, 5, 2, 5, tzinfo=UTC).timestamp()), 0),
            "prev_enqueue_time": (int(datetime(2024, 5, 1, 5, tzinfo=UTC).timestamp()), 250000000),
        },
    ]

    # The next round replaces the list; none withdraws it.
    await target.announce("host-1-ab", [fresh], T0 + timedelta(seconds=5))
    assert [e["id"] for e in await entries_of(client, "host-1-ab")] == ["cleanup"]
    await target.announce("host-1-ab", [], T0 + timedelta(seconds=10))
    assert await client.exists(key) == 0
    assert await client.zcard(scheduler.ALL_SCHEDULERS) == 0


def slot_task(name: str, at: datetime) -> Task:
    key = f"{name}:{at.isoformat().replace('+00:00', 'Z')}"
    return Task(task_id_for(key), name, "email:digest", {}, "default", {}, key, at, at)


async def test_each_enqueue_is_in_its_entry_history_capped_as_asynq_caps_it(
    target: AsynqTarget, client: aioredis.Redis
) -> None:
    history = scheduler.history_key("digest.bob")
    # 1000 older events already there (asynq keeps the newest 1000).
    old = {encode_pairs([(1, f"old{i}".encode())]): i for i in range(scheduler.MAX_EVENTS)}
    await client.zadd(history, old)
    at = T0 + timedelta(minutes=1)
    task = slot_task("digest.bob", at)
    assert (await target.enqueue([task], at))[0].status == "enqueued"
    assert (await target.enqueue([task], at))[0].status == "duplicate"  # no event for it
    assert await client.zcard(history) == scheduler.MAX_EVENTS
    (newest, score), *_ = await client.zrevrange(history, 0, 0, withscores=True)
    assert score == at.timestamp()
    event = decode(newest, SCHEDULER_ENQUEUE_EVENT)
    assert event == {"task_id": task.idempotency_key, "enqueue_time": (int(at.timestamp()), 0)}
    assert await client.zscore(history, encode_pairs([(1, b"old0")])) is None  # the oldest gone


async def test_a_running_manager_announces_its_entries_and_withdraws_them_at_stop(
    target: AsynqTarget, client: aioredis.Redis
) -> None:
    clock = VirtualClock(T0)
    config = PeriodicTaskConfig.create(
        name="digest.carol",
        spec="@every 10s",
        task_type="email:digest",
        payload={"to": "carol@example.com"},
        options={"queue": "mail"},
        schedule_id=1,
    )
    manager = PeriodicTaskManager(
        StaticProvider([config]),
        target,
        clock=clock,
        store=MemoryRuntimeStore(),
        timing=Timing(sync_interval=30, grace=30),
        close_target=False,
    )
    await manager.start()
    try:
        await clock.advance(10, settle=lambda: manager.wait_settled(clock.now()))
        await clock.advance(5, settle=lambda: manager.wait_settled(clock.now()))
        # The announcement at 12:00:15 is the announcer's own task writing to Redis: the settle
        # above waits for the scheduler, not for it. Give it its turn (bounded, real I/O).
        for _ in range(200):
            entries = await entries_of(client, manager.manager_id)
            if entries and entries[0]["prev_enqueue_time"][0] > 0:  # type: ignore[index]
                break
            await asyncio.sleep(0.01)
        (entry,) = entries
        assert entry["id"] == "digest.carol" and entry["spec"] == "@every 10s"
        assert entry["prev_enqueue_time"] == (int((T0 + timedelta(seconds=10)).timestamp()), 0)
        assert entry["next_enqueue_time"] == (int((T0 + timedelta(seconds=20)).timestamp()), 0)
        (event,) = await client.zrange(scheduler.history_key("digest.carol"), 0, -1)
        assert decode(event, SCHEDULER_ENQUEUE_EVENT)["task_id"] == (
            "digest.carol:2024-05-01T12:00:10Z"
        )
        (msg,) = await Consumer(client).drain("mail", clock.now().timestamp(), bool)
        assert msg["payload"] == b'{"to":"carol@example.com"}'
    finally:
        await manager.stop()
    assert await client.exists(scheduler.entries_key(manager.manager_id)) == 0
    assert await client.zcard(scheduler.ALL_SCHEDULERS) == 0


async def test_the_announcer_caps_the_entries_and_survives_a_broker_failure(
    server: RedisServer, client: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    configs = [
        PeriodicTaskConfig.create(name=n, spec="@hourly", task_type="t", schedule_id=i)
        for i, n in enumerate(["c", "a", "b"])
    ]
    entries = {  # the scheduler's map, in registration order
        c.schedule_id: ScheduledEntry.of(c, T0, T0 + timedelta(hours=1), synced=True)
        for c in configs
    }
    target = AsynqTarget.from_url(server.url, prefix="pm")
    target.announce_max = 2
    sending = [True]
    announcer = Announcer(target, "m1", VirtualClock(T0), lambda: entries, lambda: sending[0])
    try:
        await announcer.once()
        assert [e["id"] for e in await entries_of(client, "m1")] == ["a", "c"]  # 2, by name
        sending[0] = False  # a standby announces nothing
        await announcer.once()
        assert await client.exists(scheduler.entries_key("m1")) == 0
    finally:
        await target.close()
    down = AsynqTarget.from_url("redis://127.0.0.1:1/0", prefix="pm", timeout=0.5)
    try:
        failing = Announcer(down, "m2", VirtualClock(T0), lambda: entries, lambda: True)
        with caplog.at_level("WARNING"):
            await failing.once()  # logged, not raised: scheduling goes on
            await failing.withdraw()
    finally:
        await down.close()
    assert "announcing entries failed" in caplog.text
    assert "withdrawing announced entries failed" in caplog.text
