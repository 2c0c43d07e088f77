"""How late good schedules are beside one whose task the target refuses (issue 36), wall clock.

    .venv/bin/python bench/refused.py [--seconds 60] [--good 20]

For each target of the issue's three refusals (RQ: a ``task_type`` without a dot; Dramatiq: a
queue named ``q:x``; procrastinate: a payload ``[1, 2]``) a fresh database is migrated, ``--good``
rows ``@every 1s`` and one refused row are written with plain SQL, and a manager is assembled
from ``Settings`` as ``periodic-manager manager`` assembles it (wall clock, PM_GRACE 30 s). For
``--seconds`` every enqueued good slot's lateness (the target's answer minus the slot) is taken,
and the refused row's outcomes counted. Prints a markdown table. Redis keys go to database 13 of
the local Redis and are deleted afterwards (those that were there before are left alone).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis.asyncio as aioredis  # noqa: E402
from sqlalchemy import text  # noqa: E402

from periodic_manager.contracts import EnqueueResult  # noqa: E402
from periodic_manager.db.engine import create_engine  # noqa: E402
from periodic_manager.db.migrate import upgrade  # noqa: E402
from periodic_manager.engine.dispatch import Hooks  # noqa: E402
from periodic_manager.runtime.assemble import build_manager  # noqa: E402
from periodic_manager.settings import Settings  # noqa: E402
from tests.conftest import new_pg_database  # noqa: E402
from tests.support.celery_arq_rig import procrastinate_cli  # noqa: E402

REDIS = "redis://127.0.0.1:6379/13"
GOOD_TYPE = "tests.support.rq_worker_app.record"
CASES = {  # target: (task_type, payload, options) of the refused row
    "rq": ("record", "null", "{}"),
    "dramatiq": (GOOD_TYPE, "null", '{"queue": "q:x"}'),
    "procrastinate": (GOOD_TYPE, "[1, 2]", "{}"),
}


async def measure(url: str, target: str, seconds: float, good: int) -> tuple[list[float], int, int]:
    """Lateness (s) of every good slot enqueued; the refused row's failed and other outcomes."""
    await upgrade(url)
    writer = create_engine(url)
    task_type, payload, options = CASES[target]
    async with writer.begin() as conn:
        for i in range(good):
            await conn.execute(
                text(
                    "INSERT INTO periodic_jobs (name, spec, task_type, payload, options) "
                    "VALUES (:n, '@every 1s', :t, 'null', '{}')"
                ),
                {"n": f"good{i}", "t": GOOD_TYPE},
            )
        await conn.execute(
            text(
                "INSERT INTO periodic_jobs (name, spec, task_type, payload, options) "
                "VALUES ('bad', '@every 1s', :t, :p, :o)"
            ),
            {"t": task_type, "p": payload, "o": options},
        )
    await writer.dispose()
    late: list[float] = []
    bad = {"failed": 0, "other": 0}

    def seen(results: Sequence[EnqueueResult]) -> None:
        now = datetime.now(UTC)
        for r in results:
            if r.task.name == "bad":
                bad["failed" if r.status == "failed" else "other"] += 1
            elif r.status == "enqueued":
                late.append((now - r.task.scheduled_at).total_seconds())

    engine = create_engine(url)
    settings = Settings(database_url=url, target=target, redis_url=REDIS, grace=30)
    manager = build_manager(settings, engine)
    manager.scheduler.dispatcher.hooks = Hooks(post_enqueue=seen)
    await manager.start()
    try:
        await asyncio.sleep(seconds)
    finally:
        await manager.stop()
        await engine.dispose()
    return late, bad["failed"], bad["other"]


async def run(target: str, seconds: float, good: int) -> tuple[list[float], int, int]:
    if target == "procrastinate":
        async with new_pg_database() as url:
            with tempfile.TemporaryDirectory() as tmp:
                await asyncio.to_thread(
                    procrastinate_cli, url, Path(tmp) / "out", "schema", "--apply"
                )
                return await measure(url, target, seconds, good)
    with tempfile.TemporaryDirectory() as tmp:
        return await measure(f"sqlite:///{tmp}/pm.db", target, seconds, good)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--good", type=int, default=20)
    args = parser.parse_args()
    client = aioredis.Redis.from_url(REDIS)
    before = set(await client.keys("*"))
    rows = []
    try:
        for target in CASES:
            rows.append((target, *await run(target, args.seconds, args.good)))
    finally:
        made = [k for k in await client.keys("*") if k not in before]
        for start in range(0, len(made), 500):
            await client.delete(*made[start : start + 500])
        await client.aclose()
    print(
        "| target | refused row | good slots sent | lateness median s | p99 s | max s "
        "| refused slots failed (retried) |\n| --- | --- | --- | --- | --- | --- | --- |"
    )
    for target, late, failed, other in rows:
        late.sort()
        p99 = late[min(len(late) - 1, int(len(late) * 0.99))] if late else float("nan")
        med = statistics.median(late) if late else float("nan")
        top = late[-1] if late else float("nan")
        task_type, payload, options = CASES[target]
        what = f"task_type={task_type} payload={payload} options={options}"
        print(
            f"| {target} | {what} | {len(late)} | {med:.3f} | {p99:.3f} | {top:.3f} | {failed} ({other}) |"
        )


if __name__ == "__main__":
    asyncio.run(main())
