"""The consumer examples, run as users run them: a subprocess against real services."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis
from sqlalchemy import func, select

from periodic_manager.contracts import EnqueueResult, Task
from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import upgrade
from periodic_manager.db.models import outbox_table
from periodic_manager.schedules.definition import idempotency_key
from periodic_manager.targets.base import task_id_for
from periodic_manager.targets.outbox import OutboxTarget
from periodic_manager.targets.redis.streams import RedisStreamsTarget
from tests.conftest import BACKEND_URLS, backend_url
from tests.support import ROOT

EXAMPLES = ROOT / "examples"
SLOT = datetime(2024, 3, 31, 1, 30, tzinfo=UTC)
NOW = SLOT + timedelta(milliseconds=20)
FIELDS = (
    "id",
    "type",
    "payload",
    "queue",
    "name",
    "idempotency_key",
    "scheduled_at",
    "enqueued_at",
    "options",
)


def three_tasks(queue: str) -> list[Task]:
    tasks = []
    for i in range(3):
        key = idempotency_key(f"job{i}", SLOT)
        tasks.append(
            Task(
                id=task_id_for(key),
                name=f"job{i}",
                task_type="reports.build",
                payload={"n": i, "tag": "é"},
                queue=queue,
                options={"queue": queue},
                idempotency_key=key,
                scheduled_at=SLOT,
                expires_at=SLOT + timedelta(seconds=30),
            )
        )
    # one in another queue, which the consumer must not see
    other = idempotency_key("elsewhere", SLOT)
    tasks.append(Task(task_id_for(other), "elsewhere", "x", None, "other", {}, other, SLOT, SLOT))
    return tasks


async def run_example(script: str, *args: str) -> list[dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / script),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(30):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines()]


def assert_messages(printed: list[dict[str, Any]], results: list[EnqueueResult]) -> None:
    assert len(printed) == 3
    for message, result in zip(printed, results, strict=True):
        task = result.task
        assert {k: message[k] for k in FIELDS} == {
            "id": task.id,
            "type": "reports.build",
            "payload": json.dumps(task.payload, separators=(",", ":"), ensure_ascii=False),
            "queue": task.queue,
            "name": task.name,
            "idempotency_key": task.idempotency_key,
            "scheduled_at": "2024-03-31T01:30:00Z",
            "enqueued_at": "2024-03-31T01:30:00.020000Z",
            "options": f'{{"queue":"{task.queue}"}}',
        }


async def test_consume_redis_prints_and_acks_each_message(
    redis_client: aioredis.Redis, redis_prefix: str, redis_url: str
) -> None:
    target = RedisStreamsTarget(redis_client, prefix=redis_prefix)
    results = (await target.enqueue(three_tasks("emails"), NOW))[:3]

    printed = await run_example(
        "consume_redis.py",
        *("--redis-url", redis_url, "--queue", "emails", "--group", "workers"),
        *("--consumer", "w1", "--prefix", redis_prefix, "--count", "3", "--block-ms", "2000"),
    )

    assert_messages(printed, results)
    stream = target.stream_key("emails")
    assert [m["entry_id"] for m in printed] == [r.message_id for r in results]
    assert all(m["stream"] == stream for m in printed)
    assert (await redis_client.xpending(stream, "workers"))["pending"] == 0  # all acked


@pytest.fixture(params=list(BACKEND_URLS))
def fresh_db_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty database (a plain fixture, so it can pick an async one by name)."""
    return backend_url(request, request.param)


async def test_consume_outbox_prints_and_marks_each_message(fresh_db_url: str) -> None:
    await upgrade(fresh_db_url)
    engine = create_engine(fresh_db_url)
    try:
        results = (await OutboxTarget(engine).enqueue(three_tasks("emails"), NOW))[:3]

        printed = await run_example(
            "consume_outbox.py",
            *("--database-url", fresh_db_url, "--queue", "emails", "--count", "3"),
            *("--poll-interval", "0.05"),
        )

        assert_messages(printed, results)
        assert [str(m["seq"]) for m in printed] == [r.message_id for r in results]
        async with engine.connect() as conn:
            pending = select(func.count()).where(outbox_table.c.processed_at.is_(None))
            assert await conn.scalar(pending) == 1  # only the other queue's message
    finally:
        await engine.dispose()


@pytest.mark.parametrize(
    ("block_ms", "socket_timeout"),
    [
        ("500", "1"),  # the server ends each idle BLOCK first: an empty reply
        ("2000", "1"),  # the client gives up first (as redis-py 8 did with BLOCK 5000 and its 5 s)
    ],
)
async def test_consume_redis_survives_idle_time_then_consumes(
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
    block_ms: str,
    socket_timeout: str,
) -> None:
    """A worker left idle longer than its block plus its socket timeout is still there, and
    still takes the next task."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / "consume_redis.py"),
        *("--redis-url", redis_url, "--queue", "idle", "--group", "workers", "--consumer", "w1"),
        *("--prefix", redis_prefix, "--count", "1"),
        *("--block-ms", block_ms, "--socket-timeout", socket_timeout),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    target = RedisStreamsTarget(redis_client, prefix=redis_prefix)
    stream = target.stream_key("idle")
    try:
        for _ in range(400):  # the worker is up, its group and itself exist (bounded: 20 s)
            if await _consumer_seen(redis_client, stream):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the consumer never read its stream")
        idle_s = int(block_ms) / 1000 + float(socket_timeout) + 1.0
        await asyncio.sleep(idle_s)  # idle, on purpose: no task is waited for here
        assert proc.returncode is None, (await proc.communicate())[1].decode()
        [result] = await target.enqueue(three_tasks("idle")[:1], NOW)
        async with asyncio.timeout(20):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    [printed] = [json.loads(line) for line in out.decode().splitlines()]
    assert printed["entry_id"] == result.message_id and printed["id"] == result.task.id
    assert (await redis_client.xpending(stream, "workers"))["pending"] == 0
    warned = "is not shorter than --socket-timeout" in err.decode()
    assert warned == (int(block_ms) / 1000 >= float(socket_timeout)), err.decode()
    assert "Traceback" not in err.decode(), err.decode()


async def _consumer_seen(client: aioredis.Redis, stream: str) -> bool:
    try:
        consumers = await client.xinfo_consumers(stream, "workers")
    except aioredis.ResponseError:  # no stream or group yet
        return False
    return any(c["name"] == "w1" for c in consumers)
