"""The dramatiq target against a real ``dramatiq`` worker (a subprocess), on Redis and on RabbitMQ.

On Redis the worker's RedisBroker and the target share a namespace, the test's ``redis_prefix``, so
every key either writes (the queue, its messages, the worker's heartbeats and acks) carries the
prefix and goes with the test. On RabbitMQ the queue is named after the prefix and deleted (with
Dramatiq's delay and dead-letter queues) after the test; the claims live in the test Redis. The
worker's actors record what they received (tests/support/dramatiq_worker_app.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from periodic_manager.cli.main import main
from periodic_manager.contracts import Task
from periodic_manager.errors import TargetError
from periodic_manager.runtime.assemble import build_target
from periodic_manager.runtime.startup import describe_targets
from periodic_manager.settings import Settings
from periodic_manager.targets.base import task_id_for
from periodic_manager.targets.dramatiq import DramatiqTarget
from tests.support import ROOT
from tests.support.polling import eventually

SLOT = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
APP = "tests.support.dramatiq_worker_app"


def make_task(prefix: str, name: str, payload: Any, queue: str, **options: Any) -> Task:
    key = f"{prefix}.{name}:2024-05-01T12:01:00Z"
    return Task(
        id=task_id_for(key),
        name=f"{prefix}.{name}",
        task_type=options.pop("task_type", "record"),
        payload=payload,
        queue=queue,
        options={"queue": queue, **options},
        idempotency_key=key,
        scheduled_at=SLOT,
        expires_at=SLOT + timedelta(seconds=30),
    )


@contextmanager
def worker(broker: str, prefix: str, queue: str, redis_url: str, log: Path) -> Iterator[None]:
    """A ``dramatiq`` worker process on ``queue`` while the block runs (then stopped)."""
    env = {
        **os.environ,
        "PM_TEST_DRAMATIQ_URL": broker,
        "PM_TEST_DRAMATIQ_NAMESPACE": prefix,
        "PM_TEST_DRAMATIQ_QUEUE": queue,
        "PM_TEST_REDIS": redis_url,
        "PM_TEST_OUT": f"{prefix}:out",
    }
    argv = [
        sys.executable,
        "-m",
        "dramatiq",
        APP,
        "--processes",
        "1",
        "--threads",
        "2",
        "--queues",
        queue,
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=out)
        try:
            yield
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def received(
    redis_client: aioredis.Redis, prefix: str, count: int, log: Path
) -> list[dict[str, Any]]:
    """What the worker's actors recorded, once ``count`` runs are in (and no more after)."""
    out = f"{prefix}:out"
    await eventually(
        lambda: _at_least(redis_client, out, count),
        f"{count} messages run",
        seconds=60,
        detail=lambda: log.read_text(errors="replace")[-3000:],
    )
    return [json.loads(line) for line in await redis_client.lrange(out, 0, -1)]


async def _at_least(redis_client: aioredis.Redis, key: str, count: int) -> bool:
    return int(await redis_client.llen(key)) >= count


PAYLOADS: dict[str, Any] = {
    "kwargs": {"a": 1, "b": [1, 2]},
    "args": [1, "two", None],
    "scalar": "x",
    "none": None,
}
EXPECTED = {
    "kwargs": ("record", [], {"a": 1, "b": [1, 2]}),
    "args": ("record", [1, "two", None], {}),
    "scalar": ("record", ["x"], {}),
    "none": ("record", [], {}),
    "other": ("other", [], {"k": "v"}),
    **{f"many{i}": ("record", [i], {}) for i in range(20)},
}


def the_tasks(prefix: str, queue: str) -> list[Task]:
    tasks = [make_task(prefix, name, payload, queue) for name, payload in PAYLOADS.items()]
    tasks.append(make_task(prefix, "other", {"k": "v"}, queue, task_type="other"))
    return tasks + [make_task(prefix, f"many{i}", [i], queue) for i in range(20)]


def check_runs(got: list[dict[str, Any]], tasks: list[Task], queue: str) -> None:
    assert sorted(r["id"] for r in got) == sorted(t.id for t in tasks)  # each once
    by_id = {r["id"]: r for r in got}
    for task in tasks:
        run = by_id[task.id]
        assert (run["actor"], run["args"], run["kwargs"]) == EXPECTED[task.name.split(".", 1)[1]]
        assert run["queue"] == queue
        assert run["options"] == {
            "scheduled_at": "2024-05-01T12:01:00Z",
            "idempotency_key": task.idempotency_key,
        }


@pytest.fixture
async def target(redis_url: str, redis_prefix: str) -> AsyncIterator[DramatiqTarget]:
    made = DramatiqTarget.from_url(redis_url, prefix=redis_prefix, namespace=redis_prefix)
    try:
        yield made
    finally:
        await made.close()


# -- Redis -------------------------------------------------------------------------------------


async def test_a_real_worker_on_redis_runs_each_message_once_with_its_arguments(
    target: DramatiqTarget,
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
    tmp_path: Path,
) -> None:
    p = redis_prefix
    queue = f"{p}-q"
    tasks = the_tasks(p, queue)
    first = await target.enqueue(tasks, SLOT)
    assert [r.status for r in first] == ["enqueued"] * len(tasks)
    assert [r.message_id for r in first] == [t.id for t in tasks]
    assert await redis_client.lrange(f"{p}:{queue}", 0, -1) == [t.id for t in tasks]
    assert await redis_client.hlen(f"{p}:{queue}.msgs") == len(tasks)

    # The same slots again (a retry, another manager): nothing added.
    again = await target.enqueue(tasks, SLOT + timedelta(seconds=1))
    assert [r.status for r in again] == ["duplicate"] * len(tasks)
    assert await redis_client.llen(f"{p}:{queue}") == len(tasks)

    log = tmp_path / "dramatiq.log"
    with worker(redis_url, p, queue, redis_url, log):
        got = await received(redis_client, p, len(tasks), log)
        got = await redis_client_runs(redis_client, p, got)
    check_runs(got, tasks, queue)
    assert await redis_client.llen(f"{p}:{queue}") == 0
    assert await redis_client.hlen(f"{p}:{queue}.msgs") == 0  # acknowledged: deleted by Dramatiq

    # Run and gone from Dramatiq: within grace the claims still refuse the slot.
    late = await target.enqueue(tasks[:1], SLOT + timedelta(seconds=29))
    assert late[0].status == "duplicate"
    assert await redis_client.llen(f"{p}:{queue}") == 0


async def redis_client_runs(
    redis_client: aioredis.Redis, prefix: str, got: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``got`` again after a moment for stray extra runs: the list must not grow."""
    await asyncio.sleep(0.5)  # a duplicate would be run by the idle worker by now (not a slot)
    return [json.loads(line) for line in await redis_client.lrange(f"{prefix}:out", 0, -1)]


async def test_the_message_is_the_one_dramatiqs_redis_broker_writes(
    target: DramatiqTarget, redis_client: aioredis.Redis, redis_prefix: str, redis_url: str
) -> None:
    from dramatiq import Message
    from dramatiq.brokers.redis import RedisBroker

    p, queue = redis_prefix, f"{redis_prefix}-q"
    task = make_task(p, "same", {"a": [1, {"b": None}]}, queue)
    [result] = await target.enqueue([task], SLOT)
    assert result.status == "enqueued"
    ours = Message.decode(await _raw(redis_url, f"{p}:{queue}.msgs", task.id))

    # Dramatiq's own broker, sending the same call in another namespace of the test.
    theirs_ns = f"{p}b"
    broker = RedisBroker(url=redis_url, namespace=theirs_ns, middleware=[])
    try:
        sent = broker.enqueue(
            Message(
                queue_name=queue,
                actor_name="record",
                args=(),
                kwargs={"a": [1, {"b": None}]},
                options={
                    "scheduled_at": "2024-05-01T12:01:00Z",
                    "idempotency_key": task.idempotency_key,
                },
                message_id=task.id,
                message_timestamp=ours.message_timestamp,
            )
        )
    finally:
        broker.client.close()
    redis_id = sent.options["redis_message_id"]
    theirs = Message.decode(await _raw(redis_url, f"{theirs_ns}:{queue}.msgs", redis_id))
    assert await redis_client.lrange(f"{theirs_ns}:{queue}", 0, -1) == [redis_id]
    # Identical but for the broker's per-enqueue id (ours: the task id, the same on every manager).
    assert ours.options.pop("redis_message_id") == task.id
    assert theirs.options.pop("redis_message_id") == redis_id
    assert ours.asdict() == theirs.asdict()
    assert ours.message_timestamp == int(SLOT.timestamp() * 1000)


async def _raw(redis_url: str, key: str, field: str) -> bytes:
    client = aioredis.from_url(redis_url)  # bytes, as the worker reads them
    try:
        value = await client.hget(key, field)
    finally:
        await client.aclose()
    assert value is not None
    return bytes(value)


async def test_racing_managers_give_one_message_per_slot(
    redis_url: str, redis_prefix: str, redis_client: aioredis.Redis
) -> None:
    p, queue = redis_prefix, f"{redis_prefix}-q"
    tasks = [make_task(p, f"r{i}", [i], queue) for i in range(50)]
    targets = [DramatiqTarget.from_url(redis_url, prefix=p, namespace=p) for _ in range(6)]
    try:
        replies = await asyncio.gather(*(t.enqueue(tasks, SLOT) for t in targets))
    finally:
        for t in targets:
            await t.close()
    for i in range(len(tasks)):
        assert sorted(r[i].status for r in replies) == ["duplicate"] * 5 + ["enqueued"]
    assert sorted(await redis_client.lrange(f"{p}:{queue}", 0, -1)) == sorted(t.id for t in tasks)


async def test_a_queued_message_refuses_its_slot_and_bad_tasks_fail_alone(
    target: DramatiqTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    p, queue = redis_prefix, f"{redis_prefix}-q"
    good = make_task(p, "good", [1], queue)
    bad_queue = make_task(p, "badq", [1], "no spaces")
    dead = make_task(p, "dead", [1], f"{queue}.XQ")
    results = await target.enqueue([good, bad_queue, dead], SLOT)
    assert [r.status for r in results] == ["enqueued", "failed", "failed"]
    assert "not a Dramatiq queue name" in (results[1].error or "")
    assert "dead-letter" in (results[2].error or "")
    # With the claim gone (say, expired), the message still queued refuses the slot.
    await redis_client.delete(f"{p}:claim:{good.idempotency_key}")
    [again] = await target.enqueue([good], SLOT)
    assert again.status == "duplicate"
    assert await redis_client.lrange(f"{p}:{queue}", 0, -1) == [good.id]
    for bad in (bad_queue, dead):
        assert await redis_client.exists(f"{p}:claim:{bad.idempotency_key}") == 0


async def test_a_queue_key_of_another_type_fails_its_batch_alone(
    target: DramatiqTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    p = redis_prefix
    broken, fine = f"{p}-broken", f"{p}-fine"
    await redis_client.set(f"{p}:{broken}.msgs", "x")
    a, b = make_task(p, "a", [1], broken), make_task(p, "b", [2], fine)
    results = await target.enqueue([a, b], SLOT)
    assert [r.status for r in results] == ["failed", "enqueued"]
    assert "WRONGTYPE" in (results[0].error or "") and "not a hash" in (results[0].error or "")
    assert await redis_client.exists(f"{p}:claim:{a.idempotency_key}", f"{p}:{broken}") == 0
    assert await redis_client.lrange(f"{p}:{fine}", 0, -1) == [b.id]


async def test_overlap_is_refused_with_the_reason(
    target: DramatiqTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    p, queue = redis_prefix, f"{redis_prefix}-q"
    held = make_task(p, "held", [1], queue, overlap="hold")
    plain = make_task(p, "plain", [2], queue)
    results = await target.enqueue([held, plain], SLOT)
    assert [r.status for r in results] == ["failed", "enqueued"]
    assert "options.overlap 'hold': the dramatiq target cannot tell" in (results[0].error or "")
    assert "Results middleware" in (results[0].error or "")
    assert await redis_client.lrange(f"{p}:{queue}", 0, -1) == [plain.id]
    assert target.completion_off({"overlap": "skip"}) is not None
    assert target.completion_off({}) is None


async def test_redis_down_is_a_target_error_and_ping_fails(redis_prefix: str) -> None:
    target = DramatiqTarget.from_url("redis://127.0.0.1:1/15", prefix=redis_prefix, timeout=1)
    try:
        with pytest.raises(TargetError, match="dramatiq: redis"):
            await target.enqueue([make_task(redis_prefix, "x", [1], "q")], SLOT)
        with pytest.raises(Exception):  # noqa: B017 - any failure of the readiness check
            await target.ping()
    finally:
        await target.close()


async def test_ping_and_sentinel(
    target: DramatiqTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    await target.ping()
    assert await target.forgotten() == []
    await redis_client.delete(f"{redis_prefix}:sentinel")  # the Redis "lost its data"
    assert await target.forgotten() == ["dramatiq"]


# -- settings ----------------------------------------------------------------------------------


def test_settings_build_the_dramatiq_target(
    monkeypatch: pytest.MonkeyPatch, sqlite_url: str, redis_url: str
) -> None:
    monkeypatch.setenv("PM_TARGET", "dramatiq")
    monkeypatch.setenv("PM_DRAMATIQ_URL", "redis://:secret@127.0.0.1:6379/4")
    monkeypatch.setenv("PM_DRAMATIQ_NAMESPACE", "jobs")
    settings = Settings(database_url=sqlite_url, redis_url=redis_url)
    target = build_target(settings, engine=None)  # type: ignore[arg-type]
    assert isinstance(target, DramatiqTarget) and target.rabbit is None
    assert target.namespace == "jobs"
    assert target.claims.client.connection_pool.connection_kwargs["db"] == 4
    assert describe_targets(settings) == "dramatiq (redis://:***@127.0.0.1:6379/4, namespace jobs)"
    assert "dramatiq" in settings.configured_targets().no_completion  # overlap refused

    monkeypatch.setenv("PM_DRAMATIQ_URL", "amqp://guest:secret@127.0.0.1:5672/")
    settings = Settings(database_url=sqlite_url, redis_url=redis_url)
    target = build_target(settings, engine=None)  # type: ignore[arg-type]
    assert isinstance(target, DramatiqTarget) and target.rabbit is not None
    assert describe_targets(settings) == (
        f"dramatiq (amqp://guest:***@127.0.0.1:5672/, claims {redis_url})"
    )


@pytest.mark.parametrize("url", ["http://x", "redis://", "rabbit://h", "127.0.0.1:6379"])
def test_a_bad_url_is_a_one_line_error_naming_pm_dramatiq_url(
    url: str, monkeypatch: pytest.MonkeyPatch, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PM_TARGET", "dramatiq")
    monkeypatch.setenv("PM_DRAMATIQ_URL", url)
    monkeypatch.setenv("PM_DATABASE_URL", sqlite_url)
    assert main(["migrate"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "PM_DRAMATIQ_URL" in err and "redis://" in err and "amqp://" in err


def test_dramatiq_cannot_run_on_a_redis_cluster(sqlite_url: str) -> None:
    with pytest.raises(ValueError, match="dramatiq target cannot run on a Redis Cluster"):
        Settings(database_url=sqlite_url, target="dramatiq", redis_cluster=True)


def test_a_missing_dramatiq_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, sqlite_url: str
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "dramatiq" else real(name, *a)
    )
    with pytest.raises(ValueError, match=r"pip install 'periodic-manager\[dramatiq\]'"):
        Settings(database_url=sqlite_url, target="dramatiq")


# -- RabbitMQ ----------------------------------------------------------------------------------


@pytest.fixture
def dramatiq_amqp(amqp_url: str) -> str:
    """The test RabbitMQ's URL as pika reads it (kombu's ``//``, the vhost ``/``, is ``/%2F``)."""
    return amqp_url[:-2] + "/%2F" if amqp_url.endswith("//") else amqp_url


@pytest.fixture
def rabbit_queue(dramatiq_amqp: str, redis_prefix: str) -> Iterator[str]:
    """A queue name of the test's own; it and Dramatiq's delay and dead-letter queues are deleted
    afterwards."""
    import pika  # type: ignore[import-untyped]

    queue = f"{redis_prefix}-q"
    yield queue
    connection = pika.BlockingConnection(pika.URLParameters(dramatiq_amqp))
    try:
        channel = connection.channel()
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            channel.queue_delete(name)
    finally:
        connection.close()


def message_count(amqp_url: str, queue: str) -> int:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


async def test_a_real_worker_on_rabbitmq_runs_each_message_once_with_its_arguments(
    dramatiq_amqp: str,
    rabbit_queue: str,
    redis_url: str,
    redis_prefix: str,
    redis_client: aioredis.Redis,
    tmp_path: Path,
) -> None:
    p, queue, amqp_url = redis_prefix, rabbit_queue, dramatiq_amqp
    tasks = the_tasks(p, queue)
    target = DramatiqTarget.from_url(amqp_url, claims_url=redis_url, prefix=p)
    try:
        await target.ping()
        first = await target.enqueue(tasks, SLOT)
        assert [r.status for r in first] == ["enqueued"] * len(tasks)
        assert [r.message_id for r in first] == [t.id for t in tasks]
        # Confirmed: the claims are sent.
        assert await redis_client.get(f"{p}:claim:{tasks[0].idempotency_key}") == f"s|{tasks[0].id}"
        again = await target.enqueue(tasks, SLOT + timedelta(seconds=1))
        assert [r.status for r in again] == ["duplicate"] * len(tasks)
        assert message_count(amqp_url, queue) == len(tasks)
    finally:
        await target.close()

    log = tmp_path / "dramatiq.log"
    with worker(amqp_url, p, queue, redis_url, log):
        got = await received(redis_client, p, len(tasks), log)
        got = await redis_client_runs(redis_client, p, got)
    check_runs(got, tasks, queue)
    assert message_count(amqp_url, queue) == 0


async def test_racing_managers_on_rabbitmq_give_one_message_per_slot(
    dramatiq_amqp: str, rabbit_queue: str, redis_url: str, redis_prefix: str
) -> None:
    p, queue, amqp_url = redis_prefix, rabbit_queue, dramatiq_amqp
    tasks = [make_task(p, f"r{i}", [i], queue) for i in range(20)]
    targets = [DramatiqTarget.from_url(amqp_url, claims_url=redis_url, prefix=p) for _ in range(4)]
    try:
        replies = await asyncio.gather(*(t.enqueue(tasks, SLOT) for t in targets))
    finally:
        for t in targets:
            await t.close()
    for i in range(len(tasks)):
        assert sorted(r[i].status for r in replies) == ["duplicate"] * 3 + ["enqueued"]
    assert message_count(amqp_url, queue) == len(tasks)


async def test_rabbitmq_down_leaves_no_slot_claimed_and_ping_fails(
    redis_url: str, redis_prefix: str, redis_client: aioredis.Redis
) -> None:
    p = redis_prefix
    target = DramatiqTarget.from_url(
        "amqp://guest:guest@127.0.0.1:1/", claims_url=redis_url, prefix=p, timeout=2
    )
    task = make_task(p, "down", [1], f"{p}-q")
    try:
        with pytest.raises(TargetError, match="dramatiq: published 0 of 1"):
            await target.enqueue([task], SLOT)
        # Never published (the connection was refused): the claim is freed for the retry.
        assert await redis_client.exists(f"{p}:claim:{task.idempotency_key}") == 0
        with pytest.raises(TargetError, match="dramatiq: rabbitmq"):
            await target.ping()
    finally:
        await target.close()


async def test_a_queue_deleted_under_the_target_is_declared_again_and_the_slot_resent(
    dramatiq_amqp: str, rabbit_queue: str, redis_url: str, redis_prefix: str
) -> None:
    import pika

    p, queue, amqp_url = redis_prefix, rabbit_queue, dramatiq_amqp
    first, second = make_task(p, "one", [1], queue), make_task(p, "two", [2], queue)
    target = DramatiqTarget.from_url(amqp_url, claims_url=redis_url, prefix=p)
    try:
        assert [r.status for r in await target.enqueue([first], SLOT)] == ["enqueued"]
        connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
        try:
            connection.channel().queue_delete(queue)
        finally:
            connection.close()
        # Returned unroutable: not confirmed, so the claim stays pending and the retry publishes.
        with pytest.raises(TargetError, match="dramatiq: published 0 of 1"):
            await target.enqueue([second], SLOT)
        assert [r.status for r in await target.enqueue([second], SLOT)] == ["resent"]
    finally:
        await target.close()
    assert message_count(amqp_url, queue) == 1  # the queue declared again, with the second only
