"""Takeover benchmark: three manager processes share the partitions; one is SIGKILLed, again and again.

    .venv/bin/python bench/takeover.py [--kills 20] [--leaves 5] [--out bench/takeover.txt]

Three ``periodic-manager manager`` processes (``PM_COORDINATION=partitions``, the default lease
TTL, Redis Streams target on a throwaway redis-server) share 300 schedules ``@every 1s`` on a
fresh PostgreSQL database (PM_TEST_PG_DSN). Per round, once the three share every partition
fairly, have registered every schedule and slots flow: the oldest of them (at least a lease
TTL old: a younger one leaving counts as coming for the rest of it) is SIGKILLed
(``--kills`` rounds), or stopped with SIGTERM (``--leaves`` rounds, a rolling deploy's leave);
measured from the signal:

* *held*: until every partition is held again under a live lease by the two others
  (``pm_partitions``, polled every 50 ms);
* *registered*: until the two others' published entry counts sum to 300;
* *max late*: the worst lateness (``enqueued_at - scheduled_at`` on the stream) of the slots due
  from 2 s before to 10 s after the signal; *dup* / *lost*: those slots twice / missing on the
  stream; *claims dropped*: sends of those slots the target's claims dropped as duplicates (the
  run history's ``duplicate``: a slot the killed manager sent that a survivor sent again).

Then a new manager is started in its place and the next round waits for the three to share
again (joins are clean hand-overs). Over the whole run every slot of every schedule is counted
per idempotency key on the stream: slots twice, slots missing, and the worst lateness of all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from tempfile import mkdtemp

import asyncpg
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.failover import PG_DSN, machine, parse_iso, until  # noqa: E402
from periodic_manager.db.migrate import upgrade  # noqa: E402
from periodic_manager.schedules.definition import PeriodicTaskConfig, idempotency_key  # noqa: E402
from tests.support.servers import ManagerProcess, RedisServer  # noqa: E402

SCHEDULES = 300
SPEC = "@every 1s"
MANAGERS = 3
TTL_S = 15  # PM_LEASE_TTL's default
PREFIX = f"pmbench{uuid.uuid4().hex[:8]}"
# Per manager (pid): its id, its published entry count, the partitions its live leases name.
STATE = """SELECT m.pid, m.manager_id, m.entry_count,
    (SELECT count(*) FROM pm_partitions p WHERE p.holder = m.manager_id AND p.expires_at > now())
    AS held FROM pm_managers m"""
COUNT = "SELECT count(*) FROM pm_partitions"


@dataclass
class Round:
    fault: str
    at: datetime
    held_s: float = math.nan
    registered_s: float = math.nan
    max_late_s: float = math.nan
    duplicates: int = 0
    lost: int = 0
    dropped: int = 0  # sends of those slots the target's claims dropped (pm_runs 'duplicate')


async def caught_up(db: str, since: datetime) -> bool:
    """Every schedule's last slot sent is at or after ``since`` (the database's record)."""
    conn = await asyncpg.connect(db)
    try:
        n = await conn.fetchval(
            "SELECT count(*) FROM pm_schedule_state WHERE last_slot_at >= $1", since
        )
    finally:
        await conn.close()
    return int(n) == SCHEDULES


class Fleet:
    def __init__(self, db: str, redis_url: str, tmp: Path) -> None:
        self.db = db
        self.redis_url = redis_url
        self.tmp = tmp
        self.procs: list[ManagerProcess] = []  # oldest first
        self.born: dict[int, float] = {}  # pid -> when it was spawned (monotonic)
        self.spawned = 0

    def spawn(self) -> ManagerProcess:
        env = {
            "PM_DATABASE_URL": self.db,
            "PM_TARGET": "redis",
            "PM_REDIS_URL": self.redis_url,
            "PM_STREAM_PREFIX": PREFIX,
            "PM_COORDINATION": "partitions",
        }
        self.spawned += 1
        proc = ManagerProcess(env, self.tmp / f"manager{self.spawned}.log")
        proc.start()
        self.procs.append(proc)
        self.born[proc.pid] = time.monotonic()
        return proc

    async def state(self) -> dict[int, tuple[str, int, int]]:
        conn = await asyncpg.connect(self.db)
        try:
            rows = await conn.fetch(STATE)
        finally:
            await conn.close()
        return {r["pid"]: (r["manager_id"], int(r["entry_count"]), int(r["held"])) for r in rows}

    async def dropped(self, at: datetime) -> int:
        """Sends of the slots due from 2 s before to 10 s after ``at`` that the target's claims
        dropped as duplicates (the run history keeps the last 100 per schedule: read at once)."""
        conn = await asyncpg.connect(self.db)
        try:
            n = await conn.fetchval(
                "SELECT count(*) FROM pm_runs WHERE status = 'duplicate' AND slot_at BETWEEN $1 AND $2",
                at - timedelta(seconds=2),
                at + timedelta(seconds=10),
            )
        finally:
            await conn.close()
        return int(n)

    async def shared(self, procs: list[ManagerProcess], parts: int) -> tuple[bool, bool]:
        """(every partition held by ``procs``, their entries sum to every schedule)."""
        rows = await self.state()
        mine = [rows[p.pid] for p in procs if p.pid in rows]
        held = len(mine) == len(procs) and sum(h for _, _, h in mine) == parts
        return held, held and sum(e for _, e, _ in mine) == SCHEDULES

    async def settle(self, parts: int) -> None:
        share = math.ceil(parts / MANAGERS)

        async def fair() -> bool:
            rows = await self.state()
            mine = [rows.get(p.pid) for p in self.procs]
            return (
                all(m is not None and 0 < m[2] <= share for m in mine)
                and all("started with" in p.log() for p in self.procs)
                and (await self.shared(self.procs, parts))[1]
            )

        await until(fair, 120, "three managers share every partition and registered every schedule")

    async def round(self, fault: str, victim: ManagerProcess, parts: int) -> Round:
        # A manager stopped less than a lease TTL after it registered is still counted as
        # coming by the others for the rest of that TTL: rolling deploys stop older ones.
        await asyncio.sleep(max(0.0, self.born[victim.pid] + TTL_S + 1 - time.monotonic()))
        await until(
            lambda: caught_up(self.db, datetime.now(UTC) - timedelta(seconds=2)),
            60,
            "slots flowing",
        )
        others = [p for p in self.procs if p is not victim]
        at = datetime.now(UTC)
        began = time.monotonic()
        if fault == "sigkill":
            victim.kill()
        else:
            victim.proc.terminate()  # type: ignore[union-attr]
        r = Round(fault, at)
        while math.isnan(r.registered_s):
            held, registered = await self.shared(others, parts)
            if held and math.isnan(r.held_s):
                r.held_s = time.monotonic() - began
            if registered:
                r.registered_s = time.monotonic() - began
            if time.monotonic() - began > 60:
                raise RuntimeError(f"{fault}: not taken over within 60 s")
            await asyncio.sleep(0.05)
        if fault == "sigterm":
            victim.stop()
        self.procs.remove(victim)
        await until(
            lambda: caught_up(self.db, at + timedelta(seconds=10)),
            60,
            "every schedule past the fault",
        )
        r.dropped = await self.dropped(at)
        self.spawn()
        return r

    def close(self) -> None:
        for p in self.procs:
            p.stop()


def analyse(
    messages: list[dict[str, str]], rounds: list[Round], start: datetime, end: datetime
) -> tuple[int, int, float]:
    keys = Counter(m["idempotency_key"] for m in messages)
    late = [(parse_iso(m["scheduled_at"]), parse_iso(m["enqueued_at"])) for m in messages]
    schedule = PeriodicTaskConfig.create(name="x", spec=SPEC, task_type="t").schedule
    slots, slot = [], schedule.next_after(start)
    while slot <= end:
        slots.append(slot)
        slot = schedule.next_after(slot)
    names = [f"t{i:03d}" for i in range(SCHEDULES)]
    for r in rounds:
        lo, hi = r.at - timedelta(seconds=2), r.at + timedelta(seconds=10)
        window = [(e - s).total_seconds() for s, e in late if lo <= s <= hi]
        r.max_late_s = max(window) if window else math.nan
        due = [idempotency_key(n, s) for s in slots if lo <= s <= hi for n in names]
        r.lost = sum(1 for k in due if k not in keys)
        r.duplicates = sum(1 for k in due if keys[k] > 1)
    expected = {idempotency_key(n, s) for s in slots for n in names}
    worst = max((e - s).total_seconds() for s, e in late if start < s <= end)
    return sum(1 for n in keys.values() if n > 1), len(expected - set(keys)), worst


def table(rounds: list[Round]) -> list[str]:
    out = [
        f"{'round':>5} {'fault':<8} {'held s':>7} {'registered s':>12} {'max late s':>10} {'dup':>4} {'lost':>5} {'claims dropped':>14}"
    ]
    for i, r in enumerate(rounds, 1):
        out.append(
            f"{i:>5} {r.fault:<8} {r.held_s:>7.2f} {r.registered_s:>12.2f} {r.max_late_s:>10.2f}"
            f" {r.duplicates:>4} {r.lost:>5} {r.dropped:>14}"
        )
    for fault in dict.fromkeys(r.fault for r in rounds):
        of = [r for r in rounds if r.fault == fault]
        held = [r.held_s for r in of]
        reg = [r.registered_s for r in of]
        out.append(
            f"{fault} ({len(of)}): every partition held again median {statistics.median(held):.2f} s,"
            f" max {max(held):.2f} s; registered median {statistics.median(reg):.2f} s, max {max(reg):.2f} s;"
            f" worst lateness {max(r.max_late_s for r in of):.2f} s;"
            f" {sum(r.duplicates for r in of)} twice, {sum(r.lost for r in of)} lost"
        )
    return out


async def main() -> tuple[str, str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--leaves", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "bench" / "takeover.txt"))
    args = parser.parse_args()
    tmp = Path(mkdtemp(prefix="pm-takeover-"))
    name = f"pm_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(f"{PG_DSN}/postgres")
    await admin.execute(f'CREATE DATABASE "{name}"')
    db = f"{PG_DSN}/{name}"
    redis_server = RedisServer()
    redis_server.start()
    fleet = Fleet(db, redis_server.url, tmp)
    rounds: list[Round] = []
    try:
        await upgrade(db)
        conn = await asyncpg.connect(db)
        await conn.executemany(
            "INSERT INTO periodic_jobs (name, spec, timezone, task_type, payload, options, enabled)"
            " VALUES ($1, $2, 'UTC', 'bench.task', 'null', $3, true)",
            [(f"t{i:03d}", SPEC, json.dumps({})) for i in range(SCHEDULES)],
        )
        pg_version = (await conn.fetchval("SHOW server_version")).split()[0]
        parts = int(await conn.fetchval(COUNT))
        await conn.close()
        for _ in range(MANAGERS):
            fleet.spawn()
        await fleet.settle(parts)
        start = datetime.now(UTC)
        faults = ["sigkill"] * args.kills + ["sigterm"] * args.leaves
        for i, fault in enumerate(faults):
            victim = fleet.procs[0]  # the oldest
            r = await fleet.round(fault, victim, parts)
            rounds.append(r)
            print(
                f"{i + 1:>3} {fault}: held again {r.held_s:.2f} s, registered {r.registered_s:.2f} s",
                flush=True,
            )
            await fleet.settle(parts)
        end = datetime.now(UTC) - timedelta(seconds=2)
        await until(lambda: caught_up(db, end), 30, "the last slots")
        async with aioredis.from_url(redis_server.url, decode_responses=True) as client:
            stream = f"{{{PREFIX}:default}}:stream"
            messages = [f for _, f in await client.xrange(stream)]
            redis_version = (await client.info("server"))["redis_version"]
    finally:
        fleet.close()
        redis_server.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    duplicates, lost, worst = analyse(messages, rounds, start, end)
    lines = [
        "Takeover benchmark (bench/takeover.py): three `periodic-manager manager` processes,",
        f"PM_COORDINATION=partitions (lease TTL 15 s, the default; {parts} partitions), {SCHEDULES} schedules {SPEC},",
        "Redis Streams target; one manager SIGKILLed (or SIGTERMed) per round, a new one started after.",
        *machine(pg_version, redis_version),
        "",
        *table(rounds),
        "",
        f"whole run {start:%H:%M:%S}-{end:%H:%M:%S} UTC: {len(messages)} messages, {duplicates} slot(s) twice,"
        f" {lost} slot(s) lost; worst lateness of any slot {worst:.2f} s",
    ]
    return args.out, "\n".join(lines) + "\n"


if __name__ == "__main__":
    out, text = asyncio.run(main())
    print(text)
    Path(out).write_text(text)
