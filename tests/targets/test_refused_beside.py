"""A task each target refuses for good, beside a good schedule, on the real target (issue 36).

For three minutes of ``@every 1s`` on a virtual clock (each instant a real call of the target),
one schedule whose task the target refuses sits beside a good one: the good one is sent at every
instant (0 s late on the virtual clock: it never waits for the refused one), and the refused one
is recorded ``failed`` at each slot with the target's reason, sent once and never retried. Without
the change the refused task was retried until its slot left grace, and the good schedule waited
for that: 23-30 s late.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import EnqueueResult, RunRecord, Target
from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import upgrade
from periodic_manager.engine.dispatch import Hooks
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.targets.outbox import OutboxTarget
from periodic_manager.targets.routing import RoutingTarget
from tests.conftest import new_pg_database
from tests.support.celery_arq_rig import procrastinate_cli as procrastinate

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
MINUTES = 3


@dataclass
class Case:
    target: Target
    good: PeriodicTaskConfig
    bad: PeriodicTaskConfig
    why: str  # a part of the refusal's text
    sent: list[str]  # the task ids enqueued (for the cleanup of keys that carry no prefix)


def config(name: str, **kw: Any) -> PeriodicTaskConfig:
    kw.setdefault("task_type", "tests.support.rq_worker_app.record")
    return PeriodicTaskConfig.create(name=name, spec="@every 1s", **kw)


@asynccontextmanager
async def redis_case(url: str, prefix: str, client: aioredis.Redis) -> AsyncIterator[Case]:
    from periodic_manager.targets.redis.streams import RedisStreamsTarget

    target = RedisStreamsTarget.from_url(url, prefix=prefix)
    bad_queue = "taken"
    await client.set(target.stream_key(bad_queue), "not a stream")  # someone's string key
    try:
        yield Case(
            target,
            config(f"{prefix}.good", options={"queue": "q"}),
            config(f"{prefix}.bad", options={"queue": bad_queue}),
            "WRONGTYPE",
            [],
        )
    finally:
        await target.close()


@asynccontextmanager
async def outbox_case(url: str, prefix: str) -> AsyncIterator[Case]:
    # The outbox behind a routing target: a schedule naming a target this deployment lacks.
    engine = create_engine(url)
    outbox = OutboxTarget(engine)
    try:
        yield Case(
            RoutingTarget({"outbox": outbox}, default="outbox"),
            config(f"{prefix}.good"),
            config(f"{prefix}.bad", options={"target": "celery"}),
            "is not configured",
            [],
        )
    finally:
        await engine.dispose()


@asynccontextmanager
async def rq_case(url: str, prefix: str) -> AsyncIterator[Case]:
    from periodic_manager.targets.rq import RqTarget

    target = RqTarget.from_url(url, prefix=prefix, key_prefix=prefix)
    try:
        yield Case(
            target,
            config(f"{prefix}.good", options={"queue": f"{prefix}-q"}),
            config(f"{prefix}.bad", task_type="record", options={"queue": f"{prefix}-q"}),
            "dotted path",
            [],
        )
    finally:
        await target.close()


@asynccontextmanager
async def dramatiq_case(url: str, prefix: str) -> AsyncIterator[Case]:
    from periodic_manager.targets.dramatiq import DramatiqTarget

    target = DramatiqTarget.from_url(url, prefix=prefix, namespace=prefix)
    try:
        yield Case(
            target,
            config(f"{prefix}.good", options={"queue": f"{prefix}-q"}),
            config(f"{prefix}.bad", options={"queue": "q:x"}),
            "not a Dramatiq queue name",
            [],
        )
    finally:
        await target.close()


@asynccontextmanager
async def arq_case(url: str, prefix: str, client: aioredis.Redis) -> AsyncIterator[Case]:
    from periodic_manager.targets.arq import ArqTarget

    target = ArqTarget.from_url(url, prefix=prefix)
    sent: list[str] = []
    try:
        yield Case(
            target,
            config(f"{prefix}.good", options={"queue": f"{prefix}-q"}),
            config(f"{prefix}.bad", payload={"_job_id": "x"}, options={"queue": f"{prefix}-q"}),
            "reserved by arq",
            sent,
        )
    finally:
        await target.close()
        keys = [
            f"arq:{kind}:{i}" for i in sent for kind in ("job", "in-progress", "result", "retry")
        ]
        for start in range(0, len(keys), 500):
            await client.delete(*keys[start : start + 500])


@asynccontextmanager
async def celery_case(url: str, prefix: str) -> AsyncIterator[Case]:
    from periodic_manager.targets.celery.target import CeleryTarget

    config_ = {"broker_transport_options": {"global_keyprefix": f"{prefix}:"}}
    target = CeleryTarget.from_url(url, prefix=prefix, config=config_)
    try:
        yield Case(
            target,
            config(f"{prefix}.good", options={"queue": f"{prefix}.q"}),
            # Skip on overlap needs the result backend this app lacks.
            config(f"{prefix}.bad", options={"queue": f"{prefix}.q", "overlap": "skip"}),
            "cannot tell when a task finished",
            [],
        )
    finally:
        await target.close()


@asynccontextmanager
async def procrastinate_case(prefix: str, tmp_path: Path) -> AsyncIterator[Case]:
    from periodic_manager.targets.procrastinate import ProcrastinateTarget

    async with new_pg_database() as url:
        await upgrade(url)
        await asyncio.to_thread(procrastinate, url, tmp_path / "out", "schema", "--apply")
        target = ProcrastinateTarget.from_url(url)
        try:
            yield Case(
                target,
                config(f"{prefix}.good", payload={"n": 1}),
                config(f"{prefix}.bad", payload=[1, 2]),
                "must be a JSON object",
                [],
            )
        finally:
            await target.close()


KINDS = ["redis", "outbox", "rq", "dramatiq", "arq", "celery", "procrastinate"]


@pytest.fixture(params=KINDS)
async def case(
    request: pytest.FixtureRequest,
    redis_url: str,
    redis_prefix: str,
    redis_client: aioredis.Redis,
    tmp_path: Path,
) -> AsyncIterator[Case]:
    kind = request.param
    async with AsyncExitStack() as stack:
        if kind == "outbox":
            url = await stack.enter_async_context(_migrated_pg())
            made = outbox_case(url, redis_prefix)
        elif kind == "procrastinate":
            made = procrastinate_case(redis_prefix, tmp_path)
        elif kind == "redis":
            made = redis_case(redis_url, redis_prefix, redis_client)
        elif kind == "arq":
            made = arq_case(redis_url, redis_prefix, redis_client)
        else:
            made = {"rq": rq_case, "dramatiq": dramatiq_case, "celery": celery_case}[kind](
                redis_url, redis_prefix
            )
        yield await stack.enter_async_context(made)


@asynccontextmanager
async def _migrated_pg() -> AsyncIterator[str]:
    async with new_pg_database(migrated=True) as url:
        yield url


async def run_for(
    case: Case, seconds: int
) -> tuple[Scheduler, list[RunRecord], list[tuple[str, list[str]]]]:
    clock = VirtualClock(T0)
    runs: list[RunRecord] = []
    errors: list[tuple[str, list[str]]] = []

    async def on_runs(batch: Sequence[RunRecord]) -> None:
        runs.extend(batch)

    def sent(results: Sequence[EnqueueResult]) -> None:
        case.sent.extend(r.task.id for r in results if r.status == "enqueued")

    hooks = Hooks(
        post_enqueue=sent,
        on_error=lambda exc, tasks: errors.append((str(exc), [t.name for t in tasks])),
    )
    sched = Scheduler(case.target, clock=clock, grace=30, on_runs=on_runs, hooks=hooks)
    loop = asyncio.create_task(sched.run())
    try:
        await clock.settle()
        sched.register(case.good)
        sched.register(case.bad)
        settle: Callable[[], Awaitable[None]] = lambda: sched.wait_processed(clock.now())  # noqa: E731
        await clock.advance(seconds, settle=settle)
    finally:
        sched.stop()
        await asyncio.wait_for(loop, 30)
    return sched, runs, errors


async def test_a_good_schedule_beside_a_refused_one_stays_on_time(case: Case) -> None:
    seconds = MINUTES * 60
    sched, runs, errors = await run_for(case, seconds)
    good = [r for r in runs if r.name == case.good.name]
    bad = [r for r in runs if r.name == case.bad.name]
    # Every slot of the good schedule sent at its instant (virtual time: the target's own work
    # takes none), whatever the refused one does.
    assert [r.status for r in good] == ["enqueued"] * seconds
    late = max((r.at - r.slot).total_seconds() for r in good)
    assert late <= 1.0, late
    assert late == 0.0
    # The refused one: failed at every slot with the target's reason, at once, never retried.
    assert len(bad) == seconds and {r.status for r in bad} == {"failed"}
    assert all(case.why in (r.error or "") for r in bad), bad[0].error
    assert all(r.at == r.slot for r in bad)  # recorded at its instant: no retry in between
    assert len(errors) == seconds and all(names == [case.bad.name] for _, names in errors)
    assert sched.counts["failed"] == seconds and sched.counts["enqueued"] == seconds
    assert sched.get(case.bad.key) is not None
    assert case.why in (sched.get(case.bad.key).last_error or "")  # type: ignore[union-attr]
    assert sched.dispatcher.retries.tasks == set()
