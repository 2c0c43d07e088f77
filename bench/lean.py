"""Step 9 goals on real PostgreSQL and Redis: cold start, memory, sync and idle CPU at 100,000 and
1,000,000 schedules (bursts: bench/burst.py).

    .venv/bin/python bench/lean.py [coldstart|sync|idle|all] [--sizes 100000,1000000]

Each case runs in a fresh interpreter (memory figures are not skewed by an earlier case), with
its own database. Prints markdown tables with the goal and PASS/MISS.

- coldstart: N rows (daily specs spread over the day, payload {"n": i}, the schema's defaults)
  plus one ``@every 1s`` row; a real manager (database provider and store, Redis Streams
  target). Time from start() to every entry registered; the lateness of the ``@every 1s`` row's
  first slot after the start, from Redis's own entry id; memory = RSS after start and the
  publication of every entry (then a collection and the manager's own release of freed memory,
  as after each large sync) minus RSS before, per schedule; traced = the same measured by
  tracemalloc in a separate run (what Python objects hold, without allocator overhead).
- sync: 100,000 rows: a sync when nothing changed, when 1% changed, and a full reconcile.
- idle: CPU used over 60 s by a manager holding N entries none of which is due.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scale import PG, REDIS, Bench, machine, rss_kb, timed, verdict  # noqa: E402
from periodic_manager import gcpolicy  # noqa: E402
from periodic_manager.targets.redis.streams import RedisStreamsTarget  # noqa: E402


async def seed(b: Bench, n: int, *, tick: bool = True) -> None:
    """n daily rows spread over the day (none due during a run), and (``tick``) one @every 1s
    row."""
    conn = await asyncpg.connect(f"{PG}/{b.name}")
    try:
        await conn.execute(
            "INSERT INTO periodic_jobs (name, spec, timezone, task_type, payload)"
            " SELECT 'job.' || g, (g % 60) || ' ' || (g / 60 % 24) || ' * * *', 'UTC',"
            " 'bench.task', jsonb_build_object('n', g) FROM generate_series(1, $1) g",
            n,
        )
        if tick:
            await conn.execute(
                "INSERT INTO periodic_jobs (name, spec, task_type) VALUES ('tick', '@every 1s', 't')"
            )
        await conn.execute("VACUUM ANALYZE periodic_jobs")
    finally:
        await conn.close()


async def coldstart(n: int, traced: bool) -> dict[str, Any]:
    async with Bench() as b:
        await seed(b, n)
        target = RedisStreamsTarget.from_url(REDIS, prefix=b.prefix)
        mgr = b.manager(target, close_target=True)
        client = aioredis.from_url(REDIS)
        gc.collect()
        gcpolicy.release()
        if traced:
            tracemalloc.start()
        before = rss_kb()
        t0 = time.perf_counter()
        started_at = time.time()
        await mgr.start()
        took = time.perf_counter() - t0
        registered = len(mgr.entries())
        # The first slot of the @every 1s row after start() returned, as Redis stamped it.
        first_slot = int(time.time()) + 1
        stream = target.stream_key("default")
        late_ms = None
        for _ in range(100):
            await asyncio.sleep(0.05)
            ids = await client.xrange(stream, min=f"{first_slot * 1000}-0", count=1)
            if ids:
                late_ms = int(ids[0][0].split(b"-")[0]) - first_slot * 1000
                break
        await mgr.flush()
        gc.collect()
        gcpolicy.release()
        after = rss_kb()
        per_entry = (after - before) * 1024 / registered
        if traced:
            current, _ = tracemalloc.get_traced_memory()
            per_entry = current / registered
            tracemalloc.stop()
        await mgr.stop()
        await client.aclose()
    return {"n": n, "took": took, "registered": registered, "late_ms": late_ms,
            "per_entry": per_entry, "started_at": started_at}


async def sync_cost(n: int) -> list[str]:
    rows = []
    async with Bench() as b:
        await seed(b, n)
        mgr = b.manager(RedisStreamsTarget.from_url(REDIS, prefix=b.prefix), close_target=True)
        await mgr.start()
        await mgr.flush()
        try:
            nothing = await timed(lambda: mgr.sync(), 5)
            rows.append(f"| {n:,} | nothing changed | {nothing * 1000:.1f} ms | <= 10 ms | {verdict(nothing <= 0.01)} |")
            conn = await asyncpg.connect(f"{PG}/{b.name}")
            counter = iter(range(100))

            async def one_percent() -> None:
                await conn.execute("UPDATE periodic_jobs SET spec = $1 WHERE id % 100 = 0", f"{next(counter)} 5 * * *")
                await mgr.sync()

            changed = await timed(one_percent, 3)
            rows.append(f"| {n:,} | 1% changed (includes the UPDATE) | {changed * 1000:.1f} ms | (proportional) | - |")
            await conn.close()
            await mgr.flush()
            full = await timed(lambda: mgr.sync(full=True), 3)
            rows.append(f"| {n:,} | full reconcile | {full * 1000:.1f} ms | <= 300 ms | {verdict(full <= 0.3)} |")
        finally:
            await mgr.stop()
    return rows


async def idle(n: int, seconds: float = 60) -> dict[str, Any]:
    async with Bench() as b:
        await seed(b, n, tick=False)  # nothing due at all (the tick's history would be work)
        mgr = b.manager(RedisStreamsTarget.from_url(REDIS, prefix=b.prefix), close_target=True, sync_interval=30)
        await mgr.start()
        await mgr.flush()
        await asyncio.sleep(5)  # the start-up's background writes are done
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        wall0 = time.perf_counter()
        await asyncio.sleep(seconds)
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.perf_counter() - wall0
        await mgr.stop()
    cpu = (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime) / wall
    return {"n": n, "cpu": cpu, "seconds": seconds}


def child(case: str, n: int) -> None:
    if case == "coldstart":
        print(repr(asyncio.run(coldstart(n, traced=False))))
    elif case == "traced":
        print(repr(asyncio.run(coldstart(n, traced=True))))
    elif case == "sync":
        print(repr(asyncio.run(sync_cost(n))))
    elif case == "idle":
        print(repr(asyncio.run(idle(n))))


def run_child(case: str, n: int) -> Any:
    out = subprocess.run(
        [sys.executable, __file__, "--child", case, "--sizes", str(n)],
        capture_output=True, text=True, check=True, env={**os.environ},
    )
    return eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own child's repr


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("part", nargs="?", default="all", choices=["coldstart", "sync", "idle", "all"])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.child:
        child(args.child, sizes[0])
        return
    print(f"machine: {machine()}\nrun at {datetime.now(UTC).isoformat(timespec='seconds')}\n", flush=True)
    if args.part in ("coldstart", "all"):
        print("| schedules | start() until all registered | first slot after start, late by | goal (time) | memory per schedule (RSS) | traced by Python | goal (memory) | verdict |")
        print("|---|---|---|---|---|---|---|---|", flush=True)
        for n in sizes:
            r = run_child("coldstart", n)
            t = run_child("traced", n)
            time_goal = 1.0 if n <= 100_000 else 10.0
            ok = r["took"] <= time_goal and r["per_entry"] <= 600 and r["registered"] == n + 1
            ok = ok and r["late_ms"] is not None and r["late_ms"] < 1000
            print(
                f"| {n:,} | {r['took']:.2f} s | {r['late_ms']} ms | <= {time_goal:g} s, on time | "
                f"{r['per_entry']:,.0f} B | {t['per_entry']:,.0f} B | <= 600 B | {verdict(ok)} |",
                flush=True,
            )
        print()
    if args.part in ("sync", "all"):
        print("| schedules | sync | time (best of 3-5) | goal | verdict |\n|---|---|---|---|---|")
        for line in run_child("sync", 100_000):
            print(line, flush=True)
        print()
    if args.part in ("idle", "all"):
        print("| schedules, none due | CPU over 60 s | goal | verdict |\n|---|---|---|---|")
        n = max(sizes)
        r = run_child("idle", n)
        print(f"| {n:,} | {r['cpu'] * 100:.2f} % of a core | < 1 % | {verdict(r['cpu'] < 0.01)} |", flush=True)


if __name__ == "__main__":
    main()
