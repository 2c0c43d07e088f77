"""Failover benchmark: a leader and a standby manager process; fault the leader, measure takeover.

Faults, each for ``--rounds`` rounds (the roles alternate):

* ``sigkill``: the leader process is SIGKILLed (a new standby is started after the takeover);
* ``cut``: the leader's database connections are cut (its TCP proxy refuses and resets them);
* ``freeze``: the leader's database connections stay open but nothing passes (half-open).

Per round: *takeover* is the time from the fault to the standby's "leads (takeover)" log line;
*first slot* the time until the first slot due after the fault is in the stream; *max late* the
worst lateness (enqueued_at - scheduled_at) of the slots due from 2 s before to 10 s after the
fault. Over the whole run every slot of every schedule is counted: *duplicates* (a key twice in
the stream) and *lost* (a slot missing). Real processes, PostgreSQL (a fresh database on the
server of PM_TEST_PG_DSN) and a throwaway redis-server; run from the repository root::

    .venv/bin/python bench/failover.py [--rounds 5] [--out bench/failover.txt]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
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

from periodic_manager.db.migrate import upgrade  # noqa: E402
from periodic_manager.schedules.definition import PeriodicTaskConfig, idempotency_key  # noqa: E402
from tests.support.servers import ManagerProcess, RedisServer  # noqa: E402
from tests.support.tcpproxy import TcpProxy  # noqa: E402

PG_DSN = os.environ.get("PM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432")
SCHEDULES = [
    (
        f"b{i:03d}",
        "@every 1s" if i < 200 else "@every 2s",
        {"misfire": "fire_once"} if i % 5 == 0 else {},
    )
    for i in range(300)
]
PREFIX = f"pmbench{uuid.uuid4().hex[:8]}"


@dataclass
class Node:
    """A manager process behind its own TCP proxy to PostgreSQL."""

    proxy: TcpProxy
    proc: ManagerProcess


@dataclass
class Round:
    fault: str
    at: datetime
    takeover_s: float
    first_slot_s: float = float("nan")
    max_late_s: float = float("nan")
    duplicates: int = 0
    lost: int = 0


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def log_time(line: str) -> datetime:
    """The asctime of a CLI log line (local time, as the CLI formats it) as an aware instant."""
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").astimezone(UTC)


async def managers(db: str) -> dict[int, tuple[bool, datetime]]:
    conn = await asyncpg.connect(db)
    try:
        rows = await conn.fetch("SELECT pid, is_leader, heartbeat_at FROM pm_managers")
    finally:
        await conn.close()
    return {r["pid"]: (r["is_leader"], r["heartbeat_at"]) for r in rows}


async def until(check, seconds: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"not reached within {seconds} s: {what}")


async def caught_up(db: str, since: datetime) -> bool:
    conn = await asyncpg.connect(db)
    try:
        n = await conn.fetchval(
            "SELECT count(*) FROM pm_schedule_state WHERE last_slot_at >= $1", since
        )
    finally:
        await conn.close()
    return int(n) == len(SCHEDULES)


class Bench:
    def __init__(self, db: str, redis_url: str, tmp: Path, *, direct: bool = False) -> None:
        self.direct = direct
        self.db = db
        self.redis_url = redis_url
        self.tmp = tmp
        self.nodes: list[Node] = []
        self.spawned = 0

    async def spawn(self) -> Node:
        proxy = TcpProxy("127.0.0.1", int(self.db.rsplit(":", 1)[1].split("/")[0]))
        port = await proxy.start()
        db_name = self.db.rsplit("/", 1)[1]
        env = {
            "PM_DATABASE_URL": self.db
            if self.direct
            else f"postgresql://postgres@127.0.0.1:{port}/{db_name}",
            "PM_TARGET": "redis",
            "PM_REDIS_URL": self.redis_url,
            "PM_STREAM_PREFIX": PREFIX,
            "PM_HEARTBEAT_INTERVAL": "1",
            "PM_SYNC_INTERVAL": "30",
        }
        self.spawned += 1
        proc = ManagerProcess(env, self.tmp / f"manager{self.spawned}.log")
        proc.start()
        node = Node(proxy, proc)
        self.nodes.append(node)
        return node

    async def roles(self) -> tuple[Node, Node]:
        """(leader, standby), both alive and published."""

        async def settled() -> bool:
            rows = await managers(self.db)
            # Fully started only: a standby still starting would count the takeover as a start.
            alive = [
                n
                for n in self.nodes
                if n.proc.alive() and n.proc.pid in rows and "started with" in n.proc.log()
            ]
            fresh = datetime.now(UTC) - timedelta(seconds=2)
            leads = [n for n in alive if rows[n.proc.pid][0] and rows[n.proc.pid][1] > fresh]
            stands = [n for n in alive if not rows[n.proc.pid][0] and rows[n.proc.pid][1] > fresh]
            return len(leads) == 1 and len(stands) == 1

        await until(settled, 60, "one leader and one standby")
        rows = await managers(self.db)
        alive = [n for n in self.nodes if n.proc.alive() and n.proc.pid in rows]
        leader = next(n for n in alive if rows[n.proc.pid][0])
        standby = next(n for n in alive if not rows[n.proc.pid][0])
        return leader, standby

    async def round(self, fault: str) -> Round:
        leader, standby = await self.roles()
        await until(
            lambda: caught_up(self.db, datetime.now(UTC) - timedelta(seconds=2)),
            60,
            "slots flowing",
        )
        seen = standby.proc.log().count("leads (takeover)")
        at = datetime.now(UTC)
        if fault == "sigkill":
            leader.proc.kill()
        elif fault == "cut":
            await leader.proxy.cut()
        else:
            leader.proxy.freeze()

        async def took_over() -> bool:
            return standby.proc.log().count("leads (takeover)") > seen

        await until(took_over, 30, "the standby takes over")
        line = [ln for ln in standby.proc.log().splitlines() if "leads (takeover)" in ln][-1]
        takeover = (log_time(line) - at).total_seconds()
        await until(
            lambda: caught_up(self.db, at + timedelta(seconds=10)),
            60,
            "every schedule past the fault",
        )
        if fault == "sigkill":
            await leader.proxy.close()
            self.nodes.remove(leader)
            await self.spawn()
        elif fault == "cut":
            await leader.proxy.restore()
        else:
            leader.proxy.thaw()
        return Round(fault, at, takeover)

    async def close(self) -> None:
        for node in self.nodes:
            node.proc.stop()
            await node.proxy.close()


def analyse(
    messages: list[dict[str, str]], rounds: list[Round], start: datetime, end: datetime
) -> tuple[int, int]:
    keys = Counter(m["idempotency_key"] for m in messages)
    sched = [(parse_iso(m["scheduled_at"]), parse_iso(m["enqueued_at"])) for m in messages]
    for r in rounds:
        after = [e for s, e in sched if s > r.at]
        r.first_slot_s = (min(after) - r.at).total_seconds() if after else float("nan")
        window = [
            (e - s).total_seconds()
            for s, e in sched
            if r.at - timedelta(seconds=2) <= s <= r.at + timedelta(seconds=10)
        ]
        r.max_late_s = max(window) if window else float("nan")
    expected: set[str] = set()
    for name, spec, _ in SCHEDULES:
        schedule = PeriodicTaskConfig.create(name=name, spec=spec, task_type="t").schedule
        slot = schedule.next_after(start)
        while slot <= end:
            expected.add(idempotency_key(name, slot))
            slot = schedule.next_after(slot)
    for r in rounds:
        lo, hi = r.at - timedelta(seconds=2), r.at + timedelta(seconds=10)
        in_window = {k for k in expected if lo <= parse_iso(k.split(":", 1)[1]) <= hi}
        r.lost = len(in_window - set(keys))
        r.duplicates = sum(1 for k in in_window if keys[k] > 1)
    duplicates = sum(1 for n in keys.values() if n > 1)
    lost = len(expected - set(keys))
    return duplicates, lost


def machine(pg_version: str, redis_version: str) -> list[str]:
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    return [
        f"machine: {os.cpu_count()} CPUs ({cpu}), {platform.system()} {platform.release()}",
        f"PostgreSQL {pg_version}; Redis {redis_version}; Python {platform.python_version()}; commit {commit}",
    ]


def table(rounds: list[Round]) -> list[str]:
    out = [
        f"{'round':>5} {'fault':<8} {'takeover s':>10} {'first slot s':>12} {'max late s':>10} {'dup':>4} {'lost':>5}"
    ]
    for i, r in enumerate(rounds, 1):
        out.append(
            f"{i:>5} {r.fault:<8} {r.takeover_s:>10.2f} {r.first_slot_s:>12.2f} {r.max_late_s:>10.2f} {r.duplicates:>4} {r.lost:>5}"
        )
    for fault in dict.fromkeys(r.fault for r in rounds):
        t = [r.takeover_s for r in rounds if r.fault == fault]
        f = [r.first_slot_s for r in rounds if r.fault == fault]
        late = [r.max_late_s for r in rounds if r.fault == fault]
        out.append(
            f"{fault}: takeover median {statistics.median(t):.2f} s, max {max(t):.2f} s; first slot after the"
            f" fault median {statistics.median(f):.2f} s, max {max(f):.2f} s; worst lateness {max(late):.2f} s"
        )
    return out


async def main() -> tuple[str, str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--faults", default="sigkill,cut,freeze")
    parser.add_argument("--direct", action="store_true", help="no proxies (sigkill rounds only)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "failover.txt"))
    args = parser.parse_args()
    tmp = Path(mkdtemp(prefix="pm-failover-"))
    name = f"pm_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(f"{PG_DSN}/postgres")
    await admin.execute(f'CREATE DATABASE "{name}"')
    db = f"{PG_DSN}/{name}"
    redis_server = RedisServer()
    redis_server.start()
    bench = Bench(db, redis_server.url, tmp, direct=args.direct)
    rounds: list[Round] = []
    try:
        await upgrade(db)
        conn = await asyncpg.connect(db)
        await conn.executemany(
            "INSERT INTO periodic_jobs (name, spec, timezone, task_type, payload, options, enabled)"
            " VALUES ($1, $2, 'UTC', 'bench.task', 'null', $3, true)",
            [(n, s, json.dumps(o)) for n, s, o in SCHEDULES],
        )
        pg_version = (await conn.fetchval("SHOW server_version")).split()[0]
        await conn.close()
        await bench.spawn()
        await until(lambda: _leads_any(db), 30, "a first leader")
        await bench.spawn()
        await bench.roles()
        start = datetime.now(UTC)
        for fault in args.faults.split(","):
            for _ in range(args.rounds):
                r = await bench.round(fault)
                rounds.append(r)
                print(f"{fault}: takeover {r.takeover_s:.2f} s", flush=True)
        end = datetime.now(UTC) - timedelta(seconds=2)
        await until(lambda: caught_up(db, end), 30, "the last slots")
        async with aioredis.from_url(redis_server.url, decode_responses=True) as client:
            messages = [f for _, f in await client.xrange(f"{{{PREFIX}:default}}:stream")]
            redis_version = (await client.info("server"))["redis_version"]
    finally:
        await bench.close()
        redis_server.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    duplicates, lost = analyse(messages, rounds, start, end)
    n1 = sum(1 for _, s, _ in SCHEDULES if s == "@every 1s")
    lines = [
        "Failover benchmark (bench/failover.py): a leader and a standby `periodic-manager manager`",
        f"process on PostgreSQL + Redis; {len(SCHEDULES)} schedules ({n1} @every 1s, {len(SCHEDULES) - n1} @every 2s,"
        " a fifth misfire=fire_once); defaults: grace 30 s, leader poll 1 s, leader timeout 3 s.",
        *machine(pg_version, redis_version),
        "",
        *table(rounds),
        "",
        f"whole run {start:%H:%M:%S}-{end:%H:%M:%S} UTC: {len(messages)} messages, {duplicates} slot(s) twice,"
        f" {lost} slot(s) lost",
    ]
    return args.out, "\n".join(lines) + "\n"


async def _leads_any(db: str) -> bool:
    return any(v[0] for v in (await managers(db)).values())


if __name__ == "__main__":
    out, text = asyncio.run(main())
    print(text)
    Path(out).write_text(text)
