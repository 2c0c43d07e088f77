"""What a claim must survive between the claim and the message, on the test Redis: a key of
another type where a script reads, a failure after some slots were claimed, a slot that another
publisher holds pending (or that a hand-written value dates in the future).

The rule each test checks is the one of docs/guarantees.md: a claim is never taken for "sent"
without its message, a publish never started frees its claim (so a retry does not report
``resent`` for a task never published), and one bad slot fails alone, not its batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from periodic_manager.contracts import Task
from periodic_manager.errors import TargetError
from periodic_manager.targets.arq import ArqTarget
from periodic_manager.targets.base import task_id_for
from periodic_manager.targets.celery.target import CeleryTarget
from periodic_manager.targets.redis import flags, lua
from tests.support import ROOT

SLOT = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)


def make_task(prefix: str, name: str, queue: str, **options: Any) -> Task:
    key = f"{prefix}.{name}:2024-05-01T12:01:00Z"
    return Task(
        id=task_id_for(key),
        name=f"{prefix}.{name}",
        task_type="pmtest.record",
        payload={"n": name},
        queue=queue,
        options={"queue": queue, **options},
        idempotency_key=key,
        scheduled_at=SLOT,
        expires_at=SLOT + timedelta(seconds=30),
    )


def celery_target(redis_url: str, prefix: str, **kwargs: Any) -> CeleryTarget:
    """A target whose kombu keys carry the test's prefix."""
    config = {"broker_transport_options": {"global_keyprefix": f"{prefix}:"}}
    return CeleryTarget.from_url(redis_url, prefix=prefix, config=config, **kwargs)


@pytest.fixture(params=["direct", "kombu"])
async def celery(
    request: pytest.FixtureRequest, redis_url: str, redis_prefix: str
) -> AsyncIterator[CeleryTarget]:
    """A Celery target on the test Redis, each way out, with a result backend (overlap)."""
    target = celery_target(
        redis_url,
        redis_prefix,
        fast_path=request.param == "direct",
        result_backend=redis_url,
        timeout=1.0,
    )
    assert (target.writer is not None) == (request.param == "direct")
    yield target
    await target.close()


async def queued_ids(client: aioredis.Redis, prefix: str, queue: str) -> list[str]:
    """The task ids of the Celery messages in ``queue`` (kombu's list, oldest first)."""
    raw = await client.lrange(f"{prefix}:{queue}", 0, -1)
    return [json.loads(m)["headers"]["id"] for m in reversed(raw)]


async def claim_of(client: aioredis.Redis, prefix: str, task: Task) -> str | None:
    value = await client.get(f"{prefix}:claim:{task.idempotency_key}")
    return None if value is None else str(value)


# -- one set of flags ------------------------------------------------------------------------


# Every claiming script of every target, found on disk (a new target's script cannot be left out).
SCRIPTS = sorted(
    (".".join(path.parent.parent.relative_to(ROOT).parts), path.name)
    for path in (ROOT / "periodic_manager" / "targets").rglob("*claim*.lua")
)


@pytest.mark.parametrize(("package", "name"), SCRIPTS, ids=[n for _, n in SCRIPTS])
def test_every_claim_script_declares_the_flags_of_flags_py(package: str, name: str) -> None:
    line = re.search(r"^local ([A-Z, ]+) = ([0-9, ]+)$", lua.script(package, name), re.M)
    assert line is not None, f"{name} declares no flags"
    names = [n.strip() for n in line.group(1).split(",")]
    values = [int(v) for v in line.group(2).split(",")]
    assert {n: getattr(flags, n) for n in names} == dict(zip(names, values, strict=True))


# -- a key of another type: that slot fails alone, no claim without its message ----------------


async def test_celery_a_key_of_another_type_fails_its_task_alone_and_leaves_no_claim_without_message(
    celery: CeleryTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    queue = f"{redis_prefix}.q"
    plain = [make_task(redis_prefix, f"p{i}", queue) for i in range(3)]
    after = [make_task(redis_prefix, f"o{i}", queue, overlap="skip") for i in range(2)]
    # The second plain slot's claim key and the second overlap schedule's previous-task key
    # hold hashes (written by hand, or by another program sharing the Redis).
    await redis_client.hset(f"{redis_prefix}:claim:{plain[1].idempotency_key}", "x", "1")
    await redis_client.hset(f"{redis_prefix}:prev:{after[1].name}", "x", "1")
    tasks = [*plain, *after]
    try:
        first = await celery.enqueue(tasks, SLOT)
        assert [r.status for r in first] == ["enqueued", "failed", "enqueued", "enqueued", "failed"]
        assert "another Redis type" in (first[1].error or "")
        assert "another Redis type" in (first[4].error or "")
        sent = [plain[0], plain[2], after[0]]
        assert sorted(await queued_ids(redis_client, redis_prefix, queue)) == sorted(
            t.id for t in sent
        )
        # Every claim that says sent has its message; the failed slots hold none of ours.
        for t in sent:
            assert await claim_of(redis_client, redis_prefix, t) == f"s|{t.id}"
        again = await celery.enqueue(tasks, SLOT)
        assert [r.status for r in again] == [
            "duplicate",
            "failed",
            "duplicate",
            "duplicate",
            "failed",
        ]
        assert len(await queued_ids(redis_client, redis_prefix, queue)) == 3
    finally:
        await redis_client.delete(*(f"celery-task-meta-{t.id}" for t in tasks))


@pytest.fixture
def arq(arq_target: ArqTarget) -> ArqTarget:
    return arq_target  # tests/targets/conftest.py


async def test_arq_a_previous_job_key_of_another_type_fails_that_job_alone(
    arq: ArqTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    queue = f"{redis_prefix}:arq"
    a, b, c = (make_task(redis_prefix, n, queue, overlap="skip") for n in ("a", "b", "c"))
    arq.made += [a.id, b.id, c.id]  # type: ignore[attr-defined]
    await redis_client.hset(f"{redis_prefix}:prev:{b.name}", "x", "1")
    first = await arq.enqueue([a, b, c], SLOT)
    # a and c were written and claimed in the same script as b: they are queued, and say so.
    assert [r.status for r in first] == ["enqueued", "failed", "enqueued"]
    assert "another Redis type" in (first[1].error or "")
    assert sorted(await redis_client.zrange(queue, 0, -1)) == sorted([a.id, c.id])
    assert [r.status for r in await arq.enqueue([a, b, c], SLOT)] == [
        "duplicate",
        "failed",
        "duplicate",
    ]


async def test_arq_a_queue_of_another_type_fails_its_chunk_and_writes_nothing(
    arq: ArqTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    bad_queue, good_queue = f"{redis_prefix}:bad", f"{redis_prefix}:good"
    bad, good = (
        make_task(redis_prefix, "bad", bad_queue),
        make_task(redis_prefix, "good", good_queue),
    )
    arq.made += [bad.id, good.id]  # type: ignore[attr-defined]
    await redis_client.set(bad_queue, "not a sorted set")
    results = await arq.enqueue([bad, good], SLOT)
    assert [r.status for r in results] == ["failed", "enqueued"]
    assert "WRONGTYPE" in (results[0].error or "") and "sorted set" in (results[0].error or "")
    assert await claim_of(redis_client, redis_prefix, bad) is None
    assert await redis_client.exists(f"arq:job:{bad.id}") == 0


@pytest.fixture
async def kombu(redis_url: str, redis_prefix: str) -> AsyncIterator[CeleryTarget]:
    target = celery_target(
        redis_url, redis_prefix, fast_path=False, result_backend=redis_url, timeout=1.0
    )
    assert target.writer is None and target.previous is not None
    yield target
    await target.close()


async def test_kombu_a_result_backend_failure_leaves_no_pending_claim_behind(
    kombu: CeleryTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    queue = f"{redis_prefix}.q"
    plain, after = (
        make_task(redis_prefix, "plain", queue),
        make_task(redis_prefix, "after", queue, overlap="skip"),
    )
    await redis_client.set(f"{redis_prefix}:prev:{after.name}", "someid|123|1")
    assert kombu.previous is not None
    real = kombu.previous.oracle

    async def down(ids: Any) -> list[str]:
        raise RuntimeError("result backend down")

    kombu.previous.oracle = down
    with pytest.raises(TargetError, match="result backend down"):
        await kombu.enqueue([plain, after], SLOT)
    assert await claim_of(redis_client, redis_prefix, plain) is None
    assert await queued_ids(redis_client, redis_prefix, queue) == []
    kombu.previous.oracle = real
    # Nothing was published: the retry publishes it for the first time (not "resent").
    again = await kombu.enqueue([plain, after], SLOT)
    assert [r.status for r in again] == ["enqueued", "busy"]  # someid: PENDING, not finished
    assert await queued_ids(redis_client, redis_prefix, queue) == [plain.id]


async def test_kombu_a_publish_that_cannot_start_frees_its_claims_and_previous_keys(
    kombu: CeleryTarget,
    redis_url: str,
    redis_client: aioredis.Redis,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = f"{redis_prefix}.q"
    plain = [make_task(redis_prefix, f"p{i}", queue) for i in range(2)]
    after = make_task(redis_prefix, "after", queue, overlap="skip")
    tasks = [*plain, after]

    # The publishing thread is gone (the target is closing) once the slots are claimed.
    def stopped(messages: Any) -> Any:
        raise RuntimeError("cannot schedule new futures after shutdown")

    monkeypatch.setattr(kombu.kombu.publisher, "start", stopped)
    with pytest.raises(RuntimeError, match="after shutdown"):
        await kombu.enqueue(tasks, SLOT)
    for t in tasks:
        assert await claim_of(redis_client, redis_prefix, t) is None
    assert await redis_client.get(f"{redis_prefix}:prev:{after.name}") is None
    monkeypatch.undo()
    # Nothing was published: another manager sends every slot at once, for the first time.
    other = celery_target(
        redis_url, redis_prefix, fast_path=False, result_backend=redis_url, timeout=1.0
    )
    try:
        again = await other.enqueue(tasks, SLOT)
    finally:
        await other.close()
    assert [r.status for r in again] == ["enqueued", "enqueued", "enqueued"]
    assert sorted(await queued_ids(redis_client, redis_prefix, queue)) == sorted(
        t.id for t in tasks
    )


async def test_kombu_an_abandoned_claim_without_a_ttl_is_taken_again_with_one(
    kombu: CeleryTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    queue = f"{redis_prefix}.q"
    task = make_task(redis_prefix, "ttl", queue)
    key = f"{redis_prefix}:claim:{task.idempotency_key}"
    await redis_client.set(key, f"p|{task.id}|gone|1")  # hand-written: no TTL, long abandoned
    [result] = await kombu.enqueue([task], SLOT)
    assert result.status == "resent"
    assert await claim_of(redis_client, redis_prefix, task) == f"s|{task.id}"
    assert 0 < await redis_client.pttl(key) <= 90_000  # (expires_at - now) + 60 s, at most


# -- a slot another publisher holds pending ---------------------------------------------------------


async def test_a_pending_claim_dated_in_the_future_counts_as_abandoned(
    celery: CeleryTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    queue = f"{redis_prefix}.q"
    tasks = [make_task(redis_prefix, f"s{i}", queue) for i in range(5)]
    held = tasks[2]
    # Another publisher's pending claim, dated far ahead of Redis's clock (a hand-written value,
    # a clock stepped back): it would never grow old enough to be taken over.
    await redis_client.set(
        f"{redis_prefix}:claim:{held.idempotency_key}",
        f"p|{held.id}|other|99999999999999",
        px=60_000,
    )
    results = await celery.enqueue(tasks, SLOT)
    assert [r.status for r in results] == ["enqueued", "enqueued", "resent", "enqueued", "enqueued"]
    assert sorted(await queued_ids(redis_client, redis_prefix, queue)) == sorted(
        t.id for t in tasks
    )
    assert await claim_of(redis_client, redis_prefix, held) == f"s|{held.id}"


@contextlib.asynccontextmanager
async def kept_pending(client: aioredis.Redis, key: str, task_id: str) -> AsyncIterator[None]:
    """Another publisher that keeps ``key`` pending (dated now by Redis's clock) meanwhile."""

    async def write() -> None:
        seconds, micros = await client.time()
        ms = seconds * 1000 + micros // 1000
        await client.set(key, f"p|{task_id}|other|{ms}", px=60_000)

    async def keep() -> None:
        while True:
            await asyncio.sleep(0.05)  # a writer's pace, not a slot
            await write()

    await write()
    keeper = asyncio.ensure_future(keep())
    try:
        yield
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper


async def test_a_slot_held_elsewhere_past_the_wait_fails_alone_and_the_batch_is_sent(
    celery: CeleryTarget, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    queue = f"{redis_prefix}.q"
    tasks = [make_task(redis_prefix, f"h{i}", queue) for i in range(4)]
    held = tasks[1]
    celery.claims.stale_ms = 300  # the wait for a held slot: stale time + 1 s
    key = f"{redis_prefix}:claim:{held.idempotency_key}"
    async with kept_pending(redis_client, key, held.id):
        sending = asyncio.ensure_future(celery.enqueue(tasks, SLOT))
        # The free slots go out at once, while the held one is still waited for.
        for _ in range(100):
            if len(await queued_ids(redis_client, redis_prefix, queue)) == 3 or sending.done():
                break
            await asyncio.sleep(0.02)  # polling the queue, not waiting for a slot
        assert not sending.done() and len(await queued_ids(redis_client, redis_prefix, queue)) == 3
        results = await sending
        still = await redis_client.get(key)
    assert [r.status for r in results] == ["enqueued", "failed", "enqueued", "enqueued"]
    assert "another publisher" in (results[1].error or "")
    assert sorted(await queued_ids(redis_client, redis_prefix, queue)) == sorted(
        t.id for t in tasks if t is not held
    )
    assert still is not None and str(still).startswith("p|") and "|other|" in str(still)


# -- an overlap task's message is built when it is sent ---------------------------------------------


async def test_a_staged_overlap_task_sent_late_keeps_its_expiry_counted_from_the_slot(
    redis_url: str, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    queue = f"{redis_prefix}.q"
    target = celery_target(redis_url, redis_prefix, result_backend=redis_url, timeout=1.0)
    assert target.writer is not None  # written to Redis directly
    plain = make_task(redis_prefix, "plain", queue, extra={"expires": 60})
    after = make_task(redis_prefix, "after", queue, overlap="skip", extra={"expires": 60})
    try:
        prepared = target.prepare([plain, after])  # staged before the slot
        late = SLOT + timedelta(seconds=10)  # sent 10 s after it (a retry, a slow instant)
        results = await target.send(prepared, late)
    finally:
        await target.close()
    assert [r.status for r in results] == ["enqueued", "enqueued"]
    raw = await redis_client.lrange(f"{redis_prefix}:{queue}", 0, -1)
    expires = {m["headers"]["id"]: m["headers"]["expires"] for m in map(json.loads, raw)}
    # Both expire 60 s after the slot, whenever they were sent.
    end = (SLOT + timedelta(seconds=60)).isoformat()
    assert expires == {plain.id: end, after.id: end}
