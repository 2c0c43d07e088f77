"""options.overlap with real workers: the example consumers (Redis Streams, the PostgreSQL outbox),
a real arq worker and a real Celery worker with a Redis result backend.

Every schedule fires every second and its task works 2.5 seconds (2.5 intervals), on a pool of
workers that could run several at once. Two schedulers send the same schedules (two managers
without leader election: the claims keep one of each slot), for a few seconds of real time, then
the test reads when each task started and finished *by the workers' own clocks*:

- ``allow``: executions overlap, as they always did;
- ``skip``: no two executions of the schedule overlap;
- ``hold``: no two overlap, and each one after the first is a slot that was due while the previous
  ran (held), started right after the previous finished (within the hold tick and the worker's
  pick-up delay).

A worker killed mid-task (Redis Streams consumer, arq worker, Celery worker) never finishes it:
with ``overlap_timeout`` the schedule resumes on a fresh worker, with the warning in its history.
An outbox consumer that dies rolls back, and the next consumer takes the row again: there the
schedule resumes without the timeout (tested here with a SIGKILLed consumer; the timeout itself is
tested in test_overlap_targets.py).

The workers are other processes, so this takes real time: every wait is bounded, and the
schedulers hold slots with a short tick (0.2 s) so a held slot is released well before the next
slot is due. Scheduler logic on a virtual clock is in test_overlap_scheduler.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from sqlalchemy import text

from periodic_manager.clock import SystemClock
from periodic_manager.contracts import RunRecord, Target
from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import upgrade
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.schedules.definition import PeriodicTaskConfig, idempotency_key
from periodic_manager.targets.arq import ArqTarget
from periodic_manager.targets.base import task_id_for
from periodic_manager.targets.celery.target import CeleryTarget
from periodic_manager.targets.outbox import OutboxTarget
from periodic_manager.targets.redis.streams import RedisStreamsTarget
from tests.support.celery_arq_rig import ROOT, WorkerProcess, arq_worker, wait_for

POLICIES = ("allow", "skip", "hold")
WORK_S = 2.5  # each task, with schedules firing every second
RUN_S = 7.0  # how long the schedulers send
TICK_S = 0.2  # hold tick of these schedulers
PICKUP_S = 1.0  # a held slot starts at most TICK_S + this after the previous task finished
WAIT_S = 30.0  # bound of every wait for a worker
CONSUMERS = 6  # enough for allow's ~3 concurrent tasks, skip's 1 and hold's 1
GROUP = "workers"
EXAMPLES = ROOT / "examples"


@dataclass(frozen=True)
class Execution:
    policy: str
    slot: datetime
    started: float  # the worker's clock, Unix seconds
    finished: float


def configs(prefix: str, queue: str, task_type: str, **extra: Any) -> list[PeriodicTaskConfig]:
    out = []
    for policy in POLICIES:
        options: dict[str, Any] = {"queue": queue, "overlap": policy, **extra}
        out.append(
            PeriodicTaskConfig.create(
                name=f"{prefix}-{policy}",
                spec="@every 1s",
                task_type=task_type,
                payload={"policy": policy},
                options=options,
            )
        )
    return out


async def send_for(
    make_target: Callable[[], Target], schedules: list[PeriodicTaskConfig], seconds: float
) -> list[RunRecord]:
    """Two schedulers with their own targets send ``schedules`` for ``seconds`` of real time."""
    runs: list[RunRecord] = []

    async def on_runs(batch: Any) -> None:
        runs.extend(batch)

    clock = SystemClock()
    targets = [make_target() for _ in range(2)]
    scheds = [
        Scheduler(t, clock=clock, grace=30, on_runs=on_runs, hold_tick=TICK_S) for t in targets
    ]
    loops = [asyncio.create_task(s.run()) for s in scheds]
    try:
        now = clock.now()
        for sched in scheds:
            for config in schedules:
                sched.register(config, now=now)
        await asyncio.sleep(seconds)  # real workers: real time passes
    finally:
        for sched in scheds:
            sched.stop()
        await asyncio.wait_for(asyncio.gather(*loops), WAIT_S)
        for target in targets:
            await target.close()
    return runs


def enqueued(runs: list[RunRecord]) -> dict[str, tuple[str, datetime]]:
    """task id -> (policy, slot) of every task a scheduler enqueued."""
    out = {}
    for run in runs:
        if run.status == "enqueued":
            policy = run.name.rsplit("-", 1)[1]
            out[task_id_for(idempotency_key(run.name, run.slot))] = (policy, run.slot)
    return out


def check(executions: list[Execution], runs: list[RunRecord]) -> None:
    by_policy = {
        p: sorted((e for e in executions if e.policy == p), key=lambda e: e.started)
        for p in POLICIES
    }
    for policy, done in by_policy.items():
        assert len(done) >= 2, f"{policy}: {done}"
    allow = by_policy["allow"]
    assert any(b.started < a.finished for a, b in pairwise(allow)), "allow must overlap"
    for policy in ("skip", "hold"):
        for a, b in pairwise(by_policy[policy]):
            assert b.started >= a.finished, f"{policy}: {a} overlaps {b}"
    for a, b in pairwise(by_policy["hold"]):
        # Held: due while the previous ran; a slot that fell due within one hold tick after the
        # previous finished (before the tick saw it finish) replaces the held one and is sent then.
        assert b.slot.timestamp() < a.finished + TICK_S, f"hold: {b} is no held slot"
        assert b.started - a.finished <= TICK_S + PICKUP_S, f"hold: {b} started late after {a}"
    reasons = {(r.name.rsplit("-", 1)[1], r.status, r.reason) for r in runs}
    assert ("skip", "skipped", "overlap") in reasons
    assert ("hold", "held", "overlap") in reasons
    # The hold tick sends a held slot once the previous task finished (overlap-released), unless
    # the next slot fell due within that tick: then that one is sent and the held one replaced
    # (checked above: b.slot < a.finished + TICK_S). Which comes first depends on how soon a worker
    # picked the task up, hence on the machine's load: every cycle may go the second way, so the
    # history need not show a release (tested on a virtual clock in test_overlap_scheduler.py).
    # A hold schedule's slot is never sent for any other reason.
    assert all(
        reason in (None, "overlap-released")
        for policy, status, reason in reasons
        if policy == "hold" and status == "enqueued"
    ), reasons
    assert not any(
        policy == "allow" and status in ("skipped", "held") for policy, status, _ in reasons
    )


@asynccontextmanager
async def running(workers: list[WorkerProcess]) -> AsyncIterator[list[WorkerProcess]]:
    for worker in workers:
        worker.start()
    try:
        yield workers
    finally:
        for worker in workers:
            worker.stop()


def printed(workers: list[WorkerProcess]) -> list[dict[str, Any]]:
    """The JSON lines the example consumers printed for finished work."""
    lines = []
    for worker in workers:
        for line in worker.log.read_text(errors="replace").splitlines():
            if line.startswith("{") and "work_finished_at" in line:
                lines.append(json.loads(line))
    return lines


def from_printed(lines: list[dict[str, Any]]) -> list[Execution]:
    def instant(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    return [
        Execution(
            m["name"].rsplit("-", 1)[1],
            instant(m["scheduled_at"]),
            instant(m["work_started_at"]).timestamp(),
            instant(m["work_finished_at"]).timestamp(),
        )
        for m in lines
    ]


# -- Redis Streams: examples/consume_redis.py -------------------------------------------------


def redis_consumer(
    prefix: str, queue: str, name: str, log: Path, redis_url: str, work_s: float
) -> WorkerProcess:
    return WorkerProcess(
        [
            sys.executable,
            str(EXAMPLES / "consume_redis.py"),
            "--redis-url",
            redis_url,
            "--queue",
            queue,
            "--group",
            GROUP,
            "--consumer",
            name,
            "--prefix",
            prefix,
            "--work-s",
            str(work_s),
            "--block-ms",
            "200",
        ],
        {},
        log,
    )


async def test_redis_streams_consumers(
    redis_client: aioredis.Redis, redis_prefix: str, redis_url: str, tmp_path: Path
) -> None:
    queue = "overlap"
    stream = f"{{{redis_prefix}:{queue}}}:stream"
    await redis_client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    workers = [
        redis_consumer(redis_prefix, queue, f"c{i}", tmp_path / f"c{i}.log", redis_url, WORK_S)
        for i in range(CONSUMERS)
    ]
    async with running(workers):

        async def all_listening() -> bool:
            return len(await redis_client.xinfo_consumers(stream, GROUP)) == CONSUMERS

        await wait_for(all_listening, "the consumers", workers)
        runs = await send_for(
            lambda: RedisStreamsTarget.from_url(redis_url, prefix=redis_prefix, group=GROUP),
            configs(redis_prefix, queue, "t"),
            RUN_S,
        )
        sent = enqueued(runs)

        async def all_done() -> bool:
            return len(printed(workers)) >= len(sent)

        await wait_for(all_done, "the workers to finish", workers)
    check(from_printed(printed(workers)), runs)


async def test_redis_streams_a_killed_consumer_with_overlap_timeout_lets_the_schedule_resume(
    redis_client: aioredis.Redis, redis_prefix: str, redis_url: str, tmp_path: Path
) -> None:
    queue = "killed"
    stream = f"{{{redis_prefix}:{queue}}}:stream"
    await redis_client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    stuck = redis_consumer(redis_prefix, queue, "stuck", tmp_path / "stuck.log", redis_url, 60)
    fresh = redis_consumer(redis_prefix, queue, "fresh", tmp_path / "fresh.log", redis_url, 0.1)
    schedule = PeriodicTaskConfig.create(
        name=f"{redis_prefix}-skip",
        spec="@every 1s",
        task_type="t",
        options={"queue": queue, "overlap": "skip", "overlap_timeout": 2},
    )
    runs: list[RunRecord] = []

    async def on_runs(batch: Any) -> None:
        runs.extend(batch)

    target = RedisStreamsTarget.from_url(redis_url, prefix=redis_prefix, group=GROUP)
    sched = Scheduler(target, clock=SystemClock(), grace=30, on_runs=on_runs)
    loop = asyncio.create_task(sched.run())
    async with running([stuck]):
        sched.register(schedule)

        async def taken() -> bool:
            return (await redis_client.xpending(stream, GROUP))["pending"] == 1

        await wait_for(taken, "the first task to start", [stuck])
        assert stuck.proc is not None
        os.kill(stuck.proc.pid, signal.SIGKILL)  # mid-task: its message stays pending forever
        stuck.proc.wait(timeout=10)
        killed_at = time.time()
        async with running([fresh]):

            async def resumed() -> bool:
                return len(printed([fresh])) >= 2

            await wait_for(resumed, "the schedule to resume", [fresh])
    sched.stop()
    await asyncio.wait_for(loop, WAIT_S)
    await target.close()
    statuses = [(r.status, r.reason) for r in runs]
    assert ("skipped", "overlap") in statuses  # before the timeout
    timeouts = [r for r in runs if r.reason == "overlap-timeout"]
    assert len(timeouts) == 1 and "was still running after overlap_timeout (2 s)" in (
        timeouts[0].error or ""
    )
    done = from_printed(printed([fresh]))
    assert all(e.started > killed_at for e in done)
    assert all(b.started >= a.finished for a, b in pairwise(sorted(done, key=lambda e: e.started)))


# -- the outbox on PostgreSQL: examples/consume_outbox.py ---------------------------------------


async def test_outbox_consumers(pg_url: str, redis_prefix: str, tmp_path: Path) -> None:
    await upgrade(pg_url)
    queue = "overlap"
    workers = [
        outbox_consumer(pg_url, queue, tmp_path / f"o{i}.log", WORK_S) for i in range(CONSUMERS)
    ]
    async with running(workers):
        engine = create_engine(pg_url)
        try:

            async def all_polling() -> bool:
                async with engine.connect() as conn:
                    query = (
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    )
                    return int((await conn.execute(text(query))).scalar_one()) > CONSUMERS

            await wait_for(all_polling, "the consumers", workers)
        finally:
            await engine.dispose()
        runs = await send_for(
            lambda: OutboxTarget.from_url(pg_url), configs(redis_prefix, queue, "t"), RUN_S
        )
        sent = enqueued(runs)

        async def all_done() -> bool:
            return len(printed(workers)) >= len(sent)

        await wait_for(all_done, "the workers to finish", workers)
    check(from_printed(printed(workers)), runs)


def outbox_consumer(pg_url: str, queue: str, log: Path, work_s: float) -> WorkerProcess:
    return WorkerProcess(
        [
            sys.executable,
            str(EXAMPLES / "consume_outbox.py"),
            "--database-url",
            pg_url,
            "--queue",
            queue,
            "--batch",
            "1",
            "--poll-interval",
            "0.05",
            "--work-s",
            str(work_s),
        ],
        {},
        log,
    )


async def test_outbox_a_killed_consumer_rolls_back_and_the_schedule_resumes_without_a_timeout(
    pg_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    """A consumer SIGKILLed mid-task: PostgreSQL ends its session and rolls its transaction back,
    so the row is unprocessed and unlocked again; a fresh consumer takes it, and ``skip`` lets the
    schedule go on once that row is processed. No overlap_timeout needed, none reported."""
    await upgrade(pg_url)
    queue = "killed"
    stuck = outbox_consumer(pg_url, queue, tmp_path / "stuck.log", 60)
    fresh = outbox_consumer(pg_url, queue, tmp_path / "fresh.log", 0.1)
    schedule = PeriodicTaskConfig.create(
        name=f"{redis_prefix}-skip",
        spec="@every 1s",
        task_type="t",
        options={"queue": queue, "overlap": "skip"},
    )
    runs: list[RunRecord] = []

    async def on_runs(batch: Any) -> None:
        runs.extend(batch)

    engine = create_engine(pg_url)
    target = OutboxTarget.from_url(pg_url)
    sched = Scheduler(target, clock=SystemClock(), grace=30, on_runs=on_runs)
    loop = asyncio.create_task(sched.run())
    try:
        async with running([stuck]):
            sched.register(schedule)

            async def taken() -> bool:
                # Rows of the queue exist, and none can be locked by us: the consumer holds it.
                async with engine.connect() as conn:
                    rows = (
                        await conn.execute(
                            text("SELECT count(*) FROM pm_outbox WHERE queue = :q"), {"q": queue}
                        )
                    ).scalar_one()
                    free = (
                        await conn.execute(
                            text(
                                "SELECT seq FROM pm_outbox WHERE queue = :q AND processed_at IS NULL"
                                " FOR UPDATE SKIP LOCKED"
                            ),
                            {"q": queue},
                        )
                    ).all()
                    await conn.rollback()
                return rows >= 1 and not free

            await wait_for(taken, "the first task to start", [stuck])

            async def skipping() -> bool:
                return any((r.status, r.reason) == ("skipped", "overlap") for r in runs)

            # The next slot comes while the first task runs, and is skipped: only then the kill.
            await wait_for(skipping, "a slot skipped while the first task runs", [stuck])
            assert stuck.proc is not None
            os.kill(stuck.proc.pid, signal.SIGKILL)  # mid-task, inside its transaction
            stuck.proc.wait(timeout=10)
            killed_at = time.time()
            async with running([fresh]):

                async def resumed() -> bool:
                    return len(printed([fresh])) >= 3

                await wait_for(resumed, "the schedule to resume", [fresh])
    finally:
        sched.stop()
        await asyncio.wait_for(loop, WAIT_S)
        await target.close()
        await engine.dispose()
    assert printed([stuck]) == []  # the killed consumer finished nothing
    assert not any(r.reason == "overlap-timeout" for r in runs)
    done = sorted(from_printed(printed([fresh])), key=lambda e: e.started)
    first_slot = min(r.slot for r in runs if r.status == "enqueued")
    assert done[0].slot == first_slot  # the killed consumer's task, taken again after the rollback
    assert all(e.started > killed_at for e in done)
    assert all(b.started >= a.finished for a, b in pairwise(done))


# -- arq ------------------------------------------------------------------------------------------


async def records(client: aioredis.Redis, key: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in await client.lrange(key, 0, -1)]


def from_records(
    recs: list[dict[str, Any]], sent: dict[str, tuple[str, datetime]]
) -> list[Execution]:
    return [Execution(*sent[r["id"]], r["started"], r["finished"]) for r in recs if r["id"] in sent]


@pytest.fixture
def arq_slow_worker(redis_prefix: str, redis_url: str, tmp_path: Path) -> Iterator[WorkerProcess]:
    proc = arq_worker(redis_prefix, f"{redis_prefix}:arq", tmp_path / "arq.log", redis_url)
    proc.env.update({"PM_TEST_WORK_S": str(WORK_S), "PM_TEST_MAX_JOBS": str(CONSUMERS)})
    yield proc
    proc.stop()


async def test_arq_worker(
    arq_slow_worker: WorkerProcess, redis_client: aioredis.Redis, redis_prefix: str, redis_url: str
) -> None:
    queue = f"{redis_prefix}:arq"
    out = f"{redis_prefix}:out"
    sent: dict[str, tuple[str, datetime]] = {}
    try:
        async with running([arq_slow_worker]):

            async def ready() -> bool:
                return "Starting worker" in arq_slow_worker.tail()

            await wait_for(ready, "the arq worker", [arq_slow_worker])
            runs = await send_for(
                lambda: ArqTarget.from_url(redis_url, prefix=redis_prefix),
                configs(redis_prefix, queue, "slow"),
                RUN_S,
            )
            sent = enqueued(runs)

            async def all_done() -> bool:
                return await redis_client.llen(out) >= len(sent)

            await wait_for(all_done, "the worker to finish", [arq_slow_worker])
    finally:
        keys = [
            f"arq:{kind}:{i}" for i in sent for kind in ("job", "in-progress", "result", "retry")
        ]
        if keys:
            await redis_client.delete(*keys)
    check(from_records(await records(redis_client, out), sent), runs)


# -- Celery with a Redis result backend ---------------------------------------------------------


def celery_slow(
    prefix: str, redis_url: str, log: Path, work_s: float, name: str = "w"
) -> WorkerProcess:
    """A Celery worker (threads) storing results in Redis, whose pmtest.slow works ``work_s``."""
    return WorkerProcess(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.support.celery_worker_app",
            "worker",
            "--pool=threads",
            f"--concurrency={CONSUMERS}",
            "-Q",
            f"{prefix}.q",
            "--hostname",
            f"{prefix}-{name}@%h",
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
            "-l",
            "INFO",
        ],
        {
            "PM_TEST_BROKER": redis_url,
            "PM_TEST_OUT": f"{prefix}:out",
            "PM_TEST_KEYPREFIX": f"{prefix}:",
            "PM_TEST_BACKEND": redis_url,
            "PM_TEST_WORK_S": str(work_s),
        },
        log,
    )


@pytest.fixture
def celery_slow_worker(
    redis_prefix: str, redis_url: str, tmp_path: Path
) -> Iterator[WorkerProcess]:
    proc = celery_slow(redis_prefix, redis_url, tmp_path / "celery.log", WORK_S)
    yield proc
    proc.stop()


async def test_celery_worker(
    celery_slow_worker: WorkerProcess,
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
) -> None:
    # Tasks of overlap schedules take kombu's way whichever path the others take (see the
    # target); here the others are written to Redis directly.
    out = f"{redis_prefix}:out"
    config = {"broker_transport_options": {"global_keyprefix": f"{redis_prefix}:"}}

    def target() -> CeleryTarget:
        return CeleryTarget.from_url(
            redis_url,
            prefix=redis_prefix,
            config=config,
            result_backend=redis_url,
        )

    sent: dict[str, tuple[str, datetime]] = {}
    try:
        async with running([celery_slow_worker]):

            async def ready() -> bool:
                return " ready." in celery_slow_worker.tail()

            await wait_for(ready, "the Celery worker", [celery_slow_worker])
            runs = await send_for(
                target, configs(redis_prefix, f"{redis_prefix}.q", "pmtest.slow"), RUN_S
            )
            sent = enqueued(runs)

            async def all_done() -> bool:
                return await redis_client.llen(out) >= len(sent)

            await wait_for(all_done, "the worker to finish", [celery_slow_worker])
    finally:
        if sent:
            await redis_client.delete(*(f"celery-task-meta-{i}" for i in sent))
    check(from_records(await records(redis_client, out), sent), runs)


async def test_celery_a_killed_worker_with_overlap_timeout_lets_the_schedule_resume(
    redis_client: aioredis.Redis, redis_prefix: str, redis_url: str, tmp_path: Path
) -> None:
    stuck = celery_slow(redis_prefix, redis_url, tmp_path / "stuck.log", 60, "stuck")
    fresh = celery_slow(redis_prefix, redis_url, tmp_path / "fresh.log", 0.1, "fresh")
    config = {"broker_transport_options": {"global_keyprefix": f"{redis_prefix}:"}}
    target = CeleryTarget.from_url(
        redis_url, prefix=redis_prefix, config=config, result_backend=redis_url
    )
    schedule = PeriodicTaskConfig.create(
        name=f"{redis_prefix}-skip",
        spec="@every 1s",
        task_type="pmtest.slow",
        options={"queue": f"{redis_prefix}.q", "overlap": "skip", "overlap_timeout": 2},
    )
    runs: list[RunRecord] = []

    async def on_runs(batch: Any) -> None:
        runs.extend(batch)

    sched = Scheduler(target, clock=SystemClock(), grace=30, on_runs=on_runs)
    loop = asyncio.create_task(sched.run())
    out = f"{redis_prefix}:out"
    sent: dict[str, tuple[str, datetime]] = {}
    try:
        async with running([stuck]):

            async def ready() -> bool:
                return " ready." in stuck.tail()

            await wait_for(ready, "the Celery worker", [stuck])
            sched.register(schedule)

            async def started() -> bool:  # task_track_started: the worker runs it
                ids = enqueued(runs)
                metas = [await redis_client.get(f"celery-task-meta-{i}") for i in ids]
                return any(m is not None and "STARTED" in m for m in metas)

            await wait_for(started, "the first task to start", [stuck])
            assert stuck.proc is not None
            os.kill(stuck.proc.pid, signal.SIGKILL)  # mid-task: never finished, never acked
            stuck.proc.wait(timeout=10)
            killed_at = time.time()
            async with running([fresh]):

                async def ready_again() -> bool:
                    return " ready." in fresh.tail()

                await wait_for(ready_again, "the second Celery worker", [fresh])

                async def resumed() -> bool:
                    return await redis_client.llen(out) >= 2

                await wait_for(resumed, "the schedule to resume", [fresh])
    finally:
        sched.stop()
        await asyncio.wait_for(loop, WAIT_S)
        await target.close()
        sent = enqueued(runs)
        if sent:
            await redis_client.delete(*(f"celery-task-meta-{i}" for i in sent))
    timeouts = [r for r in runs if r.reason == "overlap-timeout"]
    assert timeouts and "was still running after overlap_timeout (2 s)" in (timeouts[0].error or "")
    assert ("skipped", "overlap") in {(r.status, r.reason) for r in runs}
    done = from_records(await records(redis_client, out), sent)
    assert len(done) >= 2 and all(e.started > killed_at for e in done)


async def test_arq_a_killed_worker_with_overlap_timeout_lets_the_schedule_resume(
    redis_client: aioredis.Redis, redis_prefix: str, redis_url: str, tmp_path: Path
) -> None:
    queue = f"{redis_prefix}:arq"
    stuck = arq_worker(redis_prefix, queue, tmp_path / "stuck.log", redis_url)
    stuck.env["PM_TEST_WORK_S"] = "60"
    fresh = arq_worker(redis_prefix, queue, tmp_path / "fresh.log", redis_url)
    fresh.env["PM_TEST_WORK_S"] = "0.1"
    target = ArqTarget.from_url(redis_url, prefix=redis_prefix)
    schedule = PeriodicTaskConfig.create(
        name=f"{redis_prefix}-skip",
        spec="@every 1s",
        task_type="slow",
        options={"queue": queue, "overlap": "skip", "overlap_timeout": 2},
    )
    runs: list[RunRecord] = []

    async def on_runs(batch: Any) -> None:
        runs.extend(batch)

    sched = Scheduler(target, clock=SystemClock(), grace=30, on_runs=on_runs)
    loop = asyncio.create_task(sched.run())
    out = f"{redis_prefix}:out"
    sent: dict[str, tuple[str, datetime]] = {}
    try:
        async with running([stuck]):
            sched.register(schedule)

            async def started() -> bool:  # arq's in-progress key: the worker runs it
                ids = list(enqueued(runs))
                return bool(ids) and bool(
                    await redis_client.exists(*(f"arq:in-progress:{i}" for i in ids))
                )

            await wait_for(started, "the first job to start", [stuck])
            assert stuck.proc is not None
            os.kill(stuck.proc.pid, signal.SIGKILL)  # mid-job: its keys stay behind
            stuck.proc.wait(timeout=10)
            killed_at = time.time()
            async with running([fresh]):

                async def resumed() -> bool:
                    return await redis_client.llen(out) >= 2

                await wait_for(resumed, "the schedule to resume", [fresh])
    finally:
        sched.stop()
        await asyncio.wait_for(loop, WAIT_S)
        await target.close()
        sent = enqueued(runs)
        keys = [f"arq:{k}:{i}" for i in sent for k in ("job", "in-progress", "result", "retry")]
        if keys:
            await redis_client.delete(*keys)
    timeouts = [r for r in runs if r.reason == "overlap-timeout"]
    assert timeouts and "was still running after overlap_timeout (2 s)" in (timeouts[0].error or "")
    assert ("skipped", "overlap") in {(r.status, r.reason) for r in runs}
    done = from_records(await records(redis_client, out), sent)
    assert len(done) >= 2 and all(e.started > killed_at for e in done)
