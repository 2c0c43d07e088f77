"""Two backfills of one range racing, as issue 36 found them: real processes, wall clock.

    .venv/bin/python bench/backfill_race.py [--slots 2399] [--api-rate 20] [--cli-rate 10]

A fresh PostgreSQL database, one schedule ``@every 1s`` created now, the Redis Streams target
(default claim margin: a backfilled slot's claim lives grace + 60 s = 90 s). ``periodic-manager
api`` serves the API (no manager), ``POST /schedules/{id}/backfill`` of the last ``--slots``
seconds goes at ``--api-rate`` while ``periodic-manager backfill`` of the same range goes at
``--cli-rate`` in a process of its own, both started together. Then the stream is read: how many
slots reached it, how many twice. Then Redis forgets the test's keys and a third backfill of the
range runs: how many it sends again. Prints one markdown table row.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402

from periodic_manager.db.migrate import upgrade  # noqa: E402
from tests.conftest import new_pg_database  # noqa: E402
from tests.support import rawsql  # noqa: E402
from tests.support.servers import free_port  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/13"  # not the tests' (15): they check it holds no stray key
PM = [str(ROOT / ".venv/bin/python"), "-m", "periodic_manager"]


def iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


async def stream_counts(redis: aioredis.Redis, prefix: str) -> Counter[str]:
    entries = await redis.xrange(f"{{{prefix}:default}}:stream")
    return Counter(fields["scheduled_at"] for _, fields in entries)


async def forget(redis: aioredis.Redis, prefix: str) -> None:
    keys = [k async for k in redis.scan_iter(match=f"*{prefix}*", count=1000)]
    if keys:
        await redis.delete(*keys)


async def run(args: argparse.Namespace) -> str:
    prefix = f"bfrace{uuid.uuid4().hex[:6]}"
    redis = aioredis.from_url(REDIS_URL, decode_responses=True)
    async with new_pg_database() as url:
        await upgrade(url)
        sid = await rawsql.insert(url, "bf.race", spec="'@every 1s'")
        env = {
            **os.environ,
            "PM_DATABASE_URL": url,
            "PM_TARGET": "redis",
            "PM_REDIS_URL": REDIS_URL,
            "PM_STREAM_PREFIX": prefix,
            "PM_LOG_LEVEL": "WARNING",
        }
        port = free_port()
        api = await asyncio.create_subprocess_exec(
            *PM, "api", "--port", str(port), env={**env, "PM_CATCHUP_RATE": str(args.api_rate)}
        )
        try:
            end = datetime.now(UTC).replace(microsecond=0)
            start = end - timedelta(seconds=args.slots)
            rng = {"from": iso(start), "to": iso(end)}
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=3600
            ) as client:
                for _ in range(200):
                    try:
                        if (await client.get("/healthz")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.1)
                began = time.monotonic()
                cli = await asyncio.create_subprocess_exec(
                    *PM,
                    "backfill",
                    "bf.race",
                    "--from",
                    rng["from"],
                    "--to",
                    rng["to"],
                    env={**env, "PM_CATCHUP_RATE": str(args.cli_rate)},
                    stdout=subprocess.PIPE,
                )
                answer = await client.post(f"/schedules/{sid}/backfill", json=rng)
                out, _ = await cli.communicate()
                took = time.monotonic() - began
                counts = await stream_counts(redis, prefix)
                twice = sum(1 for n in counts.values() if n > 1)
                await forget(redis, prefix)
                third = (await client.post(f"/schedules/{sid}/backfill", json=rng)).json()
            api_sent = answer.json()["sent"]
            return (
                f"| {args.slots} | {args.api_rate}/s API, {args.cli_rate}/s CLI | {len(counts)} | {twice} | "
                f"{api_sent} + {out.decode().split(': ')[1].split(' sent')[0]} | {third['sent']} | {took:.0f} s |"
            )
        finally:
            api.terminate()
            await asyncio.wait_for(api.wait(), 10)
            await forget(redis, prefix)
            await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=2399)
    parser.add_argument("--api-rate", type=float, default=20)
    parser.add_argument("--cli-rate", type=float, default=10)
    args = parser.parse_args()
    print(
        "| slots | rates | slots in the stream | sent twice | sent (API + CLI) | sent again after Redis forgot | took |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print(asyncio.run(run(args)), flush=True)


if __name__ == "__main__":
    main()
