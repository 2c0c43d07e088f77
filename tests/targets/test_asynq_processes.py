"""The asynq target as deployed: schedules written with plain SQL (PostgreSQL), two real
``periodic-manager manager`` processes (a leader and a standby) sending to a private
``redis-server``, the leader SIGKILLed while slots flow. The standby takes over; then the
reference consumer of asynq's server protocol (tests/support/asynq_consumer.py) runs everything
queued. Each schedule's slots arrive once each, with no gap across the kill.

Real processes run on wall time (the one place tests do), every wait bounded.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from periodic_manager.db.migrate import upgrade
from periodic_manager.targets.asynq import scheduler
from tests.support.asynq_consumer import Consumer
from tests.support.faults import insert_schedules
from tests.support.polling import eventually
from tests.support.servers import ManagerProcess, RedisServer

N = 20  # schedules, all "@every 1s", on queue "mail"
QUEUE = "mail"


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(persist=False) as server:
        yield server


async def queued_slots(client: aioredis.Redis) -> list[datetime]:
    ids = await client.lrange(f"asynq:{{{QUEUE}}}:pending", 0, -1)
    return [datetime.fromisoformat(i.decode().split(":", 1)[1]) for i in ids]


async def test_a_sigkilled_manager_process_the_standby_goes_on_with_no_slot_twice_or_lost(
    pg_url: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    names = [f"digest.s{i}" for i in range(N)]
    await upgrade(pg_url)
    await insert_schedules(
        pg_url,
        [(name, "@every 1s", {"queue": QUEUE}) for name in names],
        effective_at=None,
        task_type="email:digest",
        payload={"report": "daily"},
    )
    env = {
        "PM_DATABASE_URL": pg_url,
        "PM_TARGET": "asynq",
        "PM_ASYNQ_REDIS_URL": redis_server.url,
        "PM_REDIS_URL": redis_server.url,
        "PM_SYNC_INTERVAL": "30",
        "PM_HEARTBEAT_INTERVAL": "1",
        "PM_LEADER_POLL_INTERVAL": "1",
        "PM_LEADER_TIMEOUT": "3",
        "PM_COORDINATION": "leader",
        "PM_LOG_FORMAT": "text",
    }
    a = ManagerProcess(env, tmp_path / "a.log")
    b = ManagerProcess(env, tmp_path / "b.log")
    client = aioredis.from_url(redis_server.url)
    try:
        a.start()
        await eventually(lambda: "(leader)" in a.log(), "the first manager leads", seconds=30)
        b.start()
        await eventually(lambda: "(standby)" in b.log(), "the second is a standby", seconds=30)

        async def flowing(after: datetime) -> bool:
            return any(s >= after for s in await queued_slots(client))

        start = datetime.now(UTC)
        await eventually(lambda: flowing(start + timedelta(seconds=3)), "slots flow", seconds=20)
        # The leader's entries, as asynq's tools read them.
        assert await client.zcard(scheduler.ALL_SCHEDULERS) >= 1
        killed_at = datetime.now(UTC)
        a.kill()
        await eventually(
            lambda: flowing(killed_at + timedelta(seconds=4)),
            "the standby sends slots after the kill",
            seconds=30,
            detail=b.log,
        )
        assert b.stop() == 0, b.log()[-3000:]
        assert " ERROR " not in b.log(), b.log()[-3000:]
        taken = await Consumer(client).drain(QUEUE, datetime.now(UTC).timestamp(), bool)
    finally:
        a.kill()
        b.stop()
        await client.aclose()

    assert Counter(m["id"] for m in taken).most_common(1)[0][1] == 1  # each task once
    slots: dict[str, list[datetime]] = defaultdict(list)
    for msg in taken:
        assert msg["type"] == "email:digest" and msg["payload"] == b'{"report":"daily"}'
        name, _, at = msg["id"].partition(":")
        slots[name].append(datetime.fromisoformat(at))
    assert sorted(slots) == sorted(names)
    first = sorted(slots[names[0]])
    for name in names:
        assert sorted(slots[name]) == first, f"{name}: not the slots of the others"
    steps = {y - x for x, y in zip(first, first[1:], strict=False)}
    assert steps == {timedelta(seconds=1)}, f"a slot lost across the kill: {first}"
    assert first[0] < killed_at - timedelta(seconds=1) and first[-1] > killed_at + timedelta(
        seconds=3
    )
