"""The Celery target against a real Celery worker (a subprocess on the test Redis).

Schedules are created over the API, slots are driven by the managers' virtual clock, and the
worker's tasks record what they received (tests/support/celery_worker_app.py). Every kombu key of a test
carries its prefix (kombu's ``global_keyprefix``), so tests never share a queue or a binding.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from celery import Celery, signals

from periodic_manager.clock import SystemClock
from periodic_manager.contracts import Task
from periodic_manager.errors import TargetError
from periodic_manager.settings import Settings
from periodic_manager.targets.base import task_id_for
from periodic_manager.targets.celery.target import CeleryTarget
from periodic_manager.targets.redis.claims import RedisClaims
from tests.support.celery_arq_rig import (
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


@pytest.fixture(params=["direct", "kombu"])
def path(request: pytest.FixtureRequest) -> str:
    """How the managers' targets send: written to Redis directly, through kombu, or (``mixed``)
    the first manager one way and the next the other."""
    return str(request.param)


@pytest.fixture
async def rig(
    worker: WorkerProcess, sqlite_url: str, redis_url: str, redis_prefix: str, path: str
) -> AsyncIterator[Rig]:
    settings = Settings(
        database_url=sqlite_url,
        target="celery",
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        sync_interval=30,
        grace=30,
        heartbeat_interval=5,
    )
    ways = itertools.cycle([True, False] if path == "mixed" else [path == "direct"])

    def target() -> CeleryTarget:
        made = make_target(redis_url, redis_prefix, fast_path=next(ways))
        assert (made.fast_path_off is None) == (made.writer is not None)
        return made

    async with api_rig(sqlite_url, settings, target) as r:
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
        name=f"{p}.kwargs",
        task_type="pmtest.record",
        payload={"a": 1, "b": [1, 2]},
        options={"queue": queue, "timeout": 7, "extra": {"priority": 3, "soft_time_limit": 5}},
    )
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


@pytest.mark.parametrize("path", ["direct", "kombu", "mixed"])
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
        "id": task_id_for(key),
        "name": name,
        "task_type": "pmtest.record",
        "payload": {"a": 1},
        "queue": f"{prefix}.q",
        "options": {"queue": f"{prefix}.q"},
        "idempotency_key": key,
        "scheduled_at": slot,
        "expires_at": slot + timedelta(seconds=30),
    }
    values.update(fields)
    return Task(**values)


async def test_failed_publish_releases_the_claim_and_a_retry_publishes(
    redis_client: aioredis.Redis, redis_prefix: str, redis_url: str
) -> None:
    slot = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
    task = _task(redis_prefix, slot)
    claim = f"{redis_prefix}:claim:{task.idempotency_key}"
    # Nothing listens: kombu's transport gives up connecting after about 2 s, within the
    # publish timeout, so the refusal is known (a publish still in flight at the timeout would
    # keep its claim pending instead, and the retry would publish it again as resent).
    down = CeleryTarget.from_url(
        "redis://127.0.0.1:1/0", claims_url=redis_url, prefix=redis_prefix, timeout=5
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
    """Stands in for a Celery app whose broker takes ``delay`` seconds per publish (routing is a
    real app's)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.sent: list[str] = []
        self.amqp = Celery("slow", set_as_current=False).amqp

    def producer_or_acquire(self) -> Any:
        return contextlib.nullcontext(object())

    def send_task(self, name: str, task_id: str, **_: Any) -> None:
        time.sleep(self.delay)
        self.sent.append(task_id)


class GatedApp(SlowApp):
    """A broker that takes the first publish and holds the second until ``gate`` opens."""

    def __init__(self) -> None:
        super().__init__(delay=0)
        self.gate = threading.Event()

    def send_task(self, name: str, task_id: str, **kw: Any) -> None:
        if self.sent:
            self.gate.wait(10)
        super().send_task(name, task_id, **kw)


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


async def test_batches_waiting_for_the_publishing_thread_are_not_timed(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    # Four sub-batches of one instant share one publishing thread: together they take 1.2 s,
    # six times the timeout, but no single publish comes near it.
    slot = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
    batches = [
        [_task(redis_prefix, slot, name=f"{redis_prefix}.b{b}t{i}") for i in range(6)]
        for b in range(4)
    ]
    app = SlowApp(delay=0.05)
    target = CeleryTarget(app, RedisClaims(redis_client, prefix=redis_prefix), timeout=0.2)
    try:
        outcomes = await asyncio.gather(*(target.enqueue(b, slot) for b in batches))
    finally:
        await target.close()
    assert [[r.status for r in results] for results in outcomes] == [["enqueued"] * 6] * 4
    assert sorted(app.sent) == sorted(t.id for b in batches for t in b)


async def test_a_burst_runs_every_task_exactly_once_with_its_arguments_headers_and_id(
    worker: WorkerProcess,
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
    queue: str,
) -> None:
    # Two writing targets and one publishing through kombu race for the same 2,400 slots (the
    # writers in chunks of 1,000 over parallel pipelines): every slot reaches the worker once.
    p = redis_prefix
    slot = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
    tasks = [
        _task(
            p, slot, name=f"{p}.burst{i}", payload={"i": i, "s": f"é{i}"}, options={"queue": queue}
        )
        for i in range(2400)
    ]
    targets = [
        make_target(redis_url, p),
        make_target(redis_url, p),
        make_target(redis_url, p, fast_path=False),
    ]
    try:
        outcomes = await asyncio.gather(
            targets[0].enqueue(tasks, slot),
            targets[1].enqueue(tasks[::-1], slot),
            targets[2].enqueue(tasks[:300], slot),
        )
    finally:
        for target in targets:
            await target.close()
    winners: dict[str, int] = {}
    for number, results in enumerate(outcomes):
        for res in results:
            assert res.status in ("enqueued", "duplicate") and res.message_id == res.task.id
            if res.status == "enqueued":
                assert res.task.id not in winners
                winners[res.task.id] = number
    assert len(winners) == len(tasks)

    async def all_ran() -> bool:
        return await redis_client.llen(f"{p}:out") >= len(tasks)

    await wait_for(all_ran, f"{len(tasks)} task runs", worker)
    await wait_for(lambda: drained(redis_client, p, [queue]), "a drained queue", worker)
    got = await records(redis_client, p)
    assert len(got) == len(tasks)
    by_id = {r["id"]: r for r in got}
    assert len(by_id) == len(tasks)  # nothing ran twice
    for t in tasks:
        run = by_id[t.id]
        assert (run["args"], run["kwargs"]) == ([], t.payload)
        assert (run["idempotency_key"], run["periodic_name"]) == (t.idempotency_key, t.name)
        assert run["scheduled_at"] == "2024-05-01T12:01:00Z" and run["routing_key"] == queue


async def test_an_expired_slot_is_discarded_by_the_worker_and_a_live_one_carries_its_expiry(
    worker: WorkerProcess,
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
    queue: str,
) -> None:
    # `expires` is an absolute instant the worker compares with its own clock: this test runs on
    # the system clock (no slot is waited for).
    now = SystemClock().now()
    p = redis_prefix
    late = _task(
        p,
        now - timedelta(seconds=20),
        name=f"{p}.late",
        options={"queue": queue, "extra": {"expires": 5}},
    )
    live = _task(p, now, name=f"{p}.live", options={"queue": queue, "extra": {"expires": 600}})
    target = make_target(redis_url, p)
    try:
        results = await target.enqueue([late, live], now)  # one list: the worker takes `late` first
    finally:
        await target.close()
    assert [r.status for r in results] == ["enqueued", "enqueued"]

    async def live_ran() -> bool:
        return any(r["id"] == live.id for r in await records(redis_client, p))

    await wait_for(live_ran, "the live task", worker)
    await wait_for(lambda: drained(redis_client, p, [queue]), "a drained queue", worker)
    got = await records(redis_client, p)
    assert [r["id"] for r in got] == [live.id]  # the expired one was discarded, not run
    expiry = datetime.fromisoformat(got[0]["expires"])
    assert expiry == now + timedelta(seconds=600)


async def test_publish_signal_receivers_make_the_target_publish_through_kombu(
    redis_client: aioredis.Redis, redis_prefix: str, redis_url: str
) -> None:
    # before_task_publish receivers (tracing, custom headers) run only when kombu publishes.
    seen: list[str] = []

    def receiver(headers: dict[str, Any], **_: Any) -> None:
        seen.append(headers["id"])

    slot = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
    task = _task(redis_prefix, slot)
    target = make_target(redis_url, redis_prefix)
    signals.before_task_publish.connect(receiver, weak=False)
    try:
        assert target.fast_path_off is None
        assert [r.status for r in await target.enqueue([task], slot)] == ["enqueued"]
    finally:
        signals.before_task_publish.disconnect(receiver)
        await target.close()
    assert seen == [task.id]
    assert await redis_client.llen(f"{redis_prefix}:{redis_prefix}.q") == 1


async def test_a_stopping_manager_frees_the_claims_of_tasks_it_never_started_publishing(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    slot = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
    tasks = [_task(redis_prefix, slot, name=f"{redis_prefix}.stop{i}") for i in range(4)]
    app = GatedApp()
    target = CeleryTarget(app, RedisClaims(redis_client, prefix=redis_prefix), timeout=5)
    sending = asyncio.ensure_future(target.enqueue(tasks, slot))
    try:

        async def one_sent() -> bool:
            return len(app.sent) == 1

        await wait_for(one_sent, "the first publish")
        sending.cancel()  # as the scheduler's stop does
        with pytest.raises(asyncio.CancelledError):
            await sending
    finally:
        app.gate.set()
        await target.close()
    # Published, in flight (its outcome unknown): kept. Never started: free for a standby.
    claims = [await redis_client.exists(f"{redis_prefix}:claim:{t.idempotency_key}") for t in tasks]
    assert claims == [1, 1, 0, 0]
