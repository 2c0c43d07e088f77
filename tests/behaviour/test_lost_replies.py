"""A broker that does not answer: a reply lost on the way back, a Redis SIGKILLed in the middle of
a publish. Nothing is lost, and a publish that may reach the workers twice is counted ``resent``.

Before, arq and Celery through kombu claimed a slot in Redis and published after: when the claim
survived and the message did not, the retry took the claim for "sent" and the slot was lost (100
of 100 tasks of a slot when the claims' reply was dropped). Now arq claims and writes in one
script, and kombu's publishes run under a pending claim that only the broker's confirmation
turns into "sent".

Every fault is real: throwaway ``redis-server`` processes with an append-only file (a SIGKILL
keeps what was written), the machine's RabbitMQ, and a TCP proxy in front of them that drops the
reply to one request or kills the server as a request passes. What arrived is counted on the
broker itself, or by a real worker.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import kombu
import pytest
import redis.asyncio as aioredis
from arq.constants import in_progress_key_prefix

from periodic_manager.contracts import Task
from periodic_manager.errors import TargetError
from periodic_manager.targets import arq as arq_target
from periodic_manager.targets import rq as rq_target
from periodic_manager.targets.arq import ArqTarget
from periodic_manager.targets.celery.target import CeleryTarget
from periodic_manager.targets.redis import claims as claims_module
from periodic_manager.targets.rq import RqTarget
from tests.conftest import amqp_address, amqp_through
from tests.support.celery_arq_rig import WorkerProcess, arq_worker, records, rq_burst, wait_for
from tests.support.faults import SLOT, slot_tasks, until_sent
from tests.support.servers import RedisServer
from tests.support.tcpproxy import TcpProxy

N = 100
ARQ_QUEUE = "pmlost:arq"
RQ_QUEUE = "pmlost-rq"
RQ_RECORD = "tests.support.rq_worker_app.record"


def sha(script: str) -> bytes:
    return hashlib.sha1(script.encode()).hexdigest().encode()


def batch(prefix: str, name: str, queue: str, n: int = N) -> list[Task]:
    return slot_tasks(prefix, name, n, queue=queue, task_type="record")


@pytest.fixture
async def proxy(redis_server: RedisServer) -> AsyncIterator[TcpProxy]:
    made = TcpProxy("127.0.0.1", redis_server.port)
    await made.start()
    yield made
    await made.close()


def proxied(proxy: TcpProxy) -> str:
    return f"redis://127.0.0.1:{proxy.port}/0"


# -- arq: claim and job in one script -------------------------------------------------------------


@pytest.fixture
def arq_run(redis_server: RedisServer, tmp_path: Path) -> Iterator[WorkerProcess]:
    """A real arq worker on the throwaway server (straight, not through the proxy)."""
    worker = arq_worker("pmlost", ARQ_QUEUE, tmp_path / "arq.log", redis_server.url)
    worker.start()
    yield worker
    worker.stop()


async def ran_once(redis_server: RedisServer, worker: WorkerProcess, tasks: list[Task]) -> None:
    client = aioredis.from_url(redis_server.url)
    try:

        async def all_ran() -> bool:
            return len(await records(client, "pmlost")) >= len(tasks)

        async def idle() -> bool:
            # Nothing queued (a job stays in the queue until done, a retry goes back in) and
            # nothing running: no job can run again, so the count below is final.
            queued = await client.zcard(ARQ_QUEUE)
            running = [k async for k in client.scan_iter(match=f"{in_progress_key_prefix}*")]
            return queued == 0 and not running

        await wait_for(all_ran, f"{len(tasks)} jobs run", worker)
        idle_is = f"the arq worker idle: {ARQ_QUEUE} empty, no {in_progress_key_prefix}* key"
        await wait_for(idle, idle_is, worker)
        runs = Counter(r["id"] for r in await records(client, "pmlost"))
    finally:
        await client.aclose()
    assert runs == Counter({t.id: 1 for t in tasks})


async def test_arq_a_lost_reply_to_the_claim_loses_no_job(
    redis_server: RedisServer, proxy: TcpProxy, arq_run: WorkerProcess
) -> None:
    target = ArqTarget.from_url(proxied(proxy), prefix="pmlost", timeout=1.0)
    tasks = batch("pmlost", "a", ARQ_QUEUE)
    try:
        await target.enqueue(batch("pmlost", "warm", ARQ_QUEUE, 1), SLOT)  # scripts loaded
        proxy.drop_reply(sha(arq_target.CLAIM_AND_WRITE))
        with pytest.raises(TargetError):
            await target.enqueue(tasks, SLOT)
        assert proxy.dropped == 1
        again = await until_sent(target, tasks)
    finally:
        await target.close()
    # Claimed and written together: the retry finds both, and reports what happened.
    assert {r.status for r in again} == {"duplicate"}
    await ran_once(redis_server, arq_run, batch("pmlost", "warm", ARQ_QUEUE, 1) + tasks)


async def test_arq_redis_killed_as_the_jobs_are_written_loses_no_job(
    redis_server: RedisServer, proxy: TcpProxy, arq_run: WorkerProcess
) -> None:
    target = ArqTarget.from_url(proxied(proxy), prefix="pmlost", timeout=1.0)
    tasks = batch("pmlost", "k", ARQ_QUEUE)
    try:
        await target.enqueue(batch("pmlost", "warm", ARQ_QUEUE, 1), SLOT)
        proxy.on_request(sha(arq_target.CLAIM_AND_WRITE), redis_server.kill, after=True)
        with pytest.raises(TargetError):
            await target.enqueue(tasks, SLOT)
        redis_server.start()  # same port, same append-only file
        again = await until_sent(target, tasks)
    finally:
        await target.close()
    statuses = Counter(r.status for r in again)
    assert set(statuses) <= {"enqueued", "duplicate"}  # the kill came before or after the script
    arq_run.stop()  # the server was killed under it: a fresh worker takes the queue
    arq_run.start()
    await ran_once(redis_server, arq_run, batch("pmlost", "warm", ARQ_QUEUE, 1) + tasks)


# -- RQ: claim and job in one script --------------------------------------------------------------


def rq_batch(name: str, n: int = N) -> list[Task]:
    return slot_tasks("pmlost", name, n, queue=RQ_QUEUE, task_type=RQ_RECORD)


async def rq_ran_once(redis_server: RedisServer, tasks: list[Task], log: Path) -> None:
    """A real ``rq worker --burst`` empties the queue; each job ran exactly once."""
    rq_burst("pmlost", RQ_QUEUE, redis_server.url, log)
    client = aioredis.from_url(redis_server.url)
    try:
        runs = Counter(r["id"] for r in await records(client, "pmlost"))
        left = await client.llen(f"pmlost:queue:{RQ_QUEUE}")
    finally:
        await client.aclose()
    assert left == 0
    assert runs == Counter({t.id: 1 for t in tasks})


async def test_rq_a_lost_reply_to_the_claim_loses_no_job(
    redis_server: RedisServer, proxy: TcpProxy, tmp_path: Path
) -> None:
    target = RqTarget.from_url(proxied(proxy), prefix="pmlost", key_prefix="pmlost", timeout=1.0)
    warm, tasks = rq_batch("warm", 1), rq_batch("a")
    try:
        await target.enqueue(warm, SLOT)  # scripts loaded
        proxy.drop_reply(sha(rq_target.CLAIM_AND_ENQUEUE))
        with pytest.raises(TargetError):
            await target.enqueue(tasks, SLOT)
        assert proxy.dropped == 1
        again = await until_sent(target, tasks)
    finally:
        await target.close()
    assert {r.status for r in again} == {"duplicate"}  # claimed and written together
    await rq_ran_once(redis_server, warm + tasks, tmp_path / "rq.log")


async def test_rq_redis_killed_as_the_jobs_are_written_loses_no_job(
    redis_server: RedisServer, proxy: TcpProxy, tmp_path: Path
) -> None:
    target = RqTarget.from_url(proxied(proxy), prefix="pmlost", key_prefix="pmlost", timeout=1.0)
    warm, tasks = rq_batch("warm", 1), rq_batch("k")
    try:
        await target.enqueue(warm, SLOT)
        proxy.on_request(sha(rq_target.CLAIM_AND_ENQUEUE), redis_server.kill, after=True)
        with pytest.raises(TargetError):
            await target.enqueue(tasks, SLOT)
        redis_server.start()  # same port, same append-only file
        again = await until_sent(target, tasks)
    finally:
        await target.close()
    assert set(Counter(r.status for r in again)) <= {"enqueued", "duplicate"}
    await rq_ran_once(redis_server, warm + tasks, tmp_path / "rq.log")


# -- Celery through kombu: pending claims, re-published with the same task id ------------------


async def messages_in(redis_server: RedisServer, queue: str) -> Counter[str]:
    client = aioredis.from_url(redis_server.url)
    try:
        raw = await client.lrange(queue, 0, -1)
    finally:
        await client.aclose()
    return Counter(json.loads(m)["headers"]["id"] for m in raw)


async def test_celery_kombu_a_lost_reply_to_the_claims_loses_no_task_and_counts_the_resend(
    redis_server: RedisServer, proxy: TcpProxy
) -> None:
    target = CeleryTarget.from_url(proxied(proxy), prefix="pmlost", timeout=1.0, fast_path=False)
    assert target.writer is None  # kombu's way
    tasks = batch("pmlost", "c", "pmlost.q")
    try:
        await target.enqueue(batch("pmlost", "warm", "pmlost.q", 1), SLOT)
        proxy.drop_reply(sha(claims_module.CLAIM))
        with pytest.raises(TargetError):
            await target.enqueue(tasks, SLOT)
        assert proxy.dropped == 1
        again = await until_sent(target, tasks)
    finally:
        await target.close()
    # The claims were taken, pending; nothing was published: the retry publishes every task,
    # and says it may be twice (it cannot know the first attempt published nothing).
    assert {r.status for r in again} == {"resent"}
    copies = await messages_in(redis_server, "pmlost.q")
    assert all(copies[t.id] == 1 for t in tasks), copies.most_common(3)


async def test_celery_kombu_redis_killed_mid_publish_loses_no_task(
    redis_server: RedisServer, proxy: TcpProxy
) -> None:
    target = CeleryTarget.from_url(proxied(proxy), prefix="pmlost", timeout=1.0, fast_path=False)
    tasks = batch("pmlost", "m", "pmlost.q")
    try:
        await target.enqueue(batch("pmlost", "warm", "pmlost.q", 1), SLOT)
        # The claims are written; the server dies as the first message is pushed.
        proxy.on_request(b"LPUSH", redis_server.kill)
        with pytest.raises(TargetError):
            await target.enqueue(tasks, SLOT)
        redis_server.start()
        again = await until_sent(target, tasks)
    finally:
        await target.close()
    # The claims of the messages never started could not be freed (Redis was down): they are
    # re-published as well, and say so. Each arrived once.
    assert {r.status for r in again} <= {"enqueued", "resent"}
    copies = await messages_in(redis_server, "pmlost.q")
    assert all(copies[t.id] == 1 for t in tasks), copies.most_common(3)


# -- Celery on RabbitMQ: publisher confirms -----------------------------------------------------


@pytest.fixture
def amqp_queue(amqp_url: str) -> Iterator[str]:
    """A queue name of the test's own on the test RabbitMQ (``amqp_url``), deleted afterwards."""
    name = f"pmlost.{uuid.uuid4().hex[:10]}"
    yield name
    with kombu.Connection(amqp_url, connect_timeout=3) as conn:
        channel = conn.channel()
        channel.queue_delete(name)
        channel.exchange_delete(name)


def amqp_messages(url: str, queue: str) -> Counter[str]:
    copies: Counter[str] = Counter()
    with kombu.Connection(url, connect_timeout=3) as conn:
        channel = conn.channel()
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            copies[message.headers["id"]] += 1
    return copies


async def test_celery_amqp_a_lost_reply_to_the_claims_loses_no_task(
    amqp_url: str, amqp_queue: str, proxy: TcpProxy
) -> None:
    target = CeleryTarget.from_url(
        amqp_url, claims_url=proxied(proxy), prefix="pmlost", timeout=2.0
    )
    tasks = batch("pmlost", "r", amqp_queue)
    try:
        await target.enqueue(batch("pmlost", "warm", amqp_queue, 1), SLOT)
        proxy.drop_reply(sha(claims_module.CLAIM))
        with pytest.raises(TargetError):
            await target.enqueue(tasks, SLOT)
        again = await until_sent(target, tasks)
    finally:
        await target.close()
    assert {r.status for r in again} == {"resent"}
    copies = await asyncio.to_thread(amqp_messages, amqp_url, amqp_queue)
    assert all(copies[t.id] == 1 for t in tasks), copies.most_common(3)


async def test_celery_amqp_a_lost_confirmation_is_published_again_and_counted(
    amqp_url: str, amqp_queue: str, redis_server: RedisServer
) -> None:
    """The broker took the message, its confirmation never came back: the claim stays pending,
    the retry publishes the task again with the same id. The workers see it twice, and the
    result says so (resent): the one case a duplicate may reach them, never a loss."""
    rabbit = TcpProxy(*amqp_address())
    await rabbit.start()
    target = CeleryTarget.from_url(
        amqp_through(rabbit.port), claims_url=redis_server.url, prefix="pmlost", timeout=2.0
    )
    tasks = batch("pmlost", "n", amqp_queue, 3)
    try:
        await target.enqueue(batch("pmlost", "warm", amqp_queue, 1), SLOT)  # connected, declared
        rabbit.drop_reply(tasks[1].id.encode())  # the second message's confirmation is lost
        with pytest.raises(TargetError, match=r"published 1 of 3 task\(s\) \(1 unconfirmed"):
            await target.enqueue(tasks, SLOT)
        again = await until_sent(target, tasks)
    finally:
        await target.close()
        await rabbit.close()
    assert [r.status for r in again] == ["duplicate", "resent", "enqueued"]
    copies = await asyncio.to_thread(amqp_messages, amqp_url, amqp_queue)
    assert [copies[t.id] for t in tasks] == [1, 2, 1]


async def test_a_resend_is_in_the_run_history_and_the_metrics(
    redis_server: RedisServer, proxy: TcpProxy
) -> None:
    from prometheus_client import generate_latest

    from periodic_manager.clock import VirtualClock
    from periodic_manager.providers import StaticProvider
    from periodic_manager.runtime.manager import PeriodicTaskManager
    from periodic_manager.runtime.memory_store import MemoryRuntimeStore
    from periodic_manager.schedules.definition import PeriodicTaskConfig

    t0 = datetime(2024, 5, 1, 12, 0, 0, 500000, tzinfo=UTC)
    clock, store = VirtualClock(t0), MemoryRuntimeStore()
    target = CeleryTarget.from_url(proxied(proxy), prefix="pmlost", timeout=1.0, fast_path=False)
    configs = [
        PeriodicTaskConfig.create(
            name=f"pmlost.s{i}",
            spec="@every 1s",
            task_type="record",
            schedule_id=i,
            options={"queue": "pmlost.q"},
        )
        for i in range(10)
    ]
    manager = PeriodicTaskManager(
        StaticProvider(configs), target, clock=clock, store=store, close_target=True
    )
    await manager.start()
    try:
        await clock.advance(1, settle=lambda: manager.wait_settled(clock.now()))
        proxy.drop_reply(sha(claims_module.CLAIM))
        await clock.advance(1, settle=lambda: manager.wait_settled(clock.now()))
        await clock.advance(1, settle=lambda: manager.wait_settled(clock.now()))
    finally:
        await manager.stop()
    by_slot = Counter((r.slot.second, r.status) for r in store.runs)
    assert by_slot == Counter({(1, "enqueued"): 10, (2, "resent"): 10, (3, "enqueued"): 10})
    assert all(s.counts.get("resent") == 1 for s in store.state.values())
    text = generate_latest(manager.metrics.registry).decode()
    assert (
        'periodic_manager_slots_total{queue="pmlost.q",status="resent",target="celery"} 10.0'
        in text
    )
    copies = await messages_in(redis_server, "pmlost.q")
    assert sorted(set(copies.values())) == [1] and len(copies) == 30


# -- Dramatiq on Redis: claim and message in one script ------------------------------------------


async def dramatiq_queued(redis_server: RedisServer, queue: str) -> tuple[Counter[str], int]:
    """The message ids on Dramatiq's list of ``queue`` (namespace pmlost), and its hash's size."""
    client = aioredis.from_url(redis_server.url, decode_responses=True)
    try:
        ids = await client.lrange(f"pmlost:{queue}", 0, -1)
        return Counter(ids), int(await client.hlen(f"pmlost:{queue}.msgs"))
    finally:
        await client.aclose()


@pytest.mark.parametrize("fault", ["reply lost", "redis killed"])
async def test_dramatiq_a_lost_reply_or_a_killed_redis_loses_no_message(
    fault: str, redis_server: RedisServer, proxy: TcpProxy
) -> None:
    from periodic_manager.targets import dramatiq as dramatiq_target

    target = dramatiq_target.DramatiqTarget.from_url(
        proxied(proxy), prefix="pmlost", namespace="pmlost", timeout=1.0
    )
    tasks = batch("pmlost", "d", "dq")
    try:
        await target.enqueue(batch("pmlost", "warm", "dq", 1), SLOT)  # script loaded
        script = sha(dramatiq_target.CLAIM_AND_ENQUEUE)
        if fault == "reply lost":
            proxy.drop_reply(script)
        else:
            proxy.on_request(script, redis_server.kill, after=True)
        with pytest.raises(TargetError):
            await target.enqueue(tasks, SLOT)
        if fault == "redis killed":
            redis_server.start()  # same port, same append-only file
        else:
            assert proxy.dropped == 1
        again = await until_sent(target, tasks)
    finally:
        await target.close()
    statuses = Counter(r.status for r in again)
    # Claimed and written together: the retry finds both (or, killed before the script, neither).
    assert set(statuses) <= ({"duplicate"} if fault == "reply lost" else {"enqueued", "duplicate"})
    ids, stored = await dramatiq_queued(redis_server, "dq")
    assert ids == Counter({t.id: 1 for t in batch("pmlost", "warm", "dq", 1) + tasks})
    assert stored == N + 1
