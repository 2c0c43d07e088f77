"""A manager whose broker is down holds no work: two in-process managers on one PostgreSQL
database under a virtual clock, the second sending to a throwaway ``redis-server`` the test
kills once both hold their shares. Within 10 s of its first failed ping the sick manager holds
no partition and the healthy one holds them all; every schedule keeps being sent (the slots the
sick one failed are sent by the taker's look back, within grace); once the Redis is back the
sick one takes its share again. Audited on both Redis servers' streams: every slot once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta

import asyncpg
import redis.asyncio as aioredis

from periodic_manager.clock import VirtualClock
from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import upgrade
from periodic_manager.runtime.assemble import build_manager
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.settings import Settings
from tests.support.api import api_client
from tests.support.faults import (
    T0,
    assert_exactly_once,
    dsn,
    expected_slots,
    insert_schedules,
    stream_keys,
)
from tests.support.managers import Fleet
from tests.support.servers import RedisServer

SCHEDULES = 60
N = 64


def held(m: PeriodicTaskManager) -> set[int]:
    return {e.ident for e in m.entries()}  # type: ignore[misc]


async def test_a_manager_whose_redis_dies_hands_its_share_over_and_takes_it_back_when_it_returns(
    pg_url: str,
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
    redis_server: RedisServer,
) -> None:
    await upgrade(pg_url)
    names = [f"h{i:02d}" for i in range(1, SCHEDULES + 1)]
    await insert_schedules(pg_url, [(name, "@every 1s", {}) for name in names])
    common = dict(
        database_url=pg_url,
        target="redis",
        stream_prefix=redis_prefix,
        coordination="partitions",
        lease_ttl=10,
        grace=30,
        sync_interval=600,
        heartbeat_interval=5,
        listen=False,
    )
    pair = Fleet(VirtualClock(T0))
    sick_redis = aioredis.from_url(redis_server.url, decode_responses=True)
    admin = await asyncpg.connect(dsn(pg_url))
    try:
        healthy = await pair.start("healthy", Settings(redis_url=redis_url, **common))  # type: ignore[arg-type]
        sick = await pair.start("sick", Settings(redis_url=redis_server.url, **common))  # type: ignore[arg-type]
        await pair.until(lambda: len(healthy.partitions) == len(sick.partitions) == N // 2, 15)
        await pair.drive(3)
        assert held(healthy) | held(sick) == set(range(1, SCHEDULES + 1)) and held(sick)

        redis_server.kill()
        # The first failed ping comes at the next tick of the ping interval (5 s by default).
        pings = sick.target_health.pings_failed  # type: ignore[union-attr]
        await pair.until(lambda: sick.target_health.pings_failed > pings, 6)  # type: ignore[union-attr]
        took = await pair.until(lambda: not sick.partitions and len(healthy.partitions) == N, 10)
        print(f"sick manager held nothing {took:.1f} s after its first failed ping")
        assert not sick.entries() and held(healthy) == set(range(1, SCHEDULES + 1))
        assert sick.standing_down is not None and "redis" in sick.standing_down
        assert sick.registry.get_sample_value("periodic_manager_target_down") == 1
        assert sick.registry.get_sample_value("periodic_manager_target_stand_downs_total") == 1
        # The others count it out: it is no live member, nor one still coming.
        member = await admin.fetchval(
            "SELECT expires_at > now() FROM pm_partition_members WHERE member = $1", sick.manager_id
        )
        assert member is False
        await pair.drive(10)  # the healthy one keeps all of it: a share stays with it
        assert len(healthy.partitions) == N and not sick.partitions
        async with api_client(pg_url, pair.clock, pair.engines[0]) as client:  # type: ignore[arg-type]
            shown = {m["manager_id"]: m for m in (await client.get("/managers")).json()["items"]}
            assert shown[sick.manager_id]["target_down"] == sick.standing_down
            assert shown[sick.manager_id]["partitions"] == []
            assert shown[healthy.manager_id]["target_down"] is None
            view = {
                m["manager_id"]: m for m in (await client.get("/views/managers")).json()["items"]
            }
            assert view[sick.manager_id]["target_down"] == sick.standing_down

        redis_server.start()  # same port, same append-only file: what it held before is there
        back = await pair.until(
            lambda: len(sick.partitions) == len(healthy.partitions) == N // 2, 15
        )
        print(f"sick manager holds its share again {back:.1f} s after its Redis returned")
        assert sick.standing_down is None and held(sick)
        assert sick.registry.get_sample_value("periodic_manager_target_down") == 0
        await pair.drive(5)
        end = pair.clock.now()
    finally:
        await pair.close()
        await admin.close()
    counts: Counter[str] = await stream_keys(redis_client, redis_prefix)
    try:
        counts += await stream_keys(sick_redis, redis_prefix)  # what the sick one sent while well
    finally:
        await sick_redis.aclose()
    expected = [k for name in names for k in expected_slots(name, "@every 1s", T0, end)]
    assert_exactly_once(counts, expected)
    assert sum(counts.values()) == len(expected)


async def test_a_leader_whose_redis_dies_steps_down_and_a_standby_whose_redis_answers_leads(
    pg_url: str,
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
    redis_server: RedisServer,
) -> None:
    """``PM_COORDINATION=leader``: the leader's Redis is killed; it steps down after its third
    failed ping and the standby (whose Redis answers) leads; its Redis back, it stands by and
    may lead again (it takes the lock once the other stops)."""
    await upgrade(pg_url)
    names = [f"l{i:02d}" for i in range(1, 21)]
    await insert_schedules(pg_url, [(name, "@every 1s", {}) for name in names])
    common = dict(
        database_url=pg_url,
        target="redis",
        stream_prefix=redis_prefix,
        coordination="leader",
        grace=30,
        sync_interval=600,
        heartbeat_interval=5,
        listen=False,
        # Pings every 2 s: the leader steps down while its send backs off (4 s into the outage),
        # and its Redis is back before that backoff ends: no attempt may follow it.
        target_ping_interval=2,
        target_ping_failures=3,
    )
    clock = VirtualClock(T0)
    managers: list[PeriodicTaskManager] = []
    engines = []

    async def settle() -> None:
        for m in managers:
            assert m.target_health is not None
            await m.target_health.quiet()
            await m.wait_settled(clock.now())

    async def until(done: object, seconds: float) -> float:
        start = clock.now()
        for _ in range(round(seconds * 2)):
            if done():  # type: ignore[operator]
                break
            await clock.advance(0.5, settle=settle)
            await asyncio.sleep(0.05)  # the server ends a closed session on real time
        assert done(), f"not within {seconds} s"  # type: ignore[operator]
        return (clock.now() - start).total_seconds()

    async def start(settings: Settings) -> PeriodicTaskManager:
        engine = create_engine(settings.database_url)
        engines.append(engine)
        mgr = build_manager(settings, engine, clock=clock)
        managers.append(mgr)
        await mgr.start()
        return mgr

    sick_redis = aioredis.from_url(redis_server.url, decode_responses=True)
    try:
        sick = await start(Settings(redis_url=redis_server.url, **common))  # type: ignore[arg-type]
        healthy = await start(Settings(redis_url=redis_url, **common))  # type: ignore[arg-type]
        assert sick.is_leader and not healthy.is_leader
        await until(lambda: clock.now() >= T0 + timedelta(seconds=3), 4)
        redis_server.kill()
        pings = sick.target_health.pings_failed  # type: ignore[union-attr]
        await until(lambda: sick.target_health.pings_failed > pings, 6)  # type: ignore[union-attr]
        took = await until(lambda: healthy.is_leader and not sick.is_leader, 10)
        print(f"the standby leads {took:.1f} s after the leader's first failed ping")
        assert sick.standing_down is not None
        assert sick.registry.get_sample_value("periodic_manager_target_down") == 1
        redis_server.start()
        await until(lambda: sick.standing_down is None, 6)
        await clock.advance(3, settle=settle)
        assert healthy.is_leader and not sick.is_leader  # a lock held is not taken back
        end = clock.now()
    finally:
        for m in managers:
            await m.stop()
        for e in engines:
            await e.dispose()
    counts: Counter[str] = await stream_keys(redis_client, redis_prefix)
    try:
        counts += await stream_keys(sick_redis, redis_prefix)
    finally:
        await sick_redis.aclose()
    expected = [k for name in names for k in expected_slots(name, "@every 1s", T0, end)]
    assert_exactly_once(counts, expected)


async def test_a_lone_manager_whose_redis_dies_keeps_its_work_until_a_healthy_one_joins(
    pg_url: str,
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
    redis_server: RedisServer,
) -> None:
    """With no manager whose targets answer, moving the work would help nobody: the lone sick
    manager stands down (said on /readyz, the metric, the managers page) but keeps its
    partitions. A manager whose Redis answers starts: it gets all of them at the sick one's next
    round, and sends every slot from then on."""
    await upgrade(pg_url)
    names = [f"a{i:02d}" for i in range(1, 21)]
    await insert_schedules(pg_url, [(name, "@every 1s", {}) for name in names])
    common = dict(
        database_url=pg_url,
        target="redis",
        stream_prefix=redis_prefix,
        coordination="partitions",
        lease_ttl=10,
        grace=30,
        sync_interval=600,
        heartbeat_interval=5,
        listen=False,
    )
    pair = Fleet(VirtualClock(T0))
    try:
        sick = await pair.start("sick", Settings(redis_url=redis_server.url, **common))  # type: ignore[arg-type]
        assert sick.partitions == frozenset(range(N))
        redis_server.kill()
        await pair.until(lambda: sick.standing_down is not None, 15)
        await pair.drive(10)
        assert sick.partitions == frozenset(range(N))  # nobody could do better
        healthy = await pair.start("healthy", Settings(redis_url=redis_url, **common))  # type: ignore[arg-type]
        joined = pair.clock.now()
        took = await pair.until(lambda: len(healthy.partitions) == N and not sick.partitions, 10)
        print(f"a healthy manager holds everything {took:.1f} s after it started")
        await pair.drive(5)
        end = pair.clock.now()
    finally:
        await pair.close()
    counts = await stream_keys(redis_client, redis_prefix)
    # From the healthy manager's start on, with the look back of its takeover: every slot once.
    expected = [k for name in names for k in expected_slots(name, "@every 1s", joined, end)]
    assert_exactly_once(counts, expected)
