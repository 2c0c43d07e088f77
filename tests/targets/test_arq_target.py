"""The arq target against a real arq worker (a subprocess on the test Redis).

Schedules are created over the API, slots are driven by the managers' virtual clock, and the
worker's functions record what they received (tests/support/arq_worker_app.py). The worker keeps no
results (``keep_result = 0``), so arq forgets a job id once the job ran: the case the manager's own
claim exists for.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from periodic_manager.contracts import Task
from periodic_manager.settings import Settings
from periodic_manager.targets.arq import ArqTarget, arq_call
from periodic_manager.targets.base import task_id_for
from tests.support.celery_arq_rig import (
    Rig,
    WorkerProcess,
    api_rig,
    arq_worker,
    at,
    iso,
    records,
    wait_for,
)


@pytest.fixture
def queue(redis_prefix: str) -> str:
    return f"{redis_prefix}:arq"


@pytest.fixture
async def job_keys(redis_client: aioredis.Redis) -> AsyncIterator[set[str]]:
    """Job ids the test made; arq's keys for them (``arq:job:<id>`` ...) are deleted afterwards."""
    ids: set[str] = set()
    yield ids
    kinds = ("job", "result", "in-progress", "retry")
    keys = [f"arq:{kind}:{job_id}" for job_id in ids for kind in kinds]
    if keys:
        await redis_client.delete(*keys)


@pytest.fixture
def worker(
    redis_client: aioredis.Redis, redis_prefix: str, redis_url: str, queue: str, tmp_path: Path
) -> Iterator[WorkerProcess]:
    proc = arq_worker(redis_prefix, queue, tmp_path / "arq.log", redis_url)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
async def rig(
    worker: WorkerProcess, sqlite_url: str, redis_url: str, redis_prefix: str
) -> AsyncIterator[Rig]:
    settings = Settings(
        database_url=sqlite_url,
        target="arq",
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        sync_interval=30,
        grace=30,
        heartbeat_interval=5,
    )
    async with api_rig(
        sqlite_url, settings, lambda: ArqTarget.from_url(redis_url, prefix=redis_prefix)
    ) as r:
        yield r


async def drained(client: aioredis.Redis, queue: str, ids: set[str]) -> bool:
    """No job waiting in the queue and none running."""
    running = await client.exists(*(f"arq:in-progress:{i}" for i in ids)) if ids else 0
    return await client.zcard(queue) == 0 and running == 0


def _ids(names: list[str], slots: list[datetime]) -> set[str]:
    return {task_id_for(f"{n}:{iso(s)}") for n in names for s in slots}


async def test_worker_runs_every_slot_with_the_payload_mapped_to_arguments(
    rig: Rig,
    worker: WorkerProcess,
    redis_client: aioredis.Redis,
    redis_prefix: str,
    queue: str,
    job_keys: set[str],
) -> None:
    p = redis_prefix
    payloads: dict[str, Any] = {
        f"{p}.kwargs": {"a": 1, "b": [1, 2]},
        f"{p}.args": [1, "two", None],
        f"{p}.scalar": "x",
        f"{p}.none": None,
    }
    for name, payload in payloads.items():
        task_type = "other" if name.endswith("scalar") else "record"
        await rig.create(name=name, task_type=task_type, payload=payload, options={"queue": queue})
    slots = [at(12, 1), at(12, 2)]
    job_keys.update(_ids(list(payloads), slots))

    await rig.advance_to(at(12, 2, 30))

    async def eight() -> bool:
        return len(await records(redis_client, p)) >= 8

    await wait_for(eight, "8 job runs", worker)
    await wait_for(lambda: drained(redis_client, queue, job_keys), "a drained queue", worker)
    got = await records(redis_client, p)
    assert len(got) == 8 and {r["id"] for r in got} == job_keys
    by_id = {r["id"]: r for r in got}
    expected_calls = {
        f"{p}.kwargs": ("record", [], {"a": 1, "b": [1, 2]}),
        f"{p}.args": ("record", [1, "two", None], {}),
        f"{p}.scalar": ("other", ["x"], {}),
        f"{p}.none": ("record", [], {}),
    }
    for name, call in expected_calls.items():
        for slot in slots:
            run = by_id[task_id_for(f"{name}:{iso(slot)}")]
            assert (run["task"], run["args"], run["kwargs"]) == call
            assert run["try"] == 1


async def test_two_managers_run_each_slot_once(
    rig: Rig,
    worker: WorkerProcess,
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
    queue: str,
    job_keys: set[str],
) -> None:
    name = f"{redis_prefix}.twice"
    await rig.create(name=name, task_type="record", payload={"n": 1}, options={"queue": queue})
    await rig.second_manager()
    slots = [at(12, m) for m in (1, 2, 3)]
    job_keys.update(_ids([name], slots))

    await rig.advance_to(at(12, 3, 30))

    async def three() -> bool:
        return len(await records(redis_client, redis_prefix)) >= 3

    await wait_for(three, "3 job runs", worker)
    await wait_for(lambda: drained(redis_client, queue, job_keys), "a drained queue", worker)
    got = await records(redis_client, redis_prefix)
    assert sorted(r["id"] for r in got) == sorted(job_keys)
    counts = [m.scheduler.counts for m in rig.managers]
    assert sum(c["enqueued"] for c in counts) == 3
    assert sum(c["duplicate"] for c in counts) == 3

    # The worker ran the 12:03 job and kept no result, so arq no longer knows its id; within
    # grace a third manager (a restart, a failover) must still not enqueue it again.
    last = slots[-1]
    key = f"{name}:{iso(last)}"
    assert (
        await redis_client.exists(f"arq:job:{task_id_for(key)}", f"arq:result:{task_id_for(key)}")
        == 0
    )
    task = Task(
        id=task_id_for(key),
        name=name,
        task_type="record",
        payload={"n": 1},
        queue=queue,
        options={"queue": queue},
        idempotency_key=key,
        scheduled_at=last,
        expires_at=last + timedelta(seconds=30),
    )
    late = ArqTarget.from_url(redis_url, prefix=redis_prefix)
    try:
        [result] = await late.enqueue([task], last + timedelta(seconds=29))
    finally:
        await late.close()
    assert result.status == "duplicate"
    assert await redis_client.zcard(queue) == 0


async def test_arq_refuses_a_job_id_it_holds_and_reserved_payload_keys_fail_alone(
    redis_client: aioredis.Redis, redis_prefix: str, redis_url: str, job_keys: set[str]
) -> None:
    slot = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
    queue = f"{redis_prefix}:arq"

    def task(name: str, payload: Any) -> Task:
        key = f"{redis_prefix}.{name}:{iso(slot)}"
        job_keys.add(task_id_for(key))
        return Task(
            id=task_id_for(key),
            name=f"{redis_prefix}.{name}",
            task_type="record",
            payload=payload,
            queue=queue,
            options={"queue": queue},
            idempotency_key=key,
            scheduled_at=slot,
            expires_at=slot + timedelta(seconds=30),
        )

    good, bad = task("good", [1]), task("bad", {"_job_id": "mine"})
    target = ArqTarget.from_url(redis_url, prefix=redis_prefix)
    try:
        first = await target.enqueue([good, bad], slot)
        assert [r.status for r in first] == ["enqueued", "failed"]
        assert "_job_id" in (first[1].error or "")
        # With the claim gone (say, expired), arq's own check still refuses the queued job id.
        await redis_client.delete(f"{redis_prefix}:claim:{good.idempotency_key}")
        [again] = await target.enqueue([good], slot)
        assert again.status == "duplicate"
    finally:
        await target.close()
    assert await redis_client.zrange(queue, 0, -1) == [good.id]
    assert await redis_client.exists(f"{redis_prefix}:claim:{bad.idempotency_key}") == 0


def test_options_map_to_enqueue_job_arguments() -> None:
    slot = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
    base: dict[str, Any] = {
        "id": "job-1",
        "name": "n",
        "task_type": "reports.build",
        "payload": {"a": 1},
        "queue": "default",
        "options": {},
        "idempotency_key": "n:2024-05-01T12:01:00Z",
        "scheduled_at": slot,
        "expires_at": slot + timedelta(seconds=30),
    }
    args, kwargs = arq_call(Task(**base), slot)
    assert args == ["reports.build"] and kwargs == {"a": 1, "_job_id": "job-1"}  # arq's queue

    opts = {"queue": "reports", "extra": {"expires": 600}}
    args, kwargs = arq_call(
        Task(**{**base, "payload": [1, 2], "queue": "reports", "options": opts}),
        slot + timedelta(seconds=10),
    )
    assert args == ["reports.build", 1, 2]
    assert kwargs == {
        "_job_id": "job-1",
        "_queue_name": "reports",
        "_expires": timedelta(seconds=590),
    }
