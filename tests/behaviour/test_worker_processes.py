"""The RQ and procrastinate targets end to end, as deployed: schedules written with plain SQL, a
real ``periodic-manager manager`` process (PostgreSQL, leader election) sending them, then each
queue's own worker running what it received.

Real processes run on wall time (the one place tests do): the manager runs until it has sent
``SLOTS`` slots of every schedule, then is stopped with SIGTERM. The audit is made on the queue
itself: every schedule's slots arrive once each, the same slots for every schedule (all fire at
the same instants, one batch each), with no gap between the first and the last (none lost while
the manager ran), each with its nominal ``scheduled_at`` and idempotency key.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from pathlib import Path

import asyncpg
import redis.asyncio as aioredis

from periodic_manager.db.migrate import upgrade
from periodic_manager.schedules.definition import idempotency_key
from tests.conftest import new_pg_database
from tests.support.celery_arq_rig import procrastinate_cli, records, rq_burst
from tests.support.faults import dsn, insert_schedules
from tests.support.polling import eventually
from tests.support.servers import ManagerProcess

N = 20  # schedules, all "@every 1s"
SLOTS = 4  # the manager runs until it has sent this many slots of every schedule


def manager_env(url: str, **extra: str) -> dict[str, str]:
    return {
        "PM_DATABASE_URL": url,
        "PM_SYNC_INTERVAL": "30",
        "PM_HEARTBEAT_INTERVAL": "1",
        "PM_LOG_FORMAT": "text",
        **extra,
    }


async def run_until(manager: ManagerProcess, sent: object, what: str) -> None:
    """Start ``manager``, wait (bounded) until ``sent()`` holds, then SIGTERM it: a clean exit."""
    manager.start()
    try:
        await eventually(sent, what, seconds=60, detail=manager.log)  # type: ignore[arg-type]
    finally:
        code = manager.stop()
    assert code == 0, manager.log()[-3000:]
    assert " ERROR " not in manager.log(), manager.log()[-3000:]


def audit(slots_by_name: dict[str, list[datetime]], names: list[str]) -> None:
    """Each schedule's slots once each, the same for all, consecutive seconds."""
    assert sorted(slots_by_name) == sorted(names)
    first = sorted(slots_by_name[names[0]])
    for name in names:
        slots = slots_by_name[name]
        assert len(slots) == len(set(slots)), f"{name}: a slot twice"
        assert sorted(slots) == first, f"{name}: not the slots of the others"
    assert len(first) >= SLOTS
    steps = {b - a for a, b in zip(first, first[1:], strict=False)}
    assert steps == {timedelta(seconds=1)}, f"a slot lost: {first}"


async def test_rq_a_manager_process_sends_every_slot_once_to_a_real_rq_worker(
    pg_url: str, redis_url: str, redis_prefix: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    queue = f"{redis_prefix}-jobs"
    names = [f"{redis_prefix}.s{i}" for i in range(N)]
    await upgrade(pg_url)
    await insert_schedules(
        pg_url,
        [(name, "@every 1s", {"queue": queue}) for name in names],
        effective_at=None,
        task_type="tests.support.rq_worker_app.record",
        payload={"report": "daily"},
    )
    env = manager_env(
        pg_url,
        PM_TARGET="rq",
        PM_REDIS_URL=redis_url,
        PM_STREAM_PREFIX=redis_prefix,
        RQ_KEY_PREFIX=redis_prefix,  # RQ's own variable: the manager's jobs carry the prefix
    )
    manager = ManagerProcess(env, tmp_path / "manager.log")

    async def sent() -> bool:
        return await redis_client.llen(f"{redis_prefix}:queue:{queue}") >= N * SLOTS

    await run_until(manager, sent, f"{SLOTS} slots of {N} schedules in RQ's queue")
    assert "rq (redis://" in manager.log()  # the start-up line names the target

    await asyncio.to_thread(rq_burst, redis_prefix, queue, redis_url, tmp_path / "rq.log")
    ran = await records(redis_client, redis_prefix)
    assert Counter(r["id"] for r in ran).most_common(1)[0][1] == 1  # each job ran once
    slots: dict[str, list[datetime]] = defaultdict(list)
    for job in ran:
        assert job["task"] == "record" and job["kwargs"] == {"report": "daily"}
        assert job["queue"] == queue
        name, _, _ = job["meta"]["idempotency_key"].partition(":")
        slot = datetime.fromisoformat(job["meta"]["scheduled_at"])
        assert job["meta"]["idempotency_key"] == idempotency_key(name, slot)
        slots[name].append(slot)
    audit(slots, names)
    assert await redis_client.llen(f"{redis_prefix}:queue:{queue}") == 0


async def test_procrastinate_a_manager_process_sends_every_slot_once_to_a_real_worker(
    tmp_path: Path,
) -> None:
    names = [f"pw.s{i}" for i in range(N)]
    out = tmp_path / "out"
    async with new_pg_database() as url:
        await upgrade(url)
        await asyncio.to_thread(procrastinate_cli, url, out, "schema", "--apply")
        await insert_schedules(
            url,
            [(name, "@every 1s", {}) for name in names],
            effective_at=None,
            task_type="record",
            payload={"report": "daily"},
        )
        conn = await asyncpg.connect(dsn(url))
        try:

            async def sent() -> bool:
                n = await conn.fetchval("SELECT count(*) FROM procrastinate_jobs")
                return int(n) >= N * SLOTS

            manager = ManagerProcess(
                manager_env(url, PM_TARGET="procrastinate"), tmp_path / "m.log"
            )
            await run_until(manager, sent, f"{SLOTS} slots of {N} schedules as procrastinate jobs")
            assert "procrastinate (" in manager.log()
            keys = {
                r["job_id"]: r["idempotency_key"]
                for r in await conn.fetch(
                    "SELECT job_id, idempotency_key FROM pm_procrastinate_sent"
                )
            }
            await asyncio.to_thread(
                procrastinate_cli, url, out, "worker", "--one-shot", "--no-listen-notify"
            )
            statuses = Counter(
                r["status"] for r in await conn.fetch("SELECT status::text FROM procrastinate_jobs")
            )
        finally:
            await conn.close()
    ran = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in ran) == sorted(keys)  # every job once, each with its key
    assert statuses == Counter({"succeeded": len(keys)})
    slots: dict[str, list[datetime]] = defaultdict(list)
    for job in ran:
        assert job["task"] == "record" and job["kwargs"] == {"report": "daily"}
        name, _, at = keys[job["id"]].partition(":")
        slots[name].append(datetime.fromisoformat(at))
    audit(slots, names)
