"""Task.traceparent in each target's message (PM_OTEL), read back as a worker reads it, and absent
when tracing is off. (Redis Streams' plain script, the RQ job's meta through a real worker and
the Celery headers byte for byte against send_task are tested in test_tracing.py and
tests/targets/test_celery_wire.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from periodic_manager.contracts import Task
from periodic_manager.targets.base import task_id_for
from periodic_manager.targets.redis.streams import RedisStreamsTarget
from periodic_manager.tracing import trace_headers, traceparent_of
from tests.support.asynq_consumer import TASK_MESSAGE, decode
from tests.support.servers import RedisServer

SLOT = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def make_task(name: str, queue: str, traceparent: str | None, **options: Any) -> Task:
    key = f"{name}:2024-05-01T12:01:00Z"
    return Task(
        id=task_id_for(key),
        name=name,
        task_type=options.pop("task_type", "record"),
        payload={"a": 1},
        queue=queue,
        options={"queue": queue, **options},
        idempotency_key=key,
        scheduled_at=SLOT,
        expires_at=SLOT + timedelta(seconds=30),
        traceparent=traceparent,
    )


def test_the_one_helper_every_target_reads() -> None:
    traced = make_task("a", "q", TRACEPARENT)
    plain = make_task("b", "q", None)
    assert traceparent_of(traced) == TRACEPARENT and traceparent_of(plain) is None
    assert trace_headers(traced) == {"traceparent": TRACEPARENT}
    assert trace_headers(plain) == {}


async def test_redis_streams_with_overlap_carries_it_after_its_own_items(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    """The overlap script's tasks have two more items: the traceparent comes after them."""
    target = RedisStreamsTarget(redis_client, prefix=redis_prefix, group="workers")
    tasks = [
        make_task(f"{redis_prefix}.skip", "default", TRACEPARENT, overlap="skip"),
        make_task(f"{redis_prefix}.plain", "default", None, overlap="skip"),
    ]
    for task in tasks:  # one batch is traced whole or not at all
        [result] = await target.enqueue([task], SLOT)
        assert result.status == "enqueued", result.error
    entries = await redis_client.xrange(f"{{{redis_prefix}:default}}:stream")
    by_name = {fields["name"]: fields for _, fields in entries}
    assert by_name[tasks[0].name]["traceparent"] == TRACEPARENT
    assert "traceparent" not in by_name[tasks[1].name]
    assert by_name[tasks[0].name]["options"] == '{"overlap":"skip","queue":"default"}'


async def test_dramatiq_puts_it_in_the_messages_options(redis_url: str, redis_prefix: str) -> None:
    from dramatiq import Message

    from periodic_manager.targets.dramatiq import DramatiqTarget

    p, queue = redis_prefix, f"{redis_prefix}-q"
    target = DramatiqTarget.from_url(redis_url, prefix=p, namespace=p)
    raw = aioredis.from_url(redis_url)
    try:
        tasks = [make_task(f"{p}.t", queue, TRACEPARENT), make_task(f"{p}.n", queue, None)]
        for task in tasks:
            [result] = await target.enqueue([task], SLOT)
            assert result.status == "enqueued", result.error
        traced, plain = [
            Message.decode(bytes(await raw.hget(f"{p}:{queue}.msgs", t.id))) for t in tasks
        ]
    finally:
        await raw.aclose()
        await target.close()
    assert traced.options["traceparent"] == TRACEPARENT
    assert traced.options["idempotency_key"] == tasks[0].idempotency_key
    assert "traceparent" not in plain.options


@pytest.fixture(scope="module")
def asynq_server() -> Iterator[RedisServer]:
    with RedisServer(persist=False) as made:  # asynq's keys have no prefix of ours
        yield made


@pytest.fixture
async def asynq_client(asynq_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    made = aioredis.from_url(asynq_server.url)
    await made.flushall()
    yield made
    await made.aclose()


async def test_asynq_puts_it_in_the_task_messages_headers(
    asynq_server: RedisServer, asynq_client: aioredis.Redis
) -> None:
    from periodic_manager.targets.asynq.target import AsynqTarget

    target = AsynqTarget.from_url(asynq_server.url, prefix="pm")
    try:
        tasks = [
            make_task("traced", "default", TRACEPARENT, task_type="email:digest"),
            make_task("plain", "default", None, task_type="email:digest"),
        ]
        for task in tasks:
            [result] = await target.enqueue([task], SLOT)
            assert result.status == "enqueued", result.error
    finally:
        await target.close()
    traced, plain = [
        decode(
            await asynq_client.hget(f"asynq:{{default}}:t:{t.idempotency_key}", "msg"), TASK_MESSAGE
        )
        for t in tasks
    ]
    assert traced["headers"] == {"traceparent": TRACEPARENT}
    assert traced["type"] == "email:digest"
    assert plain["headers"] == {}
