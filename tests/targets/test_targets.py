"""Target contract suite, run against Redis Streams and the outbox on PostgreSQL and SQLite,
then what is specific to each target (claims and faults on Redis, locking on PostgreSQL)."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy import select

from periodic_manager.contracts import EnqueueResult, Target, Task
from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import upgrade
from periodic_manager.db.models import outbox_table
from periodic_manager.errors import TargetError
from periodic_manager.schedules.definition import idempotency_key
from periodic_manager.targets.base import task_id_for
from periodic_manager.targets.outbox import OutboxTarget
from periodic_manager.targets.redis.streams import CLAIM_AND_ADD, RedisStreamsTarget
from tests.conftest import backend_url
from tests.support import ROOT

SLOT = datetime(2024, 3, 31, 1, 30, tzinfo=UTC)
# 03:30 in Berlin on the day clocks jump to summer time is 01:30 UTC (+ 1.5 ms).
NOW = datetime(2024, 3, 31, 3, 30, 0, 1500, tzinfo=ZoneInfo("Europe/Berlin"))
NOW_TEXT = "2024-03-31T01:30:00.001500Z"
QUEUES = ("alpha", "beta")


def make_task(name: str, queue: str, slot: datetime = SLOT, payload: Any = None) -> Task:
    key = idempotency_key(name, slot)
    return Task(
        id=task_id_for(key),
        name=name,
        task_type=f"{name}.run",
        payload={"z": [1, 2.5, None], "a": "é", "name": name} if payload is None else payload,
        queue=queue,
        options={"queue": queue, "max_retry": 3},
        idempotency_key=key,
        scheduled_at=slot,
        expires_at=slot + timedelta(seconds=30),
    )


def batch() -> list[Task]:
    """Four tasks, queues interleaved, one slot with microseconds and one in another zone."""
    kolkata = ZoneInfo("Asia/Kolkata")
    return [
        make_task("reports.daily", "alpha"),
        make_task("cleanup", "beta", SLOT + timedelta(milliseconds=250)),
        make_task("sync/users", "alpha", SLOT.astimezone(kolkata), payload=[1, "two"]),
        make_task("ping@host", "beta", payload=7),
    ]


EXPECTED_TEXT = {  # the exact field values of batch(), by idempotency key
    "reports.daily:2024-03-31T01:30:00Z": {
        "payload": '{"a":"é","name":"reports.daily","z":[1,2.5,null]}',
        "scheduled_at": "2024-03-31T01:30:00Z",
    },
    "cleanup:2024-03-31T01:30:00.250000Z": {
        "payload": '{"a":"é","name":"cleanup","z":[1,2.5,null]}',
        "scheduled_at": "2024-03-31T01:30:00.250000Z",
    },
    "sync/users:2024-03-31T01:30:00Z": {
        "payload": '[1,"two"]',
        "scheduled_at": "2024-03-31T01:30:00Z",
    },
    "ping@host:2024-03-31T01:30:00Z": {"payload": "7", "scheduled_at": "2024-03-31T01:30:00Z"},
}


def expected_message(task: Task, message_id: str | None) -> dict[str, Any]:
    text = EXPECTED_TEXT[task.idempotency_key]
    return {
        "message_id": message_id,
        "id": task.id,
        "type": task.task_type,
        "payload": text["payload"],
        "queue": task.queue,
        "name": task.name,
        "idempotency_key": task.idempotency_key,
        "scheduled_at": text["scheduled_at"],
        "enqueued_at": NOW_TEXT,
        "options": f'{{"max_retry":3,"queue":"{task.queue}"}}',
    }


@dataclass
class Env:
    target: Target
    read: Callable[[], Awaitable[list[dict[str, Any]]]]  # every message, fields as text


def _utc_text(value: datetime) -> str:
    text = value.astimezone(UTC).isoformat(
        timespec="microseconds" if value.microsecond else "seconds"
    )
    return text.replace("+00:00", "Z")


@pytest.fixture(params=["redis", "outbox-postgresql", "outbox-sqlite", "outbox-mysql"])
def source(request: pytest.FixtureRequest) -> tuple[str, Any]:
    """What the target under test talks to. A plain fixture: pytest-asyncio cannot resolve async
    fixtures through ``getfixturevalue`` from inside an async fixture."""
    if request.param == "redis":
        return "redis", (
            request.getfixturevalue("redis_client"),
            request.getfixturevalue("redis_prefix"),
        )
    return "outbox", backend_url(request, request.param.removeprefix("outbox-"))


@pytest.fixture
async def env(source: tuple[str, Any]) -> AsyncIterator[Env]:
    kind, arg = source
    context = _redis_env(*arg) if kind == "redis" else _outbox_env(arg)
    async with context as made:
        yield made


@asynccontextmanager
async def _redis_env(client: aioredis.Redis, prefix: str) -> AsyncIterator[Env]:
    target = RedisStreamsTarget(client, prefix=prefix)

    async def read() -> list[dict[str, Any]]:
        out = []
        for queue in QUEUES:
            for entry_id, fields in await client.xrange(target.stream_key(queue)):
                out.append({"message_id": entry_id, **fields})
        return out

    yield Env(target, read)
    await target.close()


@asynccontextmanager
async def _outbox_env(url: str) -> AsyncIterator[Env]:
    await upgrade(url)
    engine = create_engine(url)
    target = OutboxTarget(engine)

    async def read() -> list[dict[str, Any]]:
        async with engine.connect() as conn:
            rows = (await conn.execute(select(outbox_table))).mappings().all()
        return [
            {
                "message_id": str(r["seq"]),
                "id": r["task_id"],
                "type": r["task_type"],
                "payload": r["payload"],
                "queue": r["queue"],
                "name": r["name"],
                "idempotency_key": r["idempotency_key"],
                "scheduled_at": _utc_text(r["scheduled_at"]),
                "enqueued_at": _utc_text(r["enqueued_at"]),
                "options": r["options"],
            }
            for r in rows
        ]

    try:
        yield Env(target, read)
        await target.close()
        assert engine.pool.checkedout() == 0, "a pooled connection was left checked out"
    finally:
        await engine.dispose()


def by_key(messages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {m["idempotency_key"]: m for m in messages}


# --- the contract ---------------------------------------------------------------------------


async def test_batch_across_queues_has_every_field_exactly(env: Env) -> None:
    tasks = batch()
    results = await env.target.enqueue(tasks, NOW)

    assert [r.task for r in results] == tasks
    assert [r.status for r in results] == ["enqueued"] * 4
    ids = {(r.task.queue, r.message_id) for r in results}  # stream entry ids: per queue
    assert len(ids) == 4 and all(message_id for _, message_id in ids)
    messages = await env.read()
    assert len(messages) == 4
    assert by_key(messages) == {
        r.task.idempotency_key: expected_message(r.task, r.message_id) for r in results
    }


async def test_same_batch_again_is_all_duplicate_and_adds_nothing(env: Env) -> None:
    first = await env.target.enqueue(batch(), NOW)
    before = await env.read()

    again = await env.target.enqueue(batch(), NOW + timedelta(seconds=5))

    assert [r.status for r in again] == ["duplicate"] * 4
    assert [r.message_id for r in again] == [r.message_id for r in first]
    assert await env.read() == before


async def test_mixed_batch_reports_each_task_in_input_order(env: Env) -> None:
    t = batch()
    first = await env.target.enqueue([t[0], t[1]], NOW)

    mixed = [t[2], t[0], t[3], t[1]]
    results = await env.target.enqueue(mixed, NOW)

    assert [r.task for r in results] == mixed
    assert [r.status for r in results] == ["enqueued", "duplicate", "enqueued", "duplicate"]
    assert results[1].message_id == first[0].message_id
    assert results[3].message_id == first[1].message_id
    messages = by_key(await env.read())
    assert len(messages) == 4
    for r in results:
        assert messages[r.task.idempotency_key]["message_id"] == r.message_id


async def test_key_repeated_within_a_batch_is_enqueued_once(env: Env) -> None:
    task = batch()[0]
    results = await env.target.enqueue([task, task], NOW)

    assert [r.status for r in results] == ["enqueued", "duplicate"]
    assert results[0].message_id == results[1].message_id is not None
    assert len(await env.read()) == 1


async def test_empty_batch(env: Env) -> None:
    assert await env.target.enqueue([], NOW) == []
    assert await env.read() == []


# --- Redis Streams --------------------------------------------------------------------------


@pytest.fixture
async def redis_target(redis_client: aioredis.Redis, redis_prefix: str) -> RedisStreamsTarget:
    return RedisStreamsTarget(redis_client, prefix=redis_prefix, claim_margin=60)


async def test_claim_ttl_lasts_until_expiry_plus_margin(
    redis_target: RedisStreamsTarget, redis_client: aioredis.Redis
) -> None:
    live = make_task("live", "alpha")  # expires 30 s after the slot
    stale = make_task("stale", "alpha", SLOT - timedelta(hours=1))  # expired long ago
    results = await redis_target.enqueue([live, stale], SLOT)

    live_claim = redis_target.claim_key("alpha", live.idempotency_key)
    assert 85_000 < await redis_client.pttl(live_claim) <= 90_000  # 30 s + 60 s margin
    assert (
        0 < await redis_client.pttl(redis_target.claim_key("alpha", stale.idempotency_key)) <= 1000
    )
    assert await redis_client.get(live_claim) == results[0].message_id  # claim -> its entry


async def test_claim_ttl_counts_elapsed_time_across_a_dst_jump(
    redis_target: RedisStreamsTarget,
) -> None:
    berlin = ZoneInfo("Europe/Berlin")
    now = datetime(2024, 3, 31, 1, 59, 59, tzinfo=berlin)  # 00:59:59Z, clocks jump at 01:00Z
    task = make_task("job", "alpha", SLOT)
    task.expires_at = datetime(2024, 3, 31, 3, 0, 30, tzinfo=berlin)  # 01:00:30Z
    assert redis_target.claim_ttl_ms(task, now) == (31 + 60) * 1000  # not an hour more


async def test_stream_and_claims_of_a_queue_share_a_cluster_slot(redis_prefix: str) -> None:
    client = aioredis.Redis()  # never connects: key names only
    target = RedisStreamsTarget(client, prefix=redis_prefix)
    await client.aclose()
    for queue in ("default", "emails.high", "a:b"):
        stream = target.stream_key(queue)
        assert stream == f"{{{redis_prefix}:{queue}}}:stream"
        claim = target.claim_key(queue, "reports.daily:2024-03-31T01:30:00Z")
        assert claim == f"{{{redis_prefix}:{queue}}}:claim:reports.daily:2024-03-31T01:30:00Z"
        assert key_slot(stream.encode()) == key_slot(claim.encode())


async def test_maxlen_trims_approximately(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    target = RedisStreamsTarget(
        redis_client, prefix=redis_prefix, maxlen=1000, maxlen_by_queue={"alpha": 10}
    )
    tasks = [make_task(f"job{i}", q) for q in QUEUES for i in range(500)]
    results = await target.enqueue(tasks, NOW)

    assert {r.status for r in results} == {"enqueued"}
    trimmed = await redis_client.xlen(target.stream_key("alpha"))
    assert 10 <= trimmed < 500  # "~": whole nodes go, so a little more than 10 stays
    assert await redis_client.xlen(target.stream_key("beta")) == 500  # below its maxlen


async def test_script_is_loaded_when_the_server_lacks_it_and_only_then(
    redis_target: RedisStreamsTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    # A script text no server has seen (as after SCRIPT FLUSH or a failover to a fresh node),
    # without flushing the script cache of a Redis that other tests share.
    text = f"{CLAIM_AND_ADD}\n-- {redis_prefix}"
    sha = hashlib.sha1(text.encode()).hexdigest()
    redis_target._scripts = (text, *redis_target._scripts[1:])
    redis_target._shas = (sha, *redis_target._shas[1:])
    assert await redis_client.script_exists(sha) == [False]
    results = await redis_target.enqueue(batch(), NOW)
    assert [r.status for r in results] == ["enqueued"] * 4
    assert await redis_client.script_exists(sha) == [True]
    # Loaded now: the next burst is EVALSHA straight away (no SCRIPT EXISTS, no reload).
    loads = []
    original = redis_client.script_load

    async def counting_load(script: str) -> str:
        loads.append(script)
        return await original(script)

    redis_client.script_load = counting_load  # type: ignore[method-assign]
    results = await redis_target.enqueue([make_task("again", "alpha")], NOW)
    assert [r.status for r in results] == ["enqueued"] and loads == []


async def test_failed_xadd_leaves_no_claim_behind(
    redis_target: RedisStreamsTarget, redis_client: aioredis.Redis
) -> None:
    task = make_task("job", "alpha")
    other = make_task("job", "beta")
    await redis_client.set(redis_target.stream_key("alpha"), "not a stream")

    # The queue whose stream key holds another type is refused for good, alone; the others go.
    bad, good = await redis_target.enqueue([task, other], NOW)
    assert bad.status == "failed" and bad.permanent and "WRONGTYPE" in (bad.error or "")
    assert good.status == "enqueued"
    assert await redis_client.exists(redis_target.claim_key("alpha", task.idempotency_key)) == 0


async def test_a_queue_with_a_hash_tag_is_refused_alone(redis_target: RedisStreamsTarget) -> None:
    bad, good = await redis_target.enqueue(
        [make_task("job", "a{b}"), make_task("job", "beta")], NOW
    )
    assert bad.status == "failed" and bad.permanent and "'{' or '}'" in (bad.error or "")
    assert good.status == "enqueued"


@pytest.fixture
def closed_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield port


@pytest.mark.parametrize("retries", [0, None], ids=["no-retries", "default-retries"])
async def test_redis_down_raises_target_error_quickly(
    closed_port: int, retries: int | None
) -> None:
    # redis-py retries refused connections with backoff by default (seconds in all); the
    # target's own timeout bounds the call either way.
    kwargs: dict[str, Any] = {} if retries is None else {"retry": Retry(NoBackoff(), retries)}
    client = aioredis.Redis(port=closed_port, socket_connect_timeout=1, **kwargs)
    target = RedisStreamsTarget(client, timeout=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(TargetError) as info:
            await target.enqueue(batch(), NOW)
    finally:
        await client.aclose()
    assert time.monotonic() - started < 1.0
    # Without retries the refusal itself surfaces; with redis-py's jittered retries either the
    # target's timeout or the last refusal does, depending on the draw.
    causes = RedisConnectionError if retries == 0 else (TimeoutError, RedisConnectionError)
    assert isinstance(info.value.__cause__, causes)


async def test_redis_that_never_answers_raises_target_error_after_timeout() -> None:
    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # read everything, answer nothing
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    target = RedisStreamsTarget.from_url(f"redis://127.0.0.1:{port}/0", timeout=0.3)
    try:
        started = time.monotonic()
        with pytest.raises(TargetError, match="no answer"):
            await target.enqueue(batch(), NOW)
        assert time.monotonic() - started < 2
    finally:
        await target.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("kind", ["redis", "arq", "celery"])
async def test_a_redis_that_never_answers_fails_every_target_in_the_same_words(kind: str) -> None:
    # One translation of Redis failures: the batch and the sentinel's look each fail with
    # "<what>: no answer within <t> s", whichever target asked.
    from periodic_manager.targets.arq import ArqTarget
    from periodic_manager.targets.celery.target import CeleryTarget

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # read everything, answer nothing
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    url = f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"
    build = {
        "redis": RedisStreamsTarget.from_url,
        "arq": ArqTarget.from_url,
        "celery": CeleryTarget.from_url,
    }
    target = build[kind](url, timeout=0.3)
    what = {"redis": "redis", "arq": "arq: redis", "celery": "celery: redis"}[kind]
    try:
        with pytest.raises(TargetError, match=f"^{what}: no answer within 0.3 s$"):
            await target.enqueue(batch(), NOW)
        with pytest.raises(TargetError, match="^sentinel: no answer within 0.3 s$"):
            await target.forgotten()
    finally:
        await target.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("kind", ["own bound", "socket timeout"])
def test_either_bound_running_out_reads_no_answer_within(kind: str) -> None:
    """The call's own bound and the client's socket timeout are the same ``timeout``: whichever
    runs out first under load, the failure reads the same (it read "TimeoutError: Timeout
    reading from ..." when the socket's came first, and a test matching the words failed)."""
    from redis.exceptions import TimeoutError as SocketTimeout

    from periodic_manager.targets.redis.errors import redis_errors

    raised = (
        TimeoutError() if kind == "own bound" else SocketTimeout("Timeout reading from 127.0.0.1:1")
    )
    with pytest.raises(TargetError, match="^celery: redis: no answer within 0.5 s$"):
        with redis_errors("celery: redis", 0.5):
            raise raised
    with pytest.raises(TargetError, match="^claims: "):  # no bound known here: the error itself
        with redis_errors("claims"):
            raise raised


async def test_concurrent_double_enqueue_on_redis_enqueues_each_key_once(
    redis_url: str, redis_prefix: str, redis_client: aioredis.Redis
) -> None:
    tasks = [make_task(f"job{i}", QUEUES[i % 2]) for i in range(50)]
    a = RedisStreamsTarget.from_url(redis_url, prefix=redis_prefix)
    b = RedisStreamsTarget.from_url(redis_url, prefix=redis_prefix)
    try:
        ra, rb = await asyncio.gather(a.enqueue(tasks, NOW), b.enqueue(tasks, NOW))
    finally:
        await a.close()
        await b.close()
    assert_exactly_once(tasks, ra, rb)
    keys = [
        fields["idempotency_key"]
        for q in QUEUES
        for _, fields in await redis_client.xrange(a.stream_key(q))
    ]
    assert sorted(keys) == sorted(t.idempotency_key for t in tasks)


def assert_exactly_once(
    tasks: list[Task], ra: list[EnqueueResult], rb: list[EnqueueResult]
) -> None:
    for task, x, y in zip(tasks, ra, rb, strict=True):
        assert x.task == y.task == task
        assert sorted([x.status, y.status]) == ["duplicate", "enqueued"]
        assert x.message_id == y.message_id is not None


# --- outbox ---------------------------------------------------------------------------------


def load_example(name: str) -> ModuleType:
    path = ROOT / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("order", ["same", "reversed"])
async def test_concurrent_double_enqueue_on_a_database_server_enqueues_each_key_once(
    server_url: str, order: str
) -> None:
    await upgrade(server_url)
    tasks = [make_task(f"job{i}", QUEUES[i % 2]) for i in range(200)]
    other = tasks if order == "same" else tasks[::-1]  # overlapping batches in any order
    a, b = OutboxTarget.from_url(server_url), OutboxTarget.from_url(server_url)
    try:
        ra, rb = await asyncio.gather(a.enqueue(tasks, NOW), b.enqueue(other, NOW))
    finally:
        await a.close()
        await b.close()
    assert [r.task for r in rb] == other
    by_task = {r.task.idempotency_key: r for r in rb}
    assert_exactly_once(tasks, ra, [by_task[t.idempotency_key] for t in tasks])


async def test_skip_locked_consumers_take_disjoint_rows(server_url: str) -> None:
    await upgrade(server_url)
    consumer = load_example("consume_outbox")
    target = OutboxTarget.from_url(server_url)
    engine = consumer.make_engine(server_url)
    try:
        results = await target.enqueue([make_task(f"job{i}", "alpha") for i in range(5)], NOW)
        async with engine.connect() as c1, engine.connect() as c2, asyncio.timeout(5):
            async with c1.begin():
                first = await consumer.claim_batch(c1, "alpha", 2)
                async with c2.begin():  # not blocked by c1's locks: it skips them
                    second = await consumer.claim_batch(c2, "alpha", 10)
                    await consumer.mark_processed(c2, [m["seq"] for m in second])
        assert [m["seq"] for m in first] == [int(r.message_id or 0) for r in results[:2]]
        assert [m["seq"] for m in second] == [int(r.message_id or 0) for r in results[2:]]
        assert first[0]["idempotency_key"] == results[0].task.idempotency_key
        async with engine.connect() as conn, conn.begin():
            assert [m["seq"] for m in await consumer.claim_batch(conn, "alpha", 10)] == [
                m["seq"] for m in first
            ]  # c1 committed nothing; c2 marked its rows processed
    finally:
        await target.close()
        await engine.dispose()


async def test_outbox_database_down_raises_target_error(closed_port: int) -> None:
    target = OutboxTarget.from_url(f"postgresql://postgres@127.0.0.1:{closed_port}/pm")
    try:
        with pytest.raises(TargetError):
            await target.enqueue(batch(), NOW)
    finally:
        await target.close()
