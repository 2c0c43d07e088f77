"""Each target's completion signal for options.overlap, driven by hand against real services: the
test plays the worker (reads and acknowledges a stream message, marks an outbox row processed,
writes arq's job keys, stores a Celery result), so every state is exact. Real workers are in
test_overlap_workers.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from sqlalchemy import text

from periodic_manager.contracts import Task
from periodic_manager.db.engine import create_engine
from periodic_manager.schedules.definition import idempotency_key
from periodic_manager.targets.arq import ArqTarget
from periodic_manager.targets.base import task_id_for
from periodic_manager.targets.celery.target import CeleryTarget
from periodic_manager.targets.outbox import OutboxTarget
from periodic_manager.targets.redis.streams import RedisStreamsTarget

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
GROUP = "workers"


def slot(n: int) -> datetime:
    return T0 + timedelta(minutes=n)


def task(name: str, n: int, queue: str = "default", **options: Any) -> Task:
    key = idempotency_key(name, slot(n))
    if queue != "default":
        options["queue"] = queue
    return Task(
        id=task_id_for(key),
        name=name,
        task_type="t",
        payload=None,
        queue=queue,
        options=options,
        idempotency_key=key,
        scheduled_at=slot(n),
        expires_at=slot(n) + timedelta(seconds=30),
    )


def outcome(results: list[Any]) -> list[tuple[str, str | None, bool | None]]:
    """(status, previous state, timed out) of each result."""
    out = []
    for r in results:
        prev = r.previous
        out.append(
            (r.status, None, None) if prev is None else (r.status, prev.state, prev.timed_out)
        )
    return out


# -- Redis Streams ------------------------------------------------------------------------------


@pytest.fixture(params=["single", "cluster"])
def streams_on(request: pytest.FixtureRequest) -> aioredis.Redis | str:
    """The test Redis's client, or the URL of the session's Redis Cluster
    (tests/support/cluster.py): each Redis Streams test runs on both."""
    if request.param == "single":
        return request.getfixturevalue("redis_client")  # type: ignore[no-any-return]
    return str(request.getfixturevalue("redis_cluster").url)


@pytest.fixture
async def streams_client(streams_on: aioredis.Redis | str) -> AsyncIterator[aioredis.Redis]:
    if isinstance(streams_on, aioredis.Redis):
        yield streams_on
        return
    client = RedisCluster.from_url(streams_on, decode_responses=True)
    try:
        yield client  # type: ignore[misc]  (the same commands, routed by key)
    finally:
        await client.aclose()


@pytest.fixture
async def streams(streams_client: aioredis.Redis, redis_prefix: str) -> RedisStreamsTarget:
    target = RedisStreamsTarget(streams_client, prefix=redis_prefix, group=GROUP)
    await streams_client.xgroup_create(target.stream_key("default"), GROUP, id="0", mkstream=True)
    return target


async def test_streams_finished_means_acknowledged_by_the_group(
    streams: RedisStreamsTarget, streams_client: aioredis.Redis
) -> None:
    stream = streams.stream_key("default")
    hold = {"overlap": "hold"}
    [first] = await streams.enqueue([task("n", 1, **hold)], slot(1))
    assert outcome([first]) == [("enqueued", "none", False)]
    assert outcome(await streams.enqueue([task("n", 2, **hold)], slot(2))) == [
        ("busy", "queued", False)
    ]
    [[_, [(entry_id, _)]]] = await streams_client.xreadgroup(GROUP, "w", {stream: ">"})
    busy = await streams.enqueue([task("n", 2, **hold)], slot(2))
    assert outcome(busy) == [("busy", "running", False)]
    assert busy[0].previous.task_id == first.task.id  # type: ignore[union-attr]
    await streams_client.xack(stream, GROUP, entry_id)
    done = await streams.enqueue([task("n", 2, **hold), task("plain", 2)], slot(2))
    assert outcome(done) == [("enqueued", "finished", False), ("enqueued", None, None)]
    # A slot sent already is a duplicate, never busy (a retry, or a second manager).
    again = await streams.enqueue([task("n", 2, **hold)], slot(2) + timedelta(seconds=1))
    assert [r.status for r in again] == ["duplicate"] and again[0].message_id == done[0].message_id


async def test_streams_a_message_gone_undelivered_is_finished_and_no_group_is_queued(
    streams: RedisStreamsTarget, streams_client: aioredis.Redis, redis_prefix: str
) -> None:
    [first] = await streams.enqueue([task("n", 1, overlap="skip")], slot(1))
    await streams_client.xdel(streams.stream_key("default"), first.message_id)  # type: ignore[arg-type]
    assert outcome(await streams.enqueue([task("n", 2, overlap="skip")], slot(2))) == [
        ("enqueued", "finished", False)
    ]
    # A queue nobody has read yet: no group, nothing delivered.
    await streams.enqueue([task("m", 1, queue="fresh", overlap="skip")], slot(1))
    assert outcome(
        await streams.enqueue([task("m", 2, queue="fresh", overlap="skip")], slot(2))
    ) == [("busy", "queued", False)]


async def test_streams_overlap_timeout_and_no_group_configured(
    streams: RedisStreamsTarget, streams_client: aioredis.Redis, redis_prefix: str
) -> None:
    opts = {"overlap": "skip", "overlap_timeout": 90}
    await streams.enqueue([task("n", 1, **opts)], slot(1))
    assert outcome(await streams.enqueue([task("n", 2, **opts)], slot(2))) == [
        ("busy", "queued", False)
    ]
    assert outcome(await streams.enqueue([task("n", 3, **opts)], slot(3))) == [
        ("enqueued", "queued", True)
    ]
    bare = RedisStreamsTarget(streams_client, prefix=redis_prefix)
    [refused, plain] = await bare.enqueue([task("x", 1, overlap="hold"), task("y", 1)], slot(1))
    assert refused.status == "failed" and "set PM_REDIS_GROUP" in (refused.error or "")
    assert plain.status == "enqueued"
    assert await streams_client.exists(bare.claim_key("default", refused.task.idempotency_key)) == 0


async def test_streams_concurrent_managers_never_both_find_a_schedule_free(
    streams: RedisStreamsTarget, streams_client: aioredis.Redis, redis_prefix: str
) -> None:
    others = [
        RedisStreamsTarget(streams_client, prefix=redis_prefix, group=GROUP) for _ in range(8)
    ]
    # Eight managers, each at a different slot of the same free schedule, all at once.
    replies = await asyncio.gather(
        *(t.enqueue([task("race", n, overlap="hold")], slot(n)) for n, t in enumerate(others))
    )
    statuses = sorted(r[0].status for r in replies)
    assert statuses == ["busy"] * 7 + ["enqueued"]
    assert await streams_client.xlen(streams.stream_key("default")) == 1


# -- outbox -------------------------------------------------------------------------------------


@pytest.fixture
async def outbox(db_url: str) -> AsyncIterator[OutboxTarget]:
    target = OutboxTarget.from_url(db_url)
    yield target
    await target.close()


async def _sql(db_url: str, statement: str, **params: Any) -> None:
    engine = create_engine(db_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(statement), params)
    finally:
        await engine.dispose()


async def test_outbox_finished_means_the_newest_row_of_the_schedule_is_processed(
    outbox: OutboxTarget, db_url: str
) -> None:
    hold = {"overlap": "hold"}
    [first] = await outbox.enqueue([task("n", 1, **hold)], slot(1))
    assert outcome([first]) == [("enqueued", "none", False)]
    busy = await outbox.enqueue([task("n", 2, **hold), task("plain", 2)], slot(2))
    assert outcome(busy) == [("busy", "unfinished", False), ("enqueued", None, None)]
    assert busy[0].previous.task_id == first.task.id  # type: ignore[union-attr]
    await _sql(db_url, "UPDATE pm_outbox SET processed_at = enqueued_at WHERE name = 'n'")
    [sent] = await outbox.enqueue([task("n", 2, **hold)], slot(2))
    assert outcome([sent]) == [("enqueued", "finished", False)]
    again = await outbox.enqueue([task("n", 2, **hold)], slot(3))
    assert [r.status for r in again] == ["duplicate"] and again[0].message_id == sent.message_id
    # Any row of the schedule counts, a manual trigger's too; a deleted one is gone: finished.
    await _sql(db_url, "UPDATE pm_outbox SET processed_at = enqueued_at WHERE name = 'n'")
    [trigger] = await outbox.enqueue([task("n", 99)], slot(3))
    assert outcome(await outbox.enqueue([task("n", 3, **hold)], slot(3))) == [
        ("busy", "unfinished", False)
    ]
    await _sql(db_url, "DELETE FROM pm_outbox WHERE seq = :seq", seq=int(trigger.message_id or 0))
    assert outcome(await outbox.enqueue([task("n", 3, **hold)], slot(3))) == [
        ("enqueued", "finished", False)
    ]


async def test_outbox_overlap_timeout(outbox: OutboxTarget) -> None:
    opts = {"overlap": "skip", "overlap_timeout": 90}
    await outbox.enqueue([task("n", 1, **opts)], slot(1))
    assert outcome(await outbox.enqueue([task("n", 2, **opts)], slot(2))) == [
        ("busy", "unfinished", False)
    ]
    assert outcome(await outbox.enqueue([task("n", 3, **opts)], slot(3))) == [
        ("enqueued", "unfinished", True)
    ]


async def test_outbox_concurrent_managers_never_both_find_a_schedule_free(server_url: str) -> None:
    from periodic_manager.db.migrate import upgrade

    url = server_url
    await upgrade(url)
    targets = [OutboxTarget.from_url(url) for _ in range(6)]
    try:
        replies = await asyncio.gather(
            *(t.enqueue([task("race", n, overlap="hold")], slot(n)) for n, t in enumerate(targets))
        )
    finally:
        for t in targets:
            await t.close()
    assert sorted(r[0].status for r in replies) == ["busy"] * 5 + ["enqueued"]


# -- arq ------------------------------------------------------------------------------------------


async def test_arq_finished_means_arq_holds_neither_the_job_nor_its_progress(
    arq_target: ArqTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    queue = f"{redis_prefix}:arq"
    hold = {"overlap": "hold", "queue": queue}
    first_task = task("n", 1, **hold)
    arq_target.made += [first_task.id, task("n", 2).id, task("n", 3).id]  # type: ignore[attr-defined]
    [first] = await arq_target.enqueue([first_task], slot(1))
    assert outcome([first]) == [("enqueued", "none", False)]
    assert await redis_client.exists(f"arq:job:{first_task.id}") == 1
    prev = await redis_client.get(f"{redis_prefix}:prev:n")
    assert prev is not None and prev.startswith(first_task.id) and prev.endswith("|1")
    assert outcome(await arq_target.enqueue([task("n", 2, **hold)], slot(2))) == [
        ("busy", "queued", False)
    ]
    await redis_client.set(f"arq:in-progress:{first_task.id}", b"1")  # a worker started it
    assert outcome(await arq_target.enqueue([task("n", 2, **hold)], slot(2))) == [
        ("busy", "running", False)
    ]
    # The worker finished: arq deletes both keys (a result may stay: still finished).
    await redis_client.delete(f"arq:in-progress:{first_task.id}", f"arq:job:{first_task.id}")
    assert outcome(await arq_target.enqueue([task("n", 2, **hold)], slot(2))) == [
        ("enqueued", "finished", False)
    ]
    assert [r.status for r in await arq_target.enqueue([task("n", 2, **hold)], slot(3))] == [
        "duplicate"
    ]


async def test_arq_a_job_being_published_counts_as_queued_for_the_publish_window(
    arq_target: ArqTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    queue = f"{redis_prefix}:arq"
    key = f"{redis_prefix}:prev:n"
    now_ms = round(slot(2).timestamp() * 1000)
    # Another manager claimed and wrote its job as the previous one, arq does not hold it yet.
    await redis_client.set(key, f"other-job|{now_ms - 1000}|0")
    assert outcome(
        await arq_target.enqueue([task("n", 2, queue=queue, overlap="skip")], slot(2))
    ) == [("busy", "queued", False)]
    # A flag 0 older than the window: that publish never happened (or finished): free.
    await redis_client.set(key, f"other-job|{now_ms - 60_000}|0")
    arq_target.made.append(task("n", 2).id)  # type: ignore[attr-defined]
    assert outcome(
        await arq_target.enqueue([task("n", 2, queue=queue, overlap="skip")], slot(2))
    ) == [("enqueued", "finished", False)]


async def test_arq_concurrent_managers_never_both_find_a_schedule_free(
    redis_url: str, redis_prefix: str, redis_client: aioredis.Redis
) -> None:
    queue = f"{redis_prefix}:arq"
    targets = [ArqTarget.from_url(redis_url, prefix=redis_prefix) for _ in range(6)]
    tasks = [task("race", n, queue=queue, overlap="hold") for n in range(6)]
    try:
        replies = await asyncio.gather(
            *(
                t.enqueue([tk], slot(n))
                for n, (t, tk) in enumerate(zip(targets, tasks, strict=True))
            )
        )
    finally:
        for t in targets:
            await t.close()
        await redis_client.delete(*(f"arq:job:{tk.id}" for tk in tasks))
    assert sorted(r[0].status for r in replies) == ["busy"] * 5 + ["enqueued"]


# -- Celery -------------------------------------------------------------------------------------


@pytest.fixture(params=["direct", "kombu"])
async def celery_target(
    request: pytest.FixtureRequest, redis_url: str, redis_prefix: str
) -> AsyncIterator[CeleryTarget]:
    config = {"broker_transport_options": {"global_keyprefix": f"{redis_prefix}:"}}
    target = CeleryTarget.from_url(
        redis_url,
        prefix=redis_prefix,
        config=config,
        fast_path=request.param == "direct",
        result_backend=redis_url,
    )
    assert (target.writer is not None) == (request.param == "direct")
    yield target
    await target.close()


async def test_celery_finished_means_a_ready_state_in_the_result_backend(
    celery_target: CeleryTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    queue = f"{redis_prefix}.q"
    backend = celery_target.results.backend  # type: ignore[union-attr]
    hold = {"overlap": "hold", "queue": queue}
    first_task = task("n", 1, **hold)
    try:
        first, _ = await celery_target.enqueue([first_task, task("plain", 1, queue=queue)], slot(1))
        assert outcome([first]) == [("enqueued", "none", False)]
        assert await redis_client.llen(f"{redis_prefix}:{queue}") == 2  # both published
        assert outcome(await celery_target.enqueue([task("n", 2, **hold)], slot(2))) == [
            ("busy", "unfinished", False)  # PENDING: queued, or running untracked
        ]
        await asyncio.to_thread(backend.store_result, first_task.id, None, "STARTED")
        assert outcome(await celery_target.enqueue([task("n", 2, **hold)], slot(2))) == [
            ("busy", "running", False)
        ]
        await asyncio.to_thread(backend.store_result, first_task.id, 42, "SUCCESS")
        assert outcome(await celery_target.enqueue([task("n", 2, **hold)], slot(2))) == [
            ("enqueued", "finished", False)
        ]
        assert await redis_client.llen(f"{redis_prefix}:{queue}") == 3
    finally:
        await redis_client.delete(*(f"celery-task-meta-{task('n', n).id}" for n in (1, 2)))


async def test_celery_without_a_result_backend_refuses_overlap(
    redis_url: str, redis_prefix: str
) -> None:
    config = {"broker_transport_options": {"global_keyprefix": f"{redis_prefix}:"}}
    target = CeleryTarget.from_url(redis_url, prefix=redis_prefix, config=config)
    try:
        assert target.completion_off({"overlap": "skip"}) is not None
        assert target.completion_off({}) is None
        [refused, plain] = await target.enqueue(
            [
                task("n", 1, queue=f"{redis_prefix}.q", overlap="skip"),
                task("p", 1, queue=f"{redis_prefix}.q"),
            ],
            slot(1),
        )
    finally:
        await target.close()
    assert refused.status == "failed" and "no result backend" in (refused.error or "")
    assert plain.status == "enqueued"
