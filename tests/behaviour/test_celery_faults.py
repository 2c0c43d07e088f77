"""The Celery target against a broker that stops answering (a throwaway redis-server, frozen with
SIGSTOP: connections are accepted, nothing is answered), and against a healthy broker under a
burst published through kombu.

Outcomes are asserted, never durations: which batch failed, how many of its tasks count as
published, which claims remain, what reached the queue.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.asyncio as aioredis

from periodic_manager.contracts import Task
from periodic_manager.errors import TargetError
from periodic_manager.targets.celery.target import CeleryTarget
from tests.support.faults import SLOT, slot_tasks, until_sent
from tests.support.servers import RedisServer

TIMEOUT = 0.5


async def claimed(client: aioredis.Redis, prefix: str, batch: list[Task]) -> list[int]:
    return [await client.exists(f"{prefix}:claim:{t.idempotency_key}") for t in batch]


async def test_a_stuck_broker_fails_the_batch_in_flight_and_the_one_queued_behind_it(
    redis_server: RedisServer, redis_client: aioredis.Redis, redis_prefix: str, redis_url: str
) -> None:
    # Through kombu (claims in the test Redis): a publish in flight when the broker froze may
    # still land, so its claim stays pending (the retry publishes it again, as resent); no claim
    # is left for anything not started. Each batch gets at most its first message in flight (the
    # one behind starts its first once the transport's own timeout ended the first batch).
    target = CeleryTarget.from_url(
        redis_server.url, claims_url=redis_url, prefix=redis_prefix, timeout=TIMEOUT
    )
    assert target.writer is None  # claims elsewhere than the broker: kombu's path
    first, behind = slot_tasks(redis_prefix, "a", 3), slot_tasks(redis_prefix, "b", 2)
    warm = slot_tasks(redis_prefix, "warm", 1)
    try:
        assert [r.status for r in await target.enqueue(warm, SLOT)] == ["enqueued"]
        redis_server.freeze()
        outcomes = await asyncio.gather(
            target.enqueue(first, SLOT), target.enqueue(behind, SLOT), return_exceptions=True
        )
        pending: list[Task] = []
        for batch, outcome in zip((first, behind), outcomes, strict=True):
            assert isinstance(outcome, TargetError)
            error = str(outcome)
            assert f"published 0 of {len(batch)} task(s)" in error
            # The transport's socket timeout (0.5 s) or the publisher's own bound.
            assert "Timeout reading" in error or "did not answer a publish within 0.5 s" in error
            unconfirmed = f"published 0 of {len(batch)} task(s) (1 unconfirmed" in error
            assert await claimed(redis_client, redis_prefix, batch) == [int(unconfirmed)] + [0] * (
                len(batch) - 1
            )
            pending += batch[:1] if unconfirmed else []
        assert first[0] in pending  # the first publish hit the frozen broker

        redis_server.thaw()
        again = await until_sent(target, first + behind)
        assert [r.status for r in again] == [
            "resent" if t in pending else "enqueued" for t in first + behind
        ]
    finally:
        redis_server.thaw()
        await target.close()
    client = aioredis.from_url(redis_server.url)
    try:
        messages = await client.lrange("q", 0, -1)
    finally:
        await client.aclose()
    copies = {t.id: sum(t.id.encode() in m for m in messages) for t in first + behind}
    # Every task arrived once, but those in flight: the frozen server had taken their requests,
    # and our retry published them again (reported resent: never lost, counted when maybe twice).
    # A message written directly never has this case.
    for task in pending:
        assert copies.pop(task.id) in (1, 2)
    assert set(copies.values()) == {1}


async def test_a_broker_that_stops_answering_fails_a_written_batch_and_no_claim_lacks_its_message(
    redis_server: RedisServer, redis_prefix: str
) -> None:
    # Written directly (claims beside the messages). The request the frozen server had buffered
    # runs when it wakes: a chunk's claims and messages come together or not at all.
    target = CeleryTarget.from_url(redis_server.url, prefix=redis_prefix, timeout=TIMEOUT)
    assert target.writer is not None
    batch = slot_tasks(redis_prefix, "w", 2500)
    client = aioredis.from_url(redis_server.url)
    try:
        redis_server.freeze()
        with pytest.raises(TargetError, match="no answer within 0.5 s"):
            await target.enqueue(batch, SLOT)
        redis_server.thaw()
        again = await until_sent(target, batch)
        assert {r.status for r in again} <= {"enqueued", "duplicate"}
        claims = [k async for k in client.scan_iter(match=f"{redis_prefix}:claim:*", count=1000)]
        messages = await client.lrange("q", 0, -1)
    finally:
        redis_server.thaw()
        await target.close()
        await client.aclose()
    assert len(claims) == len(batch) == len(messages)
    assert sorted(m.split(b'"id": "', 1)[1][:36].decode() for m in messages) == sorted(
        t.id for t in batch
    )


async def test_a_healthy_broker_takes_a_10k_burst_through_kombu_without_a_timeout(
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The scheduler hands a 10,000-slot instant over as 4 sub-batches in flight at once; they
    # queue for the one publishing thread for seconds, far longer than the timeout, while no
    # single publish comes near it.
    config = {"broker_transport_options": {"global_keyprefix": f"{redis_prefix}:"}}
    target = CeleryTarget.from_url(
        redis_url, prefix=redis_prefix, config=config, timeout=2.0, fast_path=False
    )
    burst = slot_tasks(redis_prefix, "k", 10_000)
    caplog.set_level(logging.WARNING)
    try:
        outcomes = await asyncio.gather(
            *(target.enqueue(burst[i : i + 2500], SLOT) for i in range(0, 10_000, 2500))
        )
    finally:
        await target.close()
    assert [r.status for results in outcomes for r in results] == ["enqueued"] * 10_000
    assert await redis_client.llen(f"{redis_prefix}:q") == 10_000
    assert not [
        r for r in caplog.records if "answer" in r.getMessage() or "longer than" in r.getMessage()
    ]


async def test_a_flushed_script_cache_is_reloaded_and_a_restarted_broker_is_written_again(
    redis_server: RedisServer, redis_prefix: str
) -> None:
    # A throwaway server: SCRIPT FLUSH on the shared test Redis would disturb other tests. The
    # target's own timeout (not the frozen-broker tests' 0.5 s): here the broker is never slow
    # on purpose (killed, it refuses at once), and a healthy one writing 1,500 tasks (the
    # script reloaded first) took longer than 0.5 s now and then on a loaded machine.
    target = CeleryTarget.from_url(redis_server.url, prefix=redis_prefix)
    client = aioredis.from_url(redis_server.url)
    first, second, third = (slot_tasks(redis_prefix, name, 1500) for name in ("f", "s", "t"))
    try:
        assert {r.status for r in await target.enqueue(first, SLOT)} == {"enqueued"}
        await client.script_flush()
        assert {r.status for r in await target.enqueue(second, SLOT)} == {"enqueued"}
        redis_server.kill()
        with pytest.raises(TargetError, match="celery: redis"):
            await target.enqueue(third, SLOT)
        redis_server.start()  # same port and data (append-only file)
        again = await until_sent(target, first + third)
        assert [r.status for r in again] == ["duplicate"] * 1500 + ["enqueued"] * 1500
        assert await client.llen("q") == 4500
    finally:
        await target.close()
        await client.aclose()
