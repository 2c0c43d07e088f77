"""The asynq target against a reference consumer that follows asynq's server protocol on a real
Redis (tests/support/asynq_consumer.py: asynq's dequeue, done, complete, retry and archive steps,
and a protobuf decoder of its own), since no Go toolchain is at hand to run ``asynq.Server``.

asynq's key names are fixed (``asynq:...``, ``asynq:queues``), so these tests run on a private
``redis-server`` of their own, emptied before each test, never on the shared test Redis.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from periodic_manager.contracts import Task
from periodic_manager.errors import ConfigError
from periodic_manager.plugins.task_rules import TaskProblem
from periodic_manager.runtime.assemble import build_target
from periodic_manager.runtime.startup import describe_targets
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.settings import Settings
from periodic_manager.targets.asynq import task_problem
from periodic_manager.targets.asynq.target import NO_RETENTION, AsynqTarget
from periodic_manager.targets.base import task_id_for
from tests.support.asynq_consumer import TASK_MESSAGE, Consumer, decode
from tests.support.servers import RedisServer

SLOT = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
NOW = SLOT.timestamp()


def make_task(name: str, payload: Any = None, *, at: datetime = SLOT, **options: Any) -> Task:
    key = f"{name}:{at.isoformat().replace('+00:00', 'Z')}"
    queue = options.get("queue", "default")
    return Task(
        id=task_id_for(key),
        name=name,
        task_type=options.pop("task_type", "email:digest"),
        payload=payload,
        queue=queue,
        options=options,
        idempotency_key=key,
        scheduled_at=at,
        expires_at=at + timedelta(seconds=30),
    )


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(persist=False) as made:
        yield made


@pytest.fixture
async def client(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    made = aioredis.from_url(server.url)
    await made.flushall()
    yield made
    await made.aclose()


@pytest.fixture
async def target(server: RedisServer, client: aioredis.Redis) -> AsyncIterator[AsynqTarget]:
    made = AsynqTarget.from_url(server.url, prefix="pm")
    yield made
    await made.close()


async def test_every_task_is_written_as_asynq_client_writes_it_and_a_server_runs_each_once(
    target: AsynqTarget, client: aioredis.Redis
) -> None:
    tasks = [
        make_task("digest.object", {"to": "a@example.com", "n": [1, 2]}),
        make_task("digest.string", "plain text"),
        make_task("digest.none", None),
        make_task("digest.array", [1, "two"], queue="mail", max_retry=3, timeout=9.2),
        make_task("digest.deadline", {}, queue="mail", extra={"deadline": 600}),
        make_task("digest.kept", {"k": 1}, extra={"retention": 86400.5}),
    ]
    first = await target.enqueue(tasks, SLOT)
    assert [r.status for r in first] == ["enqueued"] * len(tasks)
    assert [r.message_id for r in first] == [t.idempotency_key for t in tasks]
    assert [r.task for r in first] == tasks  # the callers' own tasks
    assert await client.smembers("asynq:queues") == {b"default", b"mail"}
    for task in tasks:
        fields = await client.hgetall(f"asynq:{{{task.queue}}}:t:{task.idempotency_key}")
        assert fields[b"state"] == b"pending"
        assert int(fields[b"pending_since"]) == round(NOW * 1e9)
        assert set(fields) == {b"msg", b"state", b"pending_since"}

    consumer = Consumer(client)
    got = {m["id"]: m for q in ("default", "mail") for m in await consumer.drain(q, NOW, bool)}
    assert sorted(got) == sorted(t.idempotency_key for t in tasks)  # each once
    common = {"headers": {}, "retried": 0, "error_msg": "", "last_failed_at": 0, "group_key": ""}
    common |= {"unique_key": "", "completed_at": 0, "type": "email:digest"}

    def expected(name: str, payload: bytes, **fields: Any) -> dict[str, Any]:
        out = {**common, "payload": payload, "id": f"{name}:2024-05-01T12:01:00Z"}
        return out | {"queue": "default", "retry": 25, "timeout": 1800, "deadline": 0} | fields

    assert got["digest.object:2024-05-01T12:01:00Z"] == expected(
        "digest.object", b'{"n":[1,2],"to":"a@example.com"}', retention=0
    )
    assert got["digest.string:2024-05-01T12:01:00Z"]["payload"] == b"plain text"
    assert got["digest.none:2024-05-01T12:01:00Z"]["payload"] == b""
    assert got["digest.array:2024-05-01T12:01:00Z"] == expected(
        "digest.array", b'[1,"two"]', queue="mail", retry=3, timeout=10, retention=0
    )
    deadline = got["digest.deadline:2024-05-01T12:01:00Z"]
    assert (deadline["timeout"], deadline["deadline"]) == (0, int(NOW) + 600)
    assert got["digest.kept:2024-05-01T12:01:00Z"]["retention"] == 86401

    # Done: the hashes are gone but the one with a retention, kept completed.
    kept = "asynq:{default}:t:digest.kept:2024-05-01T12:01:00Z"
    assert await client.hget(kept, "state") == b"completed"
    assert await client.zscore("asynq:{default}:completed", "digest.kept:2024-05-01T12:01:00Z")
    assert await client.exists("asynq:{default}:t:digest.object:2024-05-01T12:01:00Z") == 0
    assert await client.get("asynq:{default}:processed") == b"4"

    # The same slot again (a retry, another manager): nothing added, the claim says so.
    again = await target.enqueue(tasks, SLOT + timedelta(seconds=1))
    assert [r.status for r in again] == ["duplicate"] * len(tasks)
    assert await client.llen("asynq:{default}:pending") == 0


async def test_a_task_id_asynq_holds_is_a_duplicate_even_without_our_claim(
    target: AsynqTarget, client: aioredis.Redis
) -> None:
    task = make_task("held", {"a": 1})
    assert (await target.enqueue([task], SLOT))[0].status == "enqueued"
    await client.delete(target.claims.key(task.idempotency_key))  # the claims forgotten
    again = await target.enqueue([task], SLOT)
    assert again[0].status == "duplicate"  # asynq's EXISTS rule: the hash is there
    assert await client.llen("asynq:{default}:pending") == 1
    assert await client.exists(target.claims.key(task.idempotency_key)) == 1  # claimed again


async def test_unique_ttl_takes_asynq_own_lock_which_a_held_lock_refuses_and_done_releases(
    target: AsynqTarget, client: aioredis.Redis
) -> None:
    payload = {"report": "daily"}
    first = make_task("uniq", payload, unique_ttl=90.5)
    assert (await target.enqueue([first], SLOT))[0].status == "enqueued"
    checksum = hashlib.md5(b'{"report":"daily"}').hexdigest()
    lock = f"asynq:{{default}}:unique:email:digest:{checksum}"
    assert await client.get(lock) == first.idempotency_key.encode()
    assert 90 <= await client.ttl(lock) <= 91
    task_key = f"asynq:{{default}}:t:{first.idempotency_key}"
    assert await client.hget(task_key, "unique_key") == lock.encode()
    msg = decode(await client.hget(task_key, "msg"), TASK_MESSAGE)
    assert msg["unique_key"] == lock

    # The next slot while the lock is held: asynq's client would refuse it too.
    second = make_task("uniq", payload, at=SLOT + timedelta(minutes=1), unique_ttl=90.5)
    refused = (await target.enqueue([second], SLOT + timedelta(minutes=1)))[0]
    assert refused.status == "failed" and refused.permanent
    assert "uniqueness lock" in (refused.error or "")
    assert await client.exists(target.claims.key(second.idempotency_key)) == 0  # no claim

    consumer = Consumer(client)
    assert len(await consumer.drain("default", NOW, bool)) == 1
    assert await client.exists(lock) == 0  # the server's done released it
    sent = await target.enqueue([second], SLOT + timedelta(minutes=1, seconds=1))
    assert sent[0].status == "enqueued"


async def test_two_managers_sending_the_same_slots_at_once_make_one_task_each(
    server: RedisServer, target: AsynqTarget, client: aioredis.Redis
) -> None:
    other = AsynqTarget.from_url(server.url, prefix="pm")
    tasks = [make_task(f"pair{i}", {"i": i}) for i in range(200)]
    try:
        a, b = await asyncio.gather(target.enqueue(tasks, SLOT), other.enqueue(tasks, SLOT))
    finally:
        await other.close()
    for ra, rb in zip(a, b, strict=True):
        assert sorted([ra.status, rb.status]) == ["duplicate", "enqueued"]
    taken = await Consumer(client).drain("default", NOW, bool)
    assert sorted(m["id"] for m in taken) == sorted(t.idempotency_key for t in tasks)


async def test_a_pending_list_of_another_type_fails_its_queue_alone(
    target: AsynqTarget, client: aioredis.Redis
) -> None:
    await client.set("asynq:{broken}:pending", "x")
    bad, good = make_task("bad", 1, queue="broken"), make_task("good", 2)
    results = await target.enqueue([bad, good], SLOT)
    assert [r.status for r in results] == ["failed", "enqueued"]
    assert results[0].permanent and "WRONGTYPE" in (results[0].error or "")
    assert await client.exists(target.claims.key(bad.idempotency_key)) == 0


# -- options.overlap and options.pause_after_failures: asynq's task state --------------------------


async def test_overlap_skip_waits_for_asynq_to_finish_the_previous_task(
    target: AsynqTarget, client: aioredis.Redis
) -> None:
    consumer = Consumer(client)
    one = make_task("ov", [1], overlap="skip")
    two = make_task("ov", [2], at=SLOT + timedelta(minutes=1), overlap="skip")
    three = make_task("ov", [3], at=SLOT + timedelta(minutes=2), overlap="skip")
    assert (await target.enqueue([one], SLOT))[0].status == "enqueued"
    busy = (await target.enqueue([two], SLOT + timedelta(minutes=1)))[0]
    assert busy.status == "busy" and busy.previous is not None
    assert (busy.previous.task_id, busy.previous.state) == (one.idempotency_key, "queued")
    msg = await consumer.dequeue("default", NOW)
    assert msg is not None
    running = (await target.enqueue([two], SLOT + timedelta(minutes=1)))[0]
    assert running.status == "busy" and running.previous is not None
    assert running.previous.state == "running"  # asynq's state active
    await consumer.done(msg, NOW)
    sent = (await target.enqueue([three], SLOT + timedelta(minutes=2)))[0]
    assert sent.status == "enqueued" and sent.previous is not None
    assert sent.previous.state == "finished"


async def test_outcomes_read_asynq_states_and_need_a_retention(
    target: AsynqTarget, client: aioredis.Redis
) -> None:
    kept = {"pause_after_failures": 3, "extra": {"retention": 3600}, "max_retry": 1}
    assert target.failure_off({"pause_after_failures": 3}) == NO_RETENTION
    assert target.failure_off(kept) is None
    assert target.completion_off({"overlap": "hold"}) is None
    names = ["ok", "flaky", "broken", "waiting", "gone"]
    tasks = [make_task(n, n, **kept) for n in names]
    await target.enqueue(tasks, SLOT)
    consumer = Consumer(client)
    ok, flaky, broken = [await consumer.dequeue("default", NOW) for _ in range(3)]
    assert ok is not None and flaky is not None and broken is not None
    await consumer.done(ok, NOW)
    assert await consumer.fail(flaky, NOW, "boom") == "retry"
    assert await consumer.fail(broken, NOW, "boom") == "retry"
    await client.zrem("asynq:{default}:retry", broken["id"])  # the retry due: taken again
    await client.hset(f"asynq:{{default}}:t:{broken['id']}", "state", "active")
    await client.lpush("asynq:{default}:active", broken["id"])
    await client.zadd("asynq:{default}:lease", {broken["id"]: NOW + 30})
    again = decode(await client.hget(f"asynq:{{default}}:t:{broken['id']}", "msg"), TASK_MESSAGE)
    assert again["retried"] == 1 and again["error_msg"] == "boom"
    assert await consumer.fail(again, NOW, "boom again") == "archived"
    await client.delete(f"asynq:{{default}}:t:{tasks[4].idempotency_key}")
    outcomes = await target.outcomes(kept, [t.idempotency_key for t in tasks])
    assert outcomes == ["succeeded", "pending", "failed", "pending", "unknown"]


# -- write-time rules and settings ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"deadline": 0}, "options.extra.deadline"),
        ({"deadline": "soon"}, "options.extra.deadline"),
        ({"retention": -1}, "options.extra.retention"),
        ({"retention": 10**9}, "options.extra.retention"),
        ({"retention": True}, "options.extra.retention"),
    ],
)
def test_task_problem_names_a_bad_deadline_or_retention(extra: dict[str, Any], field: str) -> None:
    problem = task_problem("email:digest", "{}", {"extra": extra})
    assert isinstance(problem, TaskProblem) and problem.field == field
    assert "number of seconds" in problem.reason


def test_task_problem_takes_good_options() -> None:
    extra = {"deadline": 60, "retention": 3600.5, "expires": 5}
    assert task_problem("email:digest", '"x"', {"extra": extra, "unique_ttl": 30}) is None
    kept = {"pause_after_failures": 3, "extra": {"retention": 60}}
    assert task_problem("email:digest", "{}", kept) is None


def test_pause_after_failures_without_a_retention_is_refused_when_written(
    monkeypatch: pytest.MonkeyPatch, sqlite_url: str
) -> None:
    problem = task_problem("email:digest", "{}", {"pause_after_failures": 3})
    assert problem == TaskProblem("options.pause_after_failures", NO_RETENTION)
    monkeypatch.setenv("PM_TARGET", "asynq")
    settings = Settings(database_url=sqlite_url)
    with pytest.raises(ConfigError) as err:
        PeriodicTaskConfig.create(
            name="paused.soon",
            spec="@hourly",
            task_type="email:digest",
            options={"pause_after_failures": 3},
            allowed_targets=settings.configured_targets(),
        )
    assert err.value.field == "options.pause_after_failures"
    assert "the asynq target refuses it" in err.value.reason and "retention" in err.value.reason


def test_a_blank_task_type_or_bad_extra_fails_that_task_alone() -> None:
    target = AsynqTarget(aioredis.Redis())
    with pytest.raises(ValueError, match="task_type"):
        target.job(make_task("blank", 1, task_type=" "), SLOT)
    with pytest.raises(ValueError, match=r"options\.extra\.deadline"):
        target.job(make_task("late", 1, extra={"deadline": -5}), SLOT)


def test_settings_build_the_asynq_target(monkeypatch: pytest.MonkeyPatch, sqlite_url: str) -> None:
    monkeypatch.setenv("PM_TARGET", "asynq")
    monkeypatch.setenv("PM_ASYNQ_REDIS_URL", "redis://:secret@127.0.0.1:6379/5")
    settings = Settings(database_url=sqlite_url)
    target = build_target(settings, engine=None)  # type: ignore[arg-type]
    assert isinstance(target, AsynqTarget)
    assert target.client.connection_pool.connection_kwargs["db"] == 5
    assert describe_targets(settings) == "asynq (redis://:***@127.0.0.1:6379/5)"
    assert "asynq" not in settings.configured_targets().no_completion
    monkeypatch.setenv("PM_REDIS_CLUSTER", "true")  # overlap: refused on a cluster, when written
    clustered = Settings(database_url=sqlite_url).configured_targets()
    assert "another slot" in clustered.no_completion["asynq"]


def test_a_missing_protobuf_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, sqlite_url: str
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "google.protobuf" else real(name, *a),
    )
    with pytest.raises(ValueError, match=r"pip install 'periodic-manager\[asynq\]'"):
        Settings(database_url=sqlite_url, target="asynq")
