"""The asynq target on a Redis Cluster (three masters: tests/support/cluster.py): asynq's keys of a
queue carry its hash tag, the claims move beside them, and one call is one slot. The reference
consumer (tests/support/asynq_consumer.py) runs asynq's server steps through a cluster client.
Every key a test writes carries its own prefix and is deleted after it (the cluster is shared)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster as ClusterClient

from periodic_manager.contracts import AnnouncedEntry, Task
from periodic_manager.runtime.assemble import build_target
from periodic_manager.settings import Settings
from periodic_manager.targets.asynq import scheduler
from periodic_manager.targets.asynq.target import NO_CLUSTER_OVERLAP, AsynqTarget
from periodic_manager.targets.base import task_id_for
from tests.support.asynq_consumer import SCHEDULER_ENTRY, Consumer, decode
from tests.support.cluster import RedisCluster

SLOT = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)


@pytest.fixture
def tag() -> str:
    return f"pmc{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def client(redis_cluster: RedisCluster, tag: str) -> AsyncIterator[ClusterClient]:
    made = ClusterClient.from_url(redis_cluster.url)
    await made.initialize()
    try:
        yield made
    finally:
        mine = [k async for k in made.scan_iter(match=f"*{tag}*")]
        for key in mine:
            await made.delete(key)
        members = [m for m in await made.smembers("asynq:queues") if tag.encode() in m]
        if members:
            await made.srem("asynq:queues", *members)
        await made.aclose()


@pytest.fixture
async def target(redis_cluster: RedisCluster, tag: str) -> AsyncIterator[AsynqTarget]:
    made = AsynqTarget.from_url(redis_cluster.url, cluster=True, prefix=tag)
    try:
        yield made
    finally:
        await made.close()


def make_task(name: str, queue: str, **options: Any) -> Task:
    key = f"{name}:2024-05-01T12:01:00Z"
    return Task(
        id=task_id_for(key),
        name=name,
        task_type="email:send",
        payload={"n": name},
        queue=queue,
        options={"queue": queue, **options},
        idempotency_key=key,
        scheduled_at=SLOT,
        expires_at=SLOT + timedelta(seconds=30),
    )


def port_of(client: ClusterClient, key: str) -> int:
    return int(client.get_node_from_key(key).port)


async def test_a_burst_over_queues_on_every_master_is_run_once_and_a_second_send_adds_nothing(
    target: AsynqTarget, client: ClusterClient, redis_cluster: RedisCluster, tag: str
) -> None:
    queues = [f"{tag}-q{i}" for i in range(24)]
    pending = {q: f"asynq:{{{q}}}:pending" for q in queues}
    assert {port_of(client, key) for key in pending.values()} == set(redis_cluster.ports)
    tasks = [make_task(f"{tag}.s{i}.{q}", q) for q in queues for i in range(20)]
    tasks += [make_task(f"{tag}.big{i}", f"{tag}-big", unique_ttl=60) for i in range(1200)]
    await target.ping()
    first = await target.enqueue(tasks, SLOT)
    assert [r.status for r in first] == ["enqueued"] * len(tasks)
    claim = target.claim_prefix(queues[0]) + tasks[0].idempotency_key
    assert client.keyslot(claim) == client.keyslot(pending[queues[0]])  # the queue's slot
    again = await target.enqueue(tasks, SLOT + timedelta(seconds=1))
    assert [r.status for r in again] == ["duplicate"] * len(tasks)

    consumer = Consumer(client)
    taken = []
    for queue in [*queues, f"{tag}-big"]:
        taken += await consumer.drain(queue, SLOT.timestamp(), bool)
    assert sorted(m["id"] for m in taken) == sorted(t.idempotency_key for t in tasks)  # once each
    known = {m.decode() for m in await client.smembers("asynq:queues")}
    assert {*queues, f"{tag}-big"} <= known
    # The server's done released every uniqueness lock.
    assert [k async for k in client.scan_iter(match=f"asynq:{{{tag}-big}}:unique:*")] == []


async def test_overlap_is_refused_on_a_cluster_with_the_reason(
    target: AsynqTarget, client: ClusterClient, tag: str
) -> None:
    assert target.completion_off({"overlap": "skip"}) == NO_CLUSTER_OVERLAP
    assert target.completion_off({}) is None
    held, plain = make_task(f"{tag}.ov", tag, overlap="skip"), make_task(f"{tag}.p", tag)
    results = await target.enqueue([held, plain], SLOT)
    assert [r.status for r in results] == ["failed", "enqueued"]
    assert results[0].permanent and "another slot" in (results[0].error or "")
    assert [r.task for r in results] == [held, plain]


async def test_entries_and_history_are_written_on_a_cluster(
    target: AsynqTarget, client: ClusterClient, tag: str
) -> None:
    manager_id = f"{tag}-manager"
    entry = AnnouncedEntry(f"{tag}.e", "@hourly", "UTC", "email:send", "{}", {}, None, SLOT)
    try:
        await target.announce(manager_id, [entry], SLOT)
        raw = await client.lrange(scheduler.entries_key(manager_id), 0, -1)
        assert [decode(r, SCHEDULER_ENTRY)["id"] for r in raw] == [f"{tag}.e"]
        sent = make_task(f"{tag}.e", tag)
        assert (await target.enqueue([sent], SLOT))[0].status == "enqueued"
        assert await client.zcard(scheduler.history_key(f"{tag}.e")) == 1
        await target.withdraw(manager_id)
        assert await client.exists(scheduler.entries_key(manager_id)) == 0
    finally:
        await client.zrem(scheduler.ALL_SCHEDULERS, scheduler.entries_key(manager_id))


def test_pm_redis_cluster_builds_a_cluster_target(
    monkeypatch: pytest.MonkeyPatch, sqlite_url: str
) -> None:
    monkeypatch.setenv("PM_TARGET", "asynq")
    monkeypatch.setenv("PM_REDIS_CLUSTER", "true")
    settings = Settings(database_url=sqlite_url, redis_url="redis://127.0.0.1:7000/0")
    target = build_target(settings, engine=None)  # type: ignore[arg-type]
    assert isinstance(target, AsynqTarget) and isinstance(target.client, ClusterClient)
