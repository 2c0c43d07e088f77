"""A manager whose broker dies: two `periodic-manager manager` processes in partitions mode on one
PostgreSQL database, each with its own throwaway redis-server; once both hold their shares the
second one's Redis is SIGKILLed, and restarted ``--down`` seconds later.

Per round: *stood down*: from the sick manager's first failed ping (its log line) to the moment
``pm_partitions`` shows it holding nothing and the healthy one every partition (polled every
50 ms); *back*: from the Redis restart until both hold a share again. Over the whole run every
slot of every schedule due from the first share to the end is counted on both Redis servers:
*twice* (a key in both, or twice in one) and *lost* (in none), and the worst lateness
(enqueued_at - scheduled_at) of the slots due from the kill to 15 s after it. Run from the
repository root::

    .venv/bin/python bench/sick_manager.py [--rounds 3] [--down 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from tempfile import mkdtemp

import asyncpg
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from periodic_manager.db.migrate import upgrade  # noqa: E402
from periodic_manager.schedules.definition import PeriodicTaskConfig, idempotency_key  # noqa: E402
from tests.support.servers import ManagerProcess, RedisServer  # noqa: E402

PG_DSN = os.environ.get("PM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432")
SCHEDULES = [f"s{i:02d}" for i in range(60)]
PREFIX = f"pmbench{uuid.uuid4().hex[:8]}"


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def log_time(line: str) -> datetime:
    """The asctime of a CLI log line (local time, as the CLI formats it) as an aware instant."""
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").astimezone(UTC)


async def until(check, seconds: float, what: str) -> float:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if await check():
            return time.monotonic() - start
        await asyncio.sleep(0.05)
    raise RuntimeError(f"not reached within {seconds} s: {what}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--down", type=float, default=20.0, help="seconds the Redis stays down")
    args = parser.parse_args()
    tmp = Path(mkdtemp(prefix="pm-sick-"))
    name = f"pm_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(f"{PG_DSN}/postgres")
    await admin.execute(f'CREATE DATABASE "{name}"')
    db = f"{PG_DSN}/{name}"
    servers = [RedisServer(), RedisServer()]
    procs: list[ManagerProcess] = []
    conn = None
    try:
        for s in servers:
            s.start()
        await upgrade(db)
        conn = await asyncpg.connect(db)
        await conn.executemany(
            "INSERT INTO periodic_jobs (name, spec, timezone, task_type, payload, options, enabled)"
            " VALUES ($1, '@every 1s', 'UTC', 'bench.task', 'null', '{}', true)",
            [(n,) for n in SCHEDULES],
        )
        for i, s in enumerate(servers):
            env = {
                "PM_DATABASE_URL": db,
                "PM_TARGET": "redis",
                "PM_REDIS_URL": s.url,
                "PM_STREAM_PREFIX": PREFIX,
            }
            procs.append(ManagerProcess(env, tmp / f"manager{i}.log"))
            procs[-1].start()
        healthy, sick = procs

        async def shares() -> dict[int, int]:
            rows = await conn.fetch(
                "SELECT m.pid, count(p.partition) AS n FROM pm_managers m LEFT JOIN pm_partitions p"
                " ON p.holder = m.manager_id AND p.expires_at > now() GROUP BY m.pid"
            )
            return {r["pid"]: int(r["n"]) for r in rows}

        async def split() -> bool:
            held = await shares()
            return (
                held.get(healthy.pid, 0) > 0
                and held.get(sick.pid, 0) > 0
                and sum(held.values()) == 64
            )

        async def moved() -> bool:
            held = await shares()
            return held.get(sick.pid, 0) == 0 and held.get(healthy.pid, 0) == 64

        await until(split, 60, "both hold a share")
        start = datetime.now(UTC)
        rounds = []
        for _ in range(args.rounds):
            await asyncio.sleep(5)
            seen = sick.log().count("ping failed")
            at = datetime.now(UTC)
            servers[1].kill()
            await until(moved, 30, "the healthy manager holds everything")
            stood = datetime.now(UTC)
            line = [ln for ln in sick.log().splitlines() if "ping failed" in ln][seen]
            first_fail = log_time(line)
            await asyncio.sleep(max(0.0, args.down - (datetime.now(UTC) - at).total_seconds()))
            servers[1].start()
            back = await until(split, 60, "a share back")
            rounds.append(
                (at, (first_fail - at).total_seconds(), (stood - first_fail).total_seconds(), back)
            )
            print(
                f"killed {at:%H:%M:%S}: first failed ping +{rounds[-1][1]:.2f} s, stood down "
                f"{rounds[-1][2]:.2f} s after it, share back {back:.2f} s after the restart",
                flush=True,
            )
        await asyncio.sleep(5)
        end = datetime.now(UTC) - timedelta(seconds=2)
        await asyncio.sleep(3)
        messages = []
        for s in servers:
            async with aioredis.from_url(s.url, decode_responses=True) as client:
                messages += [f for _, f in await client.xrange(f"{{{PREFIX}:default}}:stream")]
    finally:
        for p in procs:
            p.stop()
        if conn is not None:
            await conn.close()
        for s in servers:
            s.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    print(json.dumps(audit(messages, rounds, start, end), indent=1))


def audit(
    messages: list[dict[str, str]],
    rounds: list[tuple[datetime, float, float, float]],
    start: datetime,
    end: datetime,
) -> dict[str, object]:
    """The rounds' figures, and every slot due in ``(start, end]`` counted on both streams."""
    keys = Counter(m["idempotency_key"] for m in messages)
    expected = set()
    for n in SCHEDULES:
        schedule = PeriodicTaskConfig.create(name=n, spec="@every 1s", task_type="t").schedule
        slot = schedule.next_after(start)
        while slot <= end:
            expected.add(idempotency_key(n, slot))
            slot = schedule.next_after(slot)
    out = []
    for at, first, stood, back in rounds:
        late = max(
            (parse_iso(m["enqueued_at"]) - parse_iso(m["scheduled_at"])).total_seconds()
            for m in messages
            if at <= parse_iso(m["scheduled_at"]) <= at + timedelta(seconds=15)
        )
        out.append(
            {
                "first_failed_ping_s": first,
                "stood_down_after_first_failed_ping_s": stood,
                "share_back_s": back,
                "worst_lateness_s": late,
            }
        )
    return {
        "rounds": out,
        "slots": len(expected),
        "twice": sum(1 for k in expected if keys[k] > 1),
        "lost": len(expected - set(keys)),
    }


if __name__ == "__main__":
    asyncio.run(main())
