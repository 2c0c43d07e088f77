"""The Redis Streams target on a real Redis Cluster of three masters (tests/support/cluster.py):
bursts over queues on every master, scripts missing on one master, a queue's slot moved to
another master between and during sends, a master restarted empty, and the settings that refuse
every other target on a cluster."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from redis.asyncio.cluster import RedisCluster as ClusterClient

from periodic_manager.cli.main import main
from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import Task
from periodic_manager.db.engine import create_engine
from periodic_manager.errors import TargetError
from periodic_manager.providers import StaticProvider
from periodic_manager.runtime.assemble import build_target
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.runtime.memory_store import MemoryRuntimeStore
from periodic_manager.runtime.timing import Timing
from periodic_manager.schedules.definition import PeriodicTaskConfig, idempotency_key
from periodic_manager.settings import Settings
from periodic_manager.targets.base import task_id_for
from periodic_manager.targets.redis.sentinel import ClusterSentinel
from periodic_manager.targets.redis.streams import RedisStreamsTarget
from tests.support.cluster import RedisCluster

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def slot(n: int) -> datetime:
    return T0 + timedelta(minutes=n)


def task(name: str, n: int, queue: str = "default", **options: Any) -> Task:
    key = idempotency_key(name, slot(n))
    return Task(
        id=task_id_for(key),
        name=name,
        task_type="t",
        payload={"n": n},
        queue=queue,
        options={"queue": queue, **options},
        idempotency_key=key,
        scheduled_at=slot(n),
        expires_at=slot(n) + timedelta(seconds=30),
    )


@pytest.fixture
async def client(redis_cluster: RedisCluster) -> AsyncIterator[ClusterClient]:
    c = ClusterClient.from_url(redis_cluster.url, decode_responses=True)
    await c.initialize()
    try:
        yield c
    finally:
        await c.aclose()


@pytest.fixture
async def target(redis_cluster: RedisCluster) -> AsyncIterator[RedisStreamsTarget]:
    t = RedisStreamsTarget.from_url(
        redis_cluster.url, cluster=True, prefix=f"pmc{uuid.uuid4().hex[:8]}"
    )
    try:
        yield t
    finally:
        await t.close()


async def ids_in(client: ClusterClient, target: RedisStreamsTarget, queue: str) -> list[str]:
    """The task ids in a queue's stream, in order."""
    return [fields["id"] for _, fields in await client.xrange(target.stream_key(queue))]


def port_of(client: ClusterClient, key: str) -> int:
    return int(client.get_node_from_key(key).port)


async def test_a_burst_over_queues_on_every_master_lands_once_and_a_second_send_adds_nothing(
    target: RedisStreamsTarget, client: ClusterClient, redis_cluster: RedisCluster
) -> None:
    queues = [f"q{i}" for i in range(30)]
    assert {port_of(client, target.stream_key(q)) for q in queues} == set(redis_cluster.ports)
    # 30 queues x 40 schedules, and one queue of 2500 (several script calls: first chunk, then
    # full chunks), as one staged batch sent at its slot.
    tasks = [task(f"s{i}", 1, q) for q in queues for i in range(40)]
    tasks += [task(f"big{i}", 1, "big") for i in range(2500)]
    await target.ping()
    results = await target.send(target.prepare(tasks), slot(1))
    assert [r.status for r in results] == ["enqueued"] * len(tasks)
    assert [r.task for r in results] == tasks
    for q in [*queues, "big"]:  # (chunks of one queue go out concurrently: any order)
        ids = await ids_in(client, target, q)
        assert sorted(ids) == sorted(t.id for t in tasks if t.queue == q)
    again = await target.enqueue(tasks, slot(1) + timedelta(seconds=1))
    assert [r.status for r in again] == ["duplicate"] * len(tasks)
    assert [r.message_id for r in again] == [r.message_id for r in results]
    for q in [*queues, "big"]:
        assert len(await ids_in(client, target, q)) == sum(t.queue == q for t in tasks)


async def test_a_master_that_lost_the_scripts_gets_them_and_only_its_calls_run_again(
    target: RedisStreamsTarget, client: ClusterClient, redis_cluster: RedisCluster
) -> None:
    queues = [f"q{i}" for i in range(12)]
    await target.enqueue([task("s", 1, q) for q in queues], slot(1))  # scripts loaded
    flushed = port_of(client, target.stream_key(queues[0]))
    redis_cluster.cli_run(flushed, "script", "flush")
    tasks = [task("s", 2, q) for q in queues]
    results = await target.enqueue(tasks, slot(2))
    # Calls done on the other masters are not run twice (they would read "duplicate").
    assert [r.status for r in results] == ["enqueued"] * len(tasks)
    for q in queues:
        assert len(await ids_in(client, target, q)) == 2


def begin_move(cluster: RedisCluster, slot_: int, src: int, dst: int) -> None:
    src_id, dst_id = cluster.node_id(src), cluster.node_id(dst)
    cluster.cli_run(dst, "cluster", "setslot", str(slot_), "importing", src_id)
    cluster.cli_run(src, "cluster", "setslot", str(slot_), "migrating", dst_id)


def migrate(cluster: RedisCluster, src: int, dst: int, *names: str) -> None:
    cluster.cli_run(src, "migrate", "127.0.0.1", str(dst), "", "0", "5000", "keys", *names)


def move_slot(cluster: RedisCluster, slot_: int, src: int, dst: int, *, keys: int = 10) -> None:
    """Move ``slot_`` from master ``src`` to master ``dst`` as ``redis-cli --cluster reshard``
    does: importing / migrating, MIGRATE of its keys ``keys`` at a time, then the new owner."""
    begin_move(cluster, slot_, src, dst)
    while names := cluster.cli_run(src, "cluster", "getkeysinslot", str(slot_), str(keys)).split():
        migrate(cluster, src, dst, *names)
    dst_id = cluster.node_id(dst)
    for port in cluster.ports:
        cluster.cli_run(port, "cluster", "setslot", str(slot_), "node", dst_id)


async def test_sends_after_a_queues_slot_moved_to_another_master_land_once(
    target: RedisStreamsTarget, client: ClusterClient, redis_cluster: RedisCluster
) -> None:
    queue = "moving"
    key = target.stream_key(queue)
    src = port_of(client, key)
    dst = next(p for p in redis_cluster.ports if p != src)
    first = [task(f"s{i}", 1, queue) for i in range(50)]
    assert {r.status for r in await target.enqueue(first, slot(1))} == {"enqueued"}
    move_slot(redis_cluster, client.keyslot(key), src, dst)
    # The target's client still maps the slot to src: MOVED, followed.
    again = await target.enqueue(first, slot(1) + timedelta(seconds=1))
    assert {r.status for r in again} == {"duplicate"}  # the claims moved with the stream
    second = [task(f"s{i}", 2, queue) for i in range(50)]
    assert {r.status for r in await target.enqueue(second, slot(2))} == {"enqueued"}
    await client.aclose()
    fresh = ClusterClient.from_url(redis_cluster.url, decode_responses=True)
    try:
        await fresh.initialize()
        assert port_of(fresh, key) == dst
        assert await ids_in(fresh, target, queue) == [t.id for t in first + second]
    finally:
        await fresh.aclose()


async def test_sends_while_a_queues_slot_moves_land_once(
    target: RedisStreamsTarget, client: ClusterClient, redis_cluster: RedisCluster
) -> None:
    queue = "moving-now"
    key = target.stream_key(queue)
    src = port_of(client, key)
    dst = next(p for p in redis_cluster.ports if p != src)
    batches = [[task(f"s{i}", n, queue) for i in range(20)] for n in range(1, 21)]
    for n, batch in enumerate(batches, 1):  # many keys to migrate, a few at a time
        assert {r.status for r in await target.enqueue(batch, slot(n))} == {"enqueued"}
    moving = asyncio.create_task(
        asyncio.to_thread(move_slot, redis_cluster, client.keyslot(key), src, dst, keys=5)
    )
    statuses: set[str] = set()
    while not moving.done():
        # New slots, and slots sent already (a retry, a second manager), while the keys move.
        n = len(batches) + 1
        batches.append([task(f"s{i}", n, queue) for i in range(20)])
        for old in (batches[-1], batches[n % 20]):
            try:
                statuses |= {r.status for r in await target.enqueue(old, old[0].scheduled_at)}
            except TargetError as exc:  # the slot is migrating: retried below
                statuses.add(str(exc).split(":")[1].strip())
    await moving
    for batch in batches:  # every slot again (the retries of those that failed)
        await target.enqueue(batch, batch[0].scheduled_at)
    ids = await ids_in(client, target, queue)
    assert sorted(ids) == sorted(t.id for batch in batches for t in batch), statuses
    assert "enqueued" in statuses and "duplicate" in statuses, statuses


async def test_a_slot_sent_again_when_its_stream_moved_before_its_claim_is_not_sent_twice(
    target: RedisStreamsTarget, client: ClusterClient, redis_cluster: RedisCluster
) -> None:
    """The stream is on the new master, the slot's claim still on the old one: the call is
    answered TRYAGAIN (every key is declared), never run where the claim cannot be seen."""
    queue = "half-moved"
    key = target.stream_key(queue)
    src = port_of(client, key)
    dst = next(p for p in redis_cluster.ports if p != src)
    old = [task("s", 1, queue)]
    assert [r.status for r in await target.enqueue(old, slot(1))] == ["enqueued"]
    begin_move(redis_cluster, client.keyslot(key), src, dst)
    migrate(redis_cluster, src, dst, key)
    with pytest.raises(TargetError, match="TTL exhausted"):
        await target.enqueue(old, slot(1) + timedelta(seconds=1))
    with pytest.raises(TargetError):  # a new slot waits for the end of the move too
        await target.enqueue([task("s", 2, queue)], slot(2))
    move_slot(redis_cluster, client.keyslot(key), src, dst)  # the rest, then the new owner
    again = await target.enqueue([*old, task("s", 2, queue)], slot(2))
    assert [r.status for r in again] == ["duplicate", "enqueued"]
    assert len(await ids_in(client, target, queue)) == 2


async def test_a_master_restarted_empty_is_noticed_by_its_sentinel_key() -> None:
    with RedisCluster() as cluster:  # its own cluster: a master loses everything here
        target = RedisStreamsTarget.from_url(cluster.url, cluster=True, prefix="pmsentinel")
        try:
            assert await target.forgotten() == []  # the first look never reports a loss
            sentinel = target.sentinel
            assert isinstance(sentinel, ClusterSentinel)
            keys = sentinel.keys()  # one per master
            assert sorted(int(name.rsplit(":", 1)[1]) for name in keys) == sorted(cluster.ports)
            assert await target.forgotten() == []
            victim = cluster.ports[1]
            cluster.restart_empty(victim)
            deadline = time.monotonic() + 10
            while True:  # the first look may meet the dead connection: a bounded poll
                try:
                    lost = await target.forgotten()
                    break
                except TargetError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
            assert lost == ["redis"]
            assert sentinel.lost_keys == [keys[f"127.0.0.1:{victim}"]]
            assert await target.forgotten() == []  # said once
        finally:
            await target.close()


def test_targets_that_cannot_run_on_a_cluster_refuse_it_at_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for name in [n for n in os.environ if n.startswith("PM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PM_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path}/pm.db")
    monkeypatch.setenv("PM_REDIS_CLUSTER", "true")
    assert Settings(target="redis", targets=("outbox",)).redis_cluster is True
    assert Settings(target="outbox").redis_cluster is True
    for name in ("celery", "arq"):
        if importlib.util.find_spec(name) is None:
            continue  # refused for its missing extra first
        with pytest.raises(
            ValidationError, match=f"the {name} target cannot run on a Redis Cluster"
        ):
            Settings(target="redis", targets=(name,))
        monkeypatch.setenv("PM_TARGET", name)
        assert main(["migrate"]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("periodic-manager: error: PM_REDIS_CLUSTER: ")
        assert f"the {name} target cannot run on a Redis Cluster" in line
    assert not (tmp_path / "pm.db").exists()  # refused before anything was touched


async def test_the_cluster_setting_builds_the_streams_target_on_a_cluster_client(
    redis_cluster: RedisCluster, sqlite_url: str
) -> None:
    settings = Settings(
        target="redis", redis_cluster=True, redis_url=redis_cluster.url, database_url=sqlite_url
    )
    engine = create_engine(sqlite_url)
    try:
        target = build_target(settings, engine)
        assert isinstance(target, RedisStreamsTarget)
        assert isinstance(target._client, ClusterClient)
        await target.ping()
        [result] = await target.enqueue([task("built", 1)], slot(1))
        assert result.status == "enqueued"
        await target.close()
    finally:
        await engine.dispose()


async def test_a_manager_sends_every_slot_of_schedules_over_every_master_once(
    target: RedisStreamsTarget, client: ClusterClient, redis_cluster: RedisCluster
) -> None:
    """The real manager on a virtual clock, 30 schedules over 10 queues, three slots."""
    queues = [f"m{i}" for i in range(10)]
    assert {port_of(client, target.stream_key(q)) for q in queues} == set(redis_cluster.ports)
    rows = [
        PeriodicTaskConfig.create(
            name=f"job{i}",
            spec="@every 10s",
            task_type="t",
            schedule_id=i + 1,
            options={"queue": queues[i % 10]},
        )
        for i in range(30)
    ]
    clock = VirtualClock(T0)
    manager = PeriodicTaskManager(
        StaticProvider(rows),
        target,
        clock=clock,
        store=MemoryRuntimeStore(),
        timing=Timing(sync_interval=30, grace=30),
    )
    await manager.start()
    try:
        for _ in range(3):
            await clock.advance(10, settle=lambda: manager.wait_settled(clock.now()))
    finally:
        await manager.stop()
    keys = []
    for q in queues:
        keys += [f["idempotency_key"] for _, f in await client.xrange(target.stream_key(q))]
    assert sorted(keys) == sorted(
        idempotency_key(f"job{i}", T0 + timedelta(seconds=10 * n))
        for i in range(30)
        for n in (1, 2, 3)
    )
