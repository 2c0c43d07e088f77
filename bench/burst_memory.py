"""Memory of a burst, per target: RSS before it, at its peak, and once it is over.

    .venv/bin/python bench/burst_memory.py [--n 100000] [--targets redis,celery,...]

For each target, in a fresh interpreter: N rows of ``periodic_jobs`` (PostgreSQL) due at one
instant (``@every 1h`` anchored a little after the manager will have started), a real manager
built as the ``manager`` command builds it (database provider and runtime store, the target from
settings), run on the wall clock. RSS is read from /proc every 20 ms:

- before: the manager started, its entries published, before the slot's batch is staged;
- peak: the highest sample from then until the burst is over (staging included);
- after: the burst sent and its run history written, then 3 s more (what the manager gives back
  by itself: the bench never collects or trims);
- after the next prune: 70 s after, once the run history was pruned (every minute);
- per due task: after - before, divided by N (what the manager keeps per task of the burst).

Redis targets write to their own database (PM_BENCH_MEM_REDIS_URL, default DB 12), flushed
before and after each target; PostgreSQL ones to the bench's own database, dropped after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scale import PG, Bench, machine, rss_kb, seed  # noqa: E402
from periodic_manager import gcpolicy  # noqa: E402
from periodic_manager.engine.staging import LEAD_MAX_S  # noqa: E402
from periodic_manager.runtime.assemble import build_target  # noqa: E402
from periodic_manager.settings import Settings  # noqa: E402

REDIS = os.environ.get("PM_BENCH_MEM_REDIS_URL", "redis://127.0.0.1:6379/12")
TARGETS = ("redis", "celery", "arq", "rq", "dramatiq", "procrastinate", "outbox")
SETTLE_S = 3.0  # after the burst and its history written
PRUNED_S = 70.0  # after the next prune of the run history (every minute, at a heartbeat)
PERIOD_S = 120  # between bursts, with --bursts


async def _prepare(b: Bench, target: str, n: int, slot: datetime, spec: str) -> None:
    conn = await asyncpg.connect(f"{PG}/{b.name}")
    try:
        if target == "procrastinate":
            from procrastinate.schema import SchemaManager

            await conn.execute(SchemaManager.get_schema())
        await seed(conn, n, spec, anchor=slot, queue=f"{b.prefix}q")
    finally:
        await conn.close()


async def _sampled(until: asyncio.Event, samples: list[int]) -> None:
    while not until.is_set():
        samples.append(rss_kb())
        await asyncio.sleep(0.02)


async def one(target_name: str, n: int, bursts: int = 1) -> dict[str, Any]:
    """One target's burst in this process (see the module doc); with ``bursts`` > 1, that many
    bursts ``PERIOD_S`` apart, and the RSS before each of the next ones."""
    from periodic_manager.runtime.assemble import build_manager

    flush = aioredis.from_url(REDIS)
    await flush.flushdb()
    # Time to start: a cold start of N rows, then the publishing of its entries.
    lead = 20 + n / 2_000
    slot = (datetime.now(UTC) + timedelta(seconds=lead)).replace(microsecond=0)
    try:
        async with Bench() as b:
            spec = "@every 1h" if bursts == 1 else f"@every {PERIOD_S}s"
            await _prepare(b, target_name, n, slot, spec)
            settings = Settings(
                database_url=b.url,
                target=target_name,
                redis_url=REDIS,
                stream_prefix=b.prefix,
                leader_election=False,
                listen=False,
                sync_interval=3600,
                grace=60,
                _env_file=None,
            )
            gcpolicy.enable()  # as the manager command does
            mgr = build_manager(settings, b.engine, target=build_target(settings, b.engine))
            started = time.monotonic()
            await mgr.start()
            await mgr.flush()
            start_s = time.monotonic() - started
            # Before the stager takes the instant's batch (at most LEAD_MAX_S ahead).
            wait = (slot - datetime.now(UTC)).total_seconds() - LEAD_MAX_S - 2
            if wait < 0:
                raise RuntimeError(
                    f"the start took {start_s:.1f} s: the slot passed (raise the lead)"
                )
            await asyncio.sleep(wait)
            trace = _tracing()
            before = rss_kb()
            samples: list[int] = [before]
            done = asyncio.Event()
            sampler = asyncio.ensure_future(_sampled(done, samples))
            t0 = time.monotonic()
            await asyncio.wait_for(mgr.wait_settled(slot), 300)
            burst_s = time.monotonic() - t0 - LEAD_MAX_S - 2
            await asyncio.sleep(SETTLE_S)
            done.set()
            await sampler
            after = rss_kb()
            # The history prune (every minute, at a heartbeat) lets go of the burst's last keys.
            await asyncio.sleep(PRUNED_S - SETTLE_S)
            pruned = rss_kb()
            nexts = []
            for k in range(1, bursts):
                at = slot + timedelta(seconds=k * PERIOD_S)
                await asyncio.sleep((at - datetime.now(UTC)).total_seconds() - LEAD_MAX_S - 2)
                nexts.append(rss_kb())
                await asyncio.wait_for(mgr.wait_settled(at), 300)
            if trace is not None:
                _trace_report(trace)
            await mgr.stop()
            conn = await asyncpg.connect(f"{PG}/{b.name}")
            sent = await conn.fetchval(
                "SELECT count(*) FROM pm_runs WHERE status IN ('enqueued', 'duplicate', 'resent')"
            )
            await conn.close()
    finally:
        await flush.flushdb()
        await flush.aclose()
    return {
        "target": target_name,
        "n": n,
        "sent": sent,
        "start_s": start_s,
        "burst_s": burst_s,
        "before_kb": before,
        "peak_kb": max(samples),
        "after_kb": after,
        "pruned_kb": pruned,
        "nexts_kb": nexts,
    }


def _tracing() -> Any:
    """With PM_BENCH_TRACE=1: tracing from now on (the burst only), and its first snapshot."""
    if not os.environ.get("PM_BENCH_TRACE"):
        return None
    import tracemalloc

    tracemalloc.start(12)
    return tracemalloc.take_snapshot()


def _trace_report(before: Any) -> None:
    import tracemalloc

    after = tracemalloc.take_snapshot()
    for stat in after.compare_to(before, "traceback")[:12]:
        print(f"{stat.size_diff / 1024:+.0f} KiB in {stat.count_diff:+d} blocks", file=sys.stderr)
        for line in stat.traceback.format()[-12:]:
            print("   ", line, file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--bursts", type=int, default=1, help="bursts per target (RSS before each)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(asyncio.run(one(args.one, args.n, args.bursts))), flush=True)
        return
    load = os.getloadavg()[0]
    print(
        f"machine: {machine()}\nrun at {datetime.now(UTC).isoformat(timespec='seconds')}, "
        f"load average {load:.2f}; {args.n:,} schedules due at one instant, one process per target\n"
    )
    nexts = "".join(f" before burst {k + 1} |" for k in range(1, args.bursts))
    print(
        "| target | sent | start | burst (slot -> history written) | RSS before | peak | after "
        f"(+{SETTLE_S:g} s) | per due task | after the next prune (+{PRUNED_S:g} s) | per due task |{nexts}"
    )
    print("|---|---|---|---|---|---|---|---|---|---|" + "---|" * (args.bursts - 1), flush=True)
    for name in args.targets.split(","):
        cmd = [
            sys.executable,
            __file__,
            "--one",
            name,
            "--n",
            str(args.n),
            "--bursts",
            str(args.bursts),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"| {name} | failed: {done.stderr.strip().splitlines()[-1:]} |", flush=True)
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        for line in done.stderr.splitlines():  # what the manager said beyond INFO
            print(f"<!-- {name}: {line[:200]} -->", file=sys.stderr)
        kept = r["after_kb"] - r["before_kb"]
        left = r["pruned_kb"] - r["before_kb"]
        print(
            f"| {name} | {r['sent']:,} | {r['start_s']:.1f} s | {r['burst_s']:.1f} s | "
            f"{r['before_kb'] / 1024:.0f} MB | {r['peak_kb'] / 1024:.0f} MB | {r['after_kb'] / 1024:.0f} MB | "
            f"{kept * 1024 / r['n']:+,.0f} B | {r['pruned_kb'] / 1024:.0f} MB | {left * 1024 / r['n']:+,.0f} B |"
            + "".join(f" {kb / 1024:.0f} MB |" for kb in r["nexts_kb"]),
            flush=True,
        )


if __name__ == "__main__":
    main()
