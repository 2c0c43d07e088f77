"""Burst latency measured by Redis itself, next to the Redis-only floor of the same run.

    .venv/bin/python bench/burst.py [--sizes 10000,100000] [--slots 3] [--coordination both]

For each N: N rows of ``periodic_jobs`` (PostgreSQL) due at the same instant every 10 s (30 s
above 20,000), a real
manager (database provider and runtime store, Redis Streams target) running on the wall clock.
For several consecutive slots the stream entry ids of the slot's messages give, in Redis's own
clock (the same machine's), when the first and the last task landed, minus the slot instant.

The floor: the same N tasks, prepared exactly as the manager prepares them (one script argument
per 1,000 tasks, 4 pipelines), sent to Redis by a bare loop at a known instant: the time Redis
alone needs to claim and add them. Medians over the slots; the floor is measured between slots.

``--coordination``: the manager alone without leases (``none``), alone holding every partition
by lease as the default coordination on PostgreSQL has it (``partitions``), or ``both``, one after
the other in the same run (default): a lone manager's burst must not depend on it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scale import REDIS, Bench, machine  # noqa: E402
from periodic_manager.schedules.definition import PeriodicTaskConfig, idempotency_key  # noqa: E402
from periodic_manager.targets.base import task_for  # noqa: E402
from periodic_manager.targets.redis.streams import RedisStreamsTarget  # noqa: E402

PERIOD_S = 10  # up to 20,000 schedules; larger bursts fire every 30 s, so that the bench's own
# work between slots (reading the slot's ids back, preparing and sending the floor's tasks, all in
# this process and on this Redis) is over before the manager stages the next instant


def period_of(n: int) -> int:
    return PERIOD_S if n <= 20_000 else 30


async def landed(client: aioredis.Redis, stream: str, after_ms: int) -> list[int]:
    """Millisecond part of every entry id in the stream from ``after_ms`` on."""
    out: list[int] = []
    start = f"{after_ms}-0"
    while True:
        batch = await client.xrange(stream, min=start, count=20_000)
        out += [int(entry_id.split(b"-")[0]) for entry_id, _ in batch]
        if len(batch) < 20_000:
            return out
        start = "(" + batch[-1][0].decode()


async def floor(n: int, prefix: str) -> float:
    """Seconds Redis needs to take N prepared tasks (first call to last entry id)."""
    # One send of every task: a generous timeout (the manager's own sends are smaller parts).
    target = RedisStreamsTarget.from_url(REDIS, prefix=prefix, timeout=60)
    client = aioredis.from_url(REDIS)
    try:
        slot = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
        cfg = PeriodicTaskConfig.create(
            name="floor", spec="@every 10s", task_type="bench.task", payload={"n": 1}
        )
        tasks = [
            task_for(
                cfg,
                idempotency_key(f"floor{i}.{slot.timestamp()}", slot),
                slot,
                slot + timedelta(seconds=30),
            )
            for i in range(n)
        ]
        prepared = target.prepare(tasks)
        await target.send(target.prepare(tasks[:1]), datetime.now(UTC))  # script loaded, pool warm
        start_ms = int(time.time() * 1000)
        await target.send(prepared, datetime.now(UTC))
        ids = await landed(client, target.stream_key("default"), start_ms)
        return (max(ids) - start_ms) / 1000
    finally:
        await target.close()
        await client.aclose()


async def one_size(n: int, slots: int, partitions: bool) -> dict[str, Any]:
    period = period_of(n)
    async with Bench() as b:
        await b.insert(n, f"@every {period}s")
        target = RedisStreamsTarget.from_url(REDIS, prefix=b.prefix)
        client = aioredis.from_url(REDIS)
        stream = target.stream_key("default")
        mgr = b.manager(target, grace=60, partitions=partitions)
        firsts, lasts, rates, floors = [], [], [], []
        await mgr.start()
        try:
            # The first slot at least one period after the start completed (caches warm).
            slot_s = (int(time.time()) // period + 2) * period
            for _ in range(slots):
                while time.time() < slot_s + 2 + n / 50_000:  # noqa: ASYNC110 - a bench waits on the wall clock
                    await asyncio.sleep(0.2)
                ids = [
                    i
                    for i in await landed(client, stream, slot_s * 1000)
                    if i < (slot_s + period) * 1000
                ]
                assert len(ids) == n, f"{len(ids)} of {n} tasks in the stream for slot {slot_s}"
                firsts.append((min(ids) - slot_s * 1000) / 1000)
                lasts.append((max(ids) - slot_s * 1000) / 1000)
                rates.append(n / max(1e-3, (max(ids) - slot_s * 1000) / 1000))
                # Between slots: the floor, with the same Redis and stream sizes.
                floors.append(await floor(n, b.prefix + "f"))
                slot_s += period
        finally:
            await mgr.stop()
            await target.close()
            await client.aclose()
        return {
            "n": n,
            "first": statistics.median(firsts),
            "last": statistics.median(lasts),
            "rate": statistics.median(rates),
            "floor": statistics.median(floors),
            "lasts": lasts,
        }


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


async def main(sizes: list[int], slots: int, coordination: str) -> None:
    print(f"machine: {machine()}\nrun at {datetime.now(UTC).isoformat(timespec='seconds')}\n")
    print(
        "| N | coordination | first task after slot | last task after slot | tasks/s | Redis-only floor"
        " | last / floor | goal | verdict |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    modes = ["none", "partitions"] if coordination == "both" else [coordination]
    for n, mode in [(n, mode) for n in sizes for mode in modes]:
        r = await one_size(n, slots, partitions=mode == "partitions")
        ratio = r["last"] / r["floor"] if r["floor"] > 0 else float("inf")
        if n <= 10_000:
            goal = "first <= 20 ms, last <= 150 ms and <= 2x floor"
            ok = r["first"] <= 0.02 and r["last"] <= 0.15 and ratio <= 2
        else:
            goal = ">= 75,000 tasks/s"
            ok = r["rate"] >= 75_000
        lasts = ", ".join(f"{x * 1000:.0f}" for x in r["lasts"])
        print(
            f"| {n:,} | {mode} | {r['first'] * 1000:.0f} ms | {r['last'] * 1000:.0f} ms ({lasts}) | {r['rate']:,.0f} | "
            f"{r['floor'] * 1000:.0f} ms | {ratio:.2f} | {goal} | {verdict(ok)} |",
            flush=True,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--coordination", choices=["none", "partitions", "both"], default="both")
    args = parser.parse_args()
    asyncio.run(main([int(x) for x in args.sizes.split(",")], args.slots, args.coordination))
