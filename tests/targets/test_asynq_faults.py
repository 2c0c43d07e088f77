"""The asynq target under the Redis faults the other Redis targets are tested with: the reply to
the claim-and-enqueue script lost on its way back, and the Redis SIGKILLed as the script passes.
Nothing is lost and nothing doubles: a reference consumer of asynq's server protocol
(tests/support/asynq_consumer.py) runs every task exactly once.

Every fault is real: a throwaway ``redis-server`` with an append-only file fsynced at every write
(a SIGKILL keeps what was written) behind a TCP proxy that drops one reply or kills the server.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

from periodic_manager.contracts import Task
from periodic_manager.errors import TargetError
from periodic_manager.targets.asynq import target as asynq_target
from periodic_manager.targets.asynq.target import AsynqTarget
from tests.support.asynq_consumer import Consumer
from tests.support.faults import SLOT, slot_tasks, until_sent
from tests.support.servers import RedisServer
from tests.support.tcpproxy import TcpProxy

N = 100
QUEUE = "critical"


def sha(script: str) -> bytes:
    return hashlib.sha1(script.encode()).hexdigest().encode()


def batch(name: str, n: int = N) -> list[Task]:
    return slot_tasks("pmlost", name, n, queue=QUEUE, task_type="email:send")


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
async def proxy(redis_server: RedisServer) -> AsyncIterator[TcpProxy]:
    made = TcpProxy("127.0.0.1", redis_server.port)
    await made.start()
    yield made
    await made.close()


def proxied(proxy: TcpProxy) -> str:
    return f"redis://127.0.0.1:{proxy.port}/0"


async def ran_once(redis_server: RedisServer, tasks: list[Task]) -> None:
    """The consumer empties the queue (straight, not through the proxy): each task once."""
    client = aioredis.from_url(redis_server.url)
    try:
        taken = await Consumer(client).drain(QUEUE, SLOT.timestamp(), bool)
        left = await client.llen(f"asynq:{{{QUEUE}}}:pending")
    finally:
        await client.aclose()
    assert left == 0
    assert Counter(m["id"] for m in taken) == Counter({t.idempotency_key: 1 for t in tasks})


async def test_a_lost_reply_to_the_claim_loses_no_task_and_doubles_none(
    redis_server: RedisServer, proxy: TcpProxy
) -> None:
    target = AsynqTarget.from_url(proxied(proxy), prefix="pmlost", timeout=1.0)
    warm, tasks = batch("warm", 1), batch("a")
    try:
        await target.enqueue(warm, SLOT)  # the script loaded
        proxy.drop_reply(sha(asynq_target.CLAIM_AND_ENQUEUE))
        with pytest.raises(TargetError):
            await target.enqueue(tasks, SLOT)
        assert proxy.dropped == 1
        again = await until_sent(target, tasks)
    finally:
        await target.close()
    assert {r.status for r in again} == {"duplicate"}  # claimed and written together
    await ran_once(redis_server, warm + tasks)


async def test_redis_killed_as_the_tasks_are_written_loses_no_task(
    redis_server: RedisServer, proxy: TcpProxy
) -> None:
    target = AsynqTarget.from_url(proxied(proxy), prefix="pmlost", timeout=1.0)
    warm, tasks = batch("warm", 1), batch("k")
    try:
        await target.enqueue(warm, SLOT)
        proxy.on_request(sha(asynq_target.CLAIM_AND_ENQUEUE), redis_server.kill, after=True)
        with pytest.raises(TargetError):
            await target.enqueue(tasks, SLOT)
        redis_server.start()  # same port, same append-only file
        again = await until_sent(target, tasks)
    finally:
        await target.close()
    assert set(Counter(r.status for r in again)) <= {"enqueued", "duplicate"}
    await ran_once(redis_server, warm + tasks)
