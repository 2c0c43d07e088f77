"""The Celery target against a real Celery worker (a subprocess on the test Redis).

Schedules are created over the API, slots are driven by the managers' virtual clock, and the
worker's tasks record what they received (tests/celery_worker_app.py). Every kombu key of a test
carries its prefix (kombu's ``global_keyprefix``), so tests never share a queue or a binding.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from periodic_manager.errors import TargetError
from periodic_manager.settings import Settings
from periodic_manager.targets.base import Task, task_id_for
from periodic_manager.targets.celery import CeleryTarget
from periodic_manager.targets.claims import RedisClaims
from tests.celery_arq_rig import (
    Rig,
    WorkerProcess,
    api_rig,
    at,
    celery_worker,
    iso,
    records,
    wait_for,
)


def make_target(redis_url: str, prefix: str, **kwargs: Any) -> CeleryTarget:
    """A target whose kombu keys carry the test's prefix, like the worker's."""
    config = {"broker_transport_options": {"global_keyprefix": f"{prefix}:"}}
    return CeleryTarget.from_url(redis_url, prefix=prefix, config=config, **kwargs)


@pytest.fixture
def queue(redis_prefix: str) -> str:
    return f"{redis_prefix}.q"


@pytest.fixture
def worker(
    redis_client: aioredis.Redis, redis_prefix: str, redis_url: str, queue: str, tmp_path: Path
) -> Iterator[WorkerProcess]:
    """A real Celery worker consuming the test's queue and Celery's default queue."""
    proc = celery_worker(redis_prefix, [queue, "celery"], tmp_path / "celery.log", redis_url)
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
        database_url=sqlite_url, target="celery", redis_url=redis_url, stream_prefix=redis_prefix,
        sync_interval=30, grace=30, heartbeat_interval=5,
    )  # fmt: skip
    async with api_rig(sqlite_url, settings, lambda: make_target(redis_url, redis_prefix)) as r:
        yield r


async def drained(client: aioredis.Redis, prefix: str, queues: list[str]) -> bool:
    """Nothing left in the queues and nothing delivered but unacknowledged."""
    waiting = sum([await client.llen(f"{prefix}:{q}") for q in queues])
    return waiting == 0 and await client.hlen(f"{prefix}:unacked") == 0


async def test_worker_runs_every_slot_with_the_payload_mapped_to_arguments(
    rig: Rig, worker: WorkerProcess, redis_client: aioredis.Redis, redis_prefix: str, queue: str
) -> None:
    p = redis_prefix
    await rig.create(
        name=f"{p}.kwargs", task_type="pmtest.record", payload={"a": 1, "b": [1, 2]},
        options={"queue": queue, "timeout": 7, "extra": {"priority": 3, "soft_time_limit": 5}},
    )  # fmt: skip
    await rig.create(
        name=f"{p}.args",
        task_type="pmtest.record",
        payload=[1, "two", None],
        options={"queue": queue},
    )
    await rig.create(
        name=f"{p}.scalar", task_type="pmtest.other", payload="x", options={"queue": queue}
    )
    await rig.create(name=f"{p}.none", task_type="pmtest.record")  # Celery's default queue

    await rig.advance_to(at(12, 2, 30))

    async def eight() -> bool:
        return len(await records(redis_client, p)) >= 8

    await wait_for(eight, "8 task runs", worker)
    await wait_for(lambda: drained(redis_client, p, [queue, "celery"]), "drained queues", worker)
    got = await records(redis_client, p)
    assert len(got) == 8
    runs: dict[str, list[dict[str, Any]]] = {}
    for run in got:
        runs.setdefault(run["periodic_name"], []).append(run)
    for name, items in runs.items():
        assert sorted(r["scheduled_at"] for r in items) == [iso(at(12, 1)), iso(at(12, 2))]
        for r in items:
            key = f"{name}:{r['scheduled_at']}"
            assert r["idempotency_key"] == key and r["id"] == task_id_for(key)

    kwargs_run = runs[f"{p}.kwargs"][0]
    assert kwargs_run["task"] == "pmtest.record"
    assert (kwargs_run["args"], kwargs_run["kwargs"]) == ([], {"a": 1, "b": [1, 2]})
    assert kwargs_run["timelimit"] == [7.0, 5.0] and kwargs_run["priority"] == 3
    assert kwargs_run["routing_key"] == queue
    args_run = runs[f"{p}.args"][0]
    assert (args_run["args"], args_run["kwargs"]) == ([1, "two", None], {})
    scalar_run = runs[f"{p}.scalar"][0]
    assert scalar_run["task"] == "pmtest.other" and scalar_run["args"] == ["x"]
    none_run = runs[f"{p}.none"][0]
    assert (none_run["args"], none_run["kwargs"]) == ([], {})
    assert none_run["routing_key"] == "celery"


async def test_two_managers_run_each_slot_once(
    rig: Rig, worker: WorkerProcess, redis_client: aioredis.Redis, redis_prefix: str, queue: str
) -> None:
    name = f"{redis_prefix}.twice"
    await rig.create(
        name=name, task_type="pmtest.record", payload={"n": 1}, options={"queue": queue}
    )
    await rig.second_manager()

    await rig.advance_to(at(12, 3, 30))

    async def three() -> bool:
        return len(await records(redis_client, redis_prefix)) >= 3

    await wait_for(three, "3 task runs", worker)
    await wait_for(lambda: drained(redis_client, redis_prefix, [queue]), "a drained queue", worker)
    got = await records(redis_client, redis_prefix)
    assert sorted(r["scheduled_at"] for r in got) == [iso(at(12, m)) for m in (1, 2, 3)]
    assert all(r["kwargs"] == {"n": 1} for r in got)
    counts = [m.scheduler.counts for m in rig.managers]
    assert sum(c["enqueued"] for c in counts) == 3
    assert sum(c["duplicate"] for c in counts) == 3


def _task(prefix: str, slot: datetime, **fields: Any) -> Task:
    name = fields.pop("name", f"{prefix}.unit")
    key = f"{name}:{iso(slot)}"
    values: dict[str, Any] = {
        "id": task_id_for(key), "name": name, "task_type": "pmtest.record", "payload": {"a": 1},
        "queue": f"{prefix}.q", "options": {"queue": f"{prefix}.q"}, "idempotency_key": key,
        "scheduled_at": slot, "expires_at": slot + timedelta(seconds=30),
    }  # fmt: skip
    values.update(fields)
    return Task(**values)


async def test_failed_publish_releases_the_claim_and_a_retry_publishes(
    redis_client: aioredis.Redis, redis_prefix: str, redis_url: str
) -> None:
    slot = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
    task = _task(redis_prefix, slot)
    claim = f"{redis_prefix}:claim:{task.idempotency_key}"
    down = CeleryTarget.from_url(
        "redis://127.0.0.1:1/0", claims_url=redis_url, prefix=redis_prefix, timeout=1
    )
    try:
        with pytest.raises(TargetError, match="published 0 of 1"):
            await down.enqueue([task], slot)
    finally:
        await down.close()
    assert await redis_client.exists(claim) == 0  # released: a retry may publish

    up = make_target(redis_url, redis_prefix)
    try:
        bad = _task(
            redis_prefix, slot, name=f"{redis_prefix}.bad", options={"extra": {"priority": 300}}
        )
        first = await up.enqueue([task, bad], slot)
        assert [r.status for r in first] == ["enqueued", "failed"]
        assert first[0].message_id == task.id and "priority" in (first[1].error or "")
        again = await up.enqueue([task], slot + timedelta(seconds=1))
        assert [r.status for r in again] == ["duplicate"]
    finally:
        await up.close()
    assert 29_000 < await redis_client.pttl(claim) <= 90_000  # (expires_at - now) + 60 s margin
    assert await redis_client.exists(f"{redis_prefix}:claim:{bad.idempotency_key}") == 0
    # The one message in the queue is Celery's protocol 2, with the manager's headers.
    [raw] = await redis_client.lrange(f"{redis_prefix}:{redis_prefix}.q", 0, -1)
    message = json.loads(raw)
    headers = message["headers"]
    assert headers["task"] == "pmtest.record" and headers["id"] == task.id
    assert headers["idempotency_key"] == task.idempotency_key
    assert headers["scheduled_at"] == "2024-05-01T12:01:00Z"
    assert headers["periodic_name"] == task.name


class SlowApp:
    """Stands in for a Celery app whose broker takes ``delay`` seconds per publish."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.sent: list[str] = []

    def producer_or_acquire(self) -> Any:
        return contextlib.nullcontext(object())

    def send_task(self, name: str, task_id: str, **_: Any) -> None:
        time.sleep(self.delay)
        self.sent.append(task_id)


async def test_a_slow_broker_stops_the_batch_at_the_timeout_and_releases_unsent_claims(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    slot = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
    tasks = [_task(redis_prefix, slot, name=f"{redis_prefix}.slow{i}") for i in range(3)]
    app = SlowApp(delay=0.3)
    target = CeleryTarget(app, RedisClaims(redis_client, prefix=redis_prefix), timeout=0.2)
    try:
        with pytest.raises(TargetError, match="published 1 of 3"):
            await target.enqueue(tasks, slot)
    finally:
        await target.close()
    assert app.sent == [tasks[0].id]  # the publish under way finished, no other one started
    claims = [await redis_client.exists(f"{redis_prefix}:claim:{t.idempotency_key}") for t in tasks]
    assert claims == [1, 0, 0]
