"""The rq target against a real ``rq worker --burst`` (a subprocess on the test Redis).

The worker and the target share RQ's key prefix, set to the test's ``redis_prefix``
(``RQ_KEY_PREFIX`` for the worker, ``key_prefix`` for the target), so every key either writes
(jobs, queues, registries, results, the worker's own) carries the prefix and goes with the test.
The worker's functions record what they received (tests/support/rq_worker_app.py).
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from periodic_manager.contracts import Task
from periodic_manager.errors import TargetError
from periodic_manager.runtime.assemble import build_target
from periodic_manager.runtime.startup import describe_targets
from periodic_manager.settings import Settings
from periodic_manager.targets.base import task_id_for
from periodic_manager.targets.rq import RqTarget, rq_meta
from tests.support.celery_arq_rig import rq_burst

SLOT = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
FUNC = "tests.support.rq_worker_app"


def make_task(prefix: str, name: str, payload: Any, queue: str, **options: Any) -> Task:
    key = f"{prefix}.{name}:2024-05-01T12:01:00Z"
    return Task(
        id=task_id_for(key),
        name=f"{prefix}.{name}",
        task_type=options.pop("task_type", f"{FUNC}.record"),
        payload=payload,
        queue=queue,
        options={"queue": queue, **options},
        idempotency_key=key,
        scheduled_at=SLOT,
        expires_at=SLOT + timedelta(seconds=30),
    )


@pytest.fixture
async def target(redis_url: str, redis_prefix: str) -> Any:
    made = RqTarget.from_url(redis_url, prefix=redis_prefix, key_prefix=redis_prefix)
    try:
        yield made
    finally:
        await made.close()


async def test_a_real_rq_worker_runs_each_job_once_with_its_arguments_and_meta(
    target: RqTarget,
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
    tmp_path: Path,
) -> None:
    p = redis_prefix
    queue = f"{p}-q"
    payloads: dict[str, Any] = {
        "kwargs": {"a": 1, "b": [1, 2]},
        "args": [1, "two", None],
        "scalar": "x",
        "none": None,
    }
    tasks = [make_task(p, name, payload, queue) for name, payload in payloads.items()]
    tasks.append(make_task(p, "other", {"k": "v"}, queue, task_type=f"{FUNC}.other"))
    tasks += [make_task(p, f"many{i}", [i], queue) for i in range(20)]

    first = await target.enqueue(tasks, SLOT)
    assert [r.status for r in first] == ["enqueued"] * len(tasks)
    assert [r.message_id for r in first] == [t.id for t in tasks]
    assert await redis_client.lrange(f"{p}:queue:{queue}", 0, -1) == [t.id for t in tasks]
    assert await redis_client.smembers(f"{p}:queues") == {f"{p}:queue:{queue}"}
    assert await redis_client.hget(f"{p}:job:{tasks[0].id}", "status") == "queued"

    # The same slot again (a retry, another manager): nothing added.
    again = await target.enqueue(tasks, SLOT + timedelta(seconds=1))
    assert [r.status for r in again] == ["duplicate"] * len(tasks)
    assert await redis_client.llen(f"{p}:queue:{queue}") == len(tasks)

    rq_burst(p, queue, redis_url, tmp_path / "rq.log")

    got = [json.loads(line) for line in await redis_client.lrange(f"{p}:out", 0, -1)]
    assert sorted(r["id"] for r in got) == sorted(t.id for t in tasks)  # each once
    by_id = {r["id"]: r for r in got}
    expected = {
        "kwargs": ("record", [], {"a": 1, "b": [1, 2]}),
        "args": ("record", [1, "two", None], {}),
        "scalar": ("record", ["x"], {}),
        "none": ("record", [], {}),
        "other": ("other", [], {"k": "v"}),
        **{f"many{i}": ("record", [i], {}) for i in range(20)},
    }
    for task in tasks:
        run = by_id[task.id]
        assert (run["task"], run["args"], run["kwargs"]) == expected[task.name.split(".", 1)[1]]
        assert run["queue"] == queue
        assert run["meta"] == {
            "scheduled_at": "2024-05-01T12:01:00Z",
            "idempotency_key": task.idempotency_key,
        }
    assert await redis_client.llen(f"{p}:queue:{queue}") == 0

    # The jobs ran; within grace the claims still refuse the slot (RQ may have dropped the job).
    await redis_client.delete(*(f"{p}:job:{t.id}" for t in tasks))
    late = await target.enqueue(tasks[:1], SLOT + timedelta(seconds=29))
    assert late[0].status == "duplicate"
    assert await redis_client.llen(f"{p}:queue:{queue}") == 0


async def test_a_job_id_rq_holds_is_a_duplicate_and_bad_tasks_fail_alone(
    target: RqTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    p, queue = redis_prefix, f"{redis_prefix}-q"
    good = make_task(p, "good", [1], queue)
    bare = make_task(p, "bare", [1], queue, task_type="record")  # not a dotted path
    results = await target.enqueue([good, bare], SLOT)
    assert [r.status for r in results] == ["enqueued", "failed"]
    assert "dotted path" in (results[1].error or "") and results[1].permanent
    # With the claim gone (say, expired), RQ's job hash still refuses the queued job id.
    await redis_client.delete(f"{p}:claim:{good.idempotency_key}")
    [again] = await target.enqueue([good], SLOT)
    assert again.status == "duplicate"
    assert await redis_client.lrange(f"{p}:queue:{queue}", 0, -1) == [good.id]
    for bad in (bare,):
        assert (
            await redis_client.exists(f"{p}:claim:{bad.idempotency_key}", f"{p}:job:{bad.id}") == 0
        )


async def test_expires_becomes_the_jobs_ttl(
    target: RqTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    p, queue = redis_prefix, f"{redis_prefix}-q"
    task = make_task(p, "ttl", None, queue, extra={"expires": 600})
    [result] = await target.enqueue([task], SLOT + timedelta(seconds=10))
    assert result.status == "enqueued"
    assert 580 <= await redis_client.ttl(f"{p}:job:{task.id}") <= 590
    assert await redis_client.hget(f"{p}:job:{task.id}", "ttl") == "590"
    assert rq_meta(task)["scheduled_at"] == "2024-05-01T12:01:00Z"


async def test_timeout_becomes_the_jobs_timeout_rounded_up(
    target: RqTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    p, queue = redis_prefix, f"{redis_prefix}-q"
    timed = make_task(p, "timed", None, queue, timeout=12.5)
    plain = make_task(p, "plain", None, queue)
    results = await target.enqueue([timed, plain], SLOT)
    assert [r.status for r in results] == ["enqueued", "enqueued"]
    assert await redis_client.hget(f"{p}:job:{timed.id}", "timeout") == "13"
    assert await redis_client.hget(f"{p}:job:{plain.id}", "timeout") == "180"  # RQ's default


async def test_a_queue_key_of_another_type_fails_its_batch_alone(
    target: RqTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    p = redis_prefix
    broken, fine = f"{p}-broken", f"{p}-fine"
    await redis_client.set(f"{p}:queue:{broken}", "x")
    a, b = make_task(p, "a", [1], broken), make_task(p, "b", [2], fine)
    results = await target.enqueue([a, b], SLOT)
    assert [r.status for r in results] == ["failed", "enqueued"]
    assert results[0].permanent  # someone else's key: no retry mends it
    assert "WRONGTYPE" in (results[0].error or "") and "not a list" in (results[0].error or "")
    assert await redis_client.exists(f"{p}:claim:{a.idempotency_key}", f"{p}:job:{a.id}") == 0
    assert await redis_client.lrange(f"{p}:queue:{fine}", 0, -1) == [b.id]


async def test_redis_down_is_a_target_error_and_ping_fails(redis_prefix: str) -> None:
    target = RqTarget.from_url("redis://127.0.0.1:1/15", prefix=redis_prefix, timeout=1)
    try:
        with pytest.raises(TargetError, match="rq: redis"):
            await target.enqueue([make_task(redis_prefix, "x", [1], "q")], SLOT)
        with pytest.raises(Exception):  # noqa: B017 - any failure of the readiness check
            await target.ping()
    finally:
        await target.close()


async def test_ping_and_sentinel(
    target: RqTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    await target.ping()
    assert await target.forgotten() == []
    await redis_client.delete(f"{redis_prefix}:sentinel")  # the Redis "lost its data"
    assert await target.forgotten() == ["rq"]


def test_settings_build_the_rq_target(
    monkeypatch: pytest.MonkeyPatch, sqlite_url: str, redis_url: str
) -> None:
    monkeypatch.setenv("PM_TARGET", "rq")
    monkeypatch.setenv("PM_RQ_REDIS_URL", "redis://:secret@127.0.0.1:6379/4")
    settings = Settings(database_url=sqlite_url, redis_url=redis_url)
    assert settings.target == "rq" and settings.rq_redis_url is not None
    target = build_target(settings, engine=None)  # type: ignore[arg-type]
    assert isinstance(target, RqTarget)
    assert target.client.connection_pool.connection_kwargs["db"] == 4
    assert describe_targets(settings) == "rq (redis://:***@127.0.0.1:6379/4)"
    assert "rq" not in settings.configured_targets().no_completion  # overlap: RQ's job status


def test_a_missing_rq_names_the_extra(monkeypatch: pytest.MonkeyPatch, sqlite_url: str) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "rq" else real(name, *a)
    )
    with pytest.raises(ValueError, match=r"pip install 'periodic-manager\[rq\]'"):
        Settings(database_url=sqlite_url, target="rq")


# -- options.overlap: RQ's job status --------------------------------------------------------------


def overlap_task(prefix: str, n: int, queue: str, policy: str = "hold") -> Task:
    at = SLOT + timedelta(minutes=n)
    key = f"{prefix}.ov:{at.isoformat()}"
    return Task(
        id=task_id_for(key),
        name=f"{prefix}.ov",
        task_type=f"{FUNC}.record",
        payload=[n],
        queue=queue,
        options={"queue": queue, "overlap": policy},
        idempotency_key=key,
        scheduled_at=at,
        expires_at=at + timedelta(seconds=30),
    )


def outcome(results: list[Any]) -> list[tuple[str, str | None]]:
    return [(r.status, None if r.previous is None else r.previous.state) for r in results]


async def test_overlap_reads_rqs_job_status(
    target: RqTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    p, queue = redis_prefix, f"{redis_prefix}-q"
    first = overlap_task(p, 0, queue)
    assert outcome(await target.enqueue([first], first.scheduled_at)) == [("enqueued", "none")]
    prev = await redis_client.get(f"{p}:prev:{first.name}")
    assert prev is not None and prev.startswith(first.id) and prev.endswith("|1")
    job = f"{p}:job:{first.id}"
    second = overlap_task(p, 1, queue)
    now = second.scheduled_at
    assert outcome(await target.enqueue([second], now)) == [("busy", "queued")]
    for status, state in [("started", "running"), ("scheduled", "queued"), ("deferred", "queued")]:
        await redis_client.hset(job, "status", status)
        assert outcome(await target.enqueue([second], now)) == [("busy", state)]
    await redis_client.hset(job, "status", "failed")  # done, without success: finished
    assert outcome(await target.enqueue([second], now)) == [("enqueued", "finished")]
    assert [r.status for r in await target.enqueue([second], now)] == ["duplicate"]
    # A job RQ no longer holds (its hash expired after its result_ttl) is finished too.
    third = overlap_task(p, 2, queue, "skip")
    await redis_client.delete(f"{p}:job:{second.id}")
    assert outcome(await target.enqueue([third], third.scheduled_at)) == [("enqueued", "finished")]
    assert await redis_client.lrange(f"{p}:queue:{queue}", 0, -1) == [first.id, second.id, third.id]


async def test_overlap_a_previous_key_of_another_type_fails_its_task_alone(
    target: RqTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    p, queue = redis_prefix, f"{redis_prefix}-q"
    task = overlap_task(p, 0, queue)
    other = make_task(p, "plain", [1], queue)
    await redis_client.rpush(f"{p}:prev:{task.name}", "x")
    # The read (MGET) answers nil for a list: the script's own check finds the type.
    results = await target.enqueue([task, other], task.scheduled_at)
    assert [r.status for r in results] == ["failed", "enqueued"]
    assert "another Redis type" in (results[0].error or "")
    assert await redis_client.exists(f"{p}:claim:{task.idempotency_key}", f"{p}:job:{task.id}") == 0


async def test_overlap_concurrent_managers_never_both_find_a_schedule_free(
    redis_url: str, redis_prefix: str, redis_client: aioredis.Redis
) -> None:
    p, queue = redis_prefix, f"{redis_prefix}-q"
    targets = [RqTarget.from_url(redis_url, prefix=p, key_prefix=p) for _ in range(6)]
    tasks = [overlap_task(p, n, queue) for n in range(6)]
    try:
        replies = await asyncio.gather(
            *(t.enqueue([tk], tk.scheduled_at) for t, tk in zip(targets, tasks, strict=True))
        )
    finally:
        for t in targets:
            await t.close()
    assert sorted(r[0].status for r in replies) == ["busy"] * 5 + ["enqueued"]
    assert await redis_client.llen(f"{p}:queue:{queue}") == 1


async def test_overlap_skip_with_a_real_rq_worker(
    target: RqTarget,
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
    tmp_path: Path,
) -> None:
    p, queue = redis_prefix, f"{redis_prefix}-q"
    t0, t1, t2 = (overlap_task(p, n, queue, "skip") for n in range(3))
    assert outcome(await target.enqueue([t0], t0.scheduled_at)) == [("enqueued", "none")]
    assert outcome(await target.enqueue([t1], t1.scheduled_at)) == [("busy", "queued")]
    rq_burst(p, queue, redis_url, tmp_path / "rq.log")  # runs t0: RQ marks it finished
    assert await redis_client.hget(f"{p}:job:{t0.id}", "status") == "finished"
    assert outcome(await target.enqueue([t2], t2.scheduled_at)) == [("enqueued", "finished")]
    rq_burst(p, queue, redis_url, tmp_path / "rq2.log")
    got = [json.loads(line) for line in await redis_client.lrange(f"{p}:out", 0, -1)]
    assert [(r["id"], r["args"]) for r in got] == [(t0.id, [0]), (t2.id, [2])]
