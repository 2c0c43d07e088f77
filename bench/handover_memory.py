"""Memory of a hand-over: does a manager that held every partition give the memory back once it
holds its share? (issue 21: per-manager memory within 10 % of total / managers)

    .venv/bin/python -m bench.handover_memory [--schedules 200000] [--joiners 3] [--out FILE]

On a fresh PostgreSQL database with N rows none of which is due during the run (half
``@every`` 2-3.6 h, half daily cron at an hour at least 3 h away), ``periodic-manager manager``
(``PM_COORDINATION=partitions``, Redis Streams target) is spawned:

1. **alone**: one manager, until it has registered all N entries (``pm_managers``); its RSS;
2. **joined**: ``--joiners`` more spawned together, until every manager holds its fair share of
   the partitions (``pm_partitions``) and the entry counts sum to N, then ``--wait`` s more
   (the drops in turns, :func:`periodic_manager.gcpolicy.release`); the RSS of each: the first
   (the lone starter, after handing over) next to the joiners (that only ever held their share).

Printed: a table of RSS per manager, next to one manager holding nothing (the empty figure) and
to the ideal share ``empty + (alone - empty) / managers``.

Needs PostgreSQL (PM_BENCH_PG_DSN) and Redis (PM_BENCH_REDIS_URL); makes and drops its own
database and Redis keys.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from tempfile import mkdtemp

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.scale import PG, Bench, seed  # noqa: E402
from bench.scale_out import describe, manager_env, rss_mb, wait_until  # noqa: E402
from tests.support.servers import ManagerProcess  # noqa: E402

STATE = """SELECT m.pid, m.entry_count,
    (SELECT count(*) FROM pm_partitions p WHERE p.holder = m.manager_id AND p.expires_at > now())
    AS held FROM pm_managers m"""


def spread(hour: int) -> str:
    """Rows of numbers ``g``: half ``@every`` 2 h to 3.6 h, half daily at an hour 3-14 h from
    ``hour`` (UTC): none due within a run."""
    return (
        "CASE WHEN g % 2 = 0 THEN '@every ' || (7200 + (g % 97) * 60) || 's' "
        f"ELSE (g % 60) || ' ' || (({hour} + 3 + g % 12) % 24) || ' * * *' END"
    )


async def state(conn: asyncpg.Connection) -> dict[int, tuple[int, int]]:
    return {r["pid"]: (int(r["entry_count"]), int(r["held"])) for r in await conn.fetch(STATE)}


async def run(args: argparse.Namespace) -> str:
    tmp = Path(mkdtemp(prefix="pm-handover-mem-"))
    os.environ["PM_PARTITIONS"] = str(args.partitions)
    n = args.schedules
    lines = describe()
    async with Bench() as empty_db:
        env = manager_env(f"{PG}/{empty_db.name}", empty_db.prefix, args.lease_ttl)
        empty = ManagerProcess(env, tmp / "empty.log")
        empty.start()
        try:
            await wait_until("empty started", 60, _started(empty))
            await asyncio.sleep(args.wait)
            empty_mb = rss_mb(empty.pid)
        finally:
            empty.stop()
    async with Bench() as b:
        conn = await asyncpg.connect(f"{PG}/{b.name}")
        await seed(conn, n, spread(datetime.now(UTC).hour), by_row=True)
        await conn.execute("VACUUM ANALYZE periodic_jobs")
        env = manager_env(f"{PG}/{b.name}", b.prefix, args.lease_ttl)
        first = ManagerProcess(env, tmp / "m0.log")
        procs = [first]
        try:
            t0 = time.time()
            first.start()

            async def alone() -> bool:
                return (await state(conn)).get(first.pid, (0, 0)) == (n, args.partitions)

            await wait_until("the first manager holds every entry", 300, alone)
            alone_s = time.time() - t0
            await asyncio.sleep(args.wait)
            alone_mb = rss_mb(first.pid)
            print(f"alone: {n:,} entries after {alone_s:.1f} s, RSS {alone_mb:.0f} MB", flush=True)

            joiners = [ManagerProcess(env, tmp / f"m{i + 1}.log") for i in range(args.joiners)]
            procs += joiners
            for p in joiners:
                p.start()
            share = -(-args.partitions // len(procs))

            async def fair() -> bool:
                rows = await state(conn)
                mine = [rows.get(p.pid) for p in procs]
                return (
                    all(m is not None and 0 < m[1] <= share for m in mine)
                    and sum(m[1] for m in mine if m) == args.partitions
                    and sum(m[0] for m in mine if m) == n
                )

            await wait_until("every manager holds its share", 300, fair)
            await asyncio.sleep(args.wait)
            rows = await state(conn)
            after = [(rows[p.pid][0], rows[p.pid][1], rss_mb(p.pid)) for p in procs]
            for i, (e, h, r) in enumerate(after):
                print(f"  m{i}: {e:,} entries, {h} partitions, RSS {r:.0f} MB", flush=True)
        finally:
            for p in procs:
                p.stop()
            await conn.close()
    k = len(procs)
    ideal = empty_mb + (alone_mb - empty_mb) / k
    joined = [r for _, _, r in after[1:]]
    out = [
        *lines,
        "",
        f"{n:,} schedules none due in the run, {args.partitions} partitions, PM_LEASE_TTL={args.lease_ttl:g};"
        f" RSS read {args.wait:g} s after each state was reached",
        "",
        "| manager | entries | partitions | RSS | above empty | vs ideal share |",
        "|---|---|---|---|---|---|",
        f"| empty (no schedule) | 0 | {args.partitions} | {empty_mb:.0f} MB | - | - |",
        f"| m0 alone | {n:,} | {args.partitions} | {alone_mb:.0f} MB | {alone_mb - empty_mb:.0f} MB | - |",
    ]
    for i, (e, h, r) in enumerate(after):
        who = "m0 after the hand-over" if i == 0 else f"m{i} (joined: its share only)"
        out.append(
            f"| {who} | {e:,} | {h} | {r:.0f} MB | {r - empty_mb:.0f} MB | {100 * (r / ideal - 1):+.0f} % |"
        )
    out += [
        "",
        f"ideal share: empty + (alone - empty) / {k} = {ideal:.0f} MB; m0 after / joiners' mean:"
        f" {after[0][2] / (sum(joined) / len(joined)):.2f}",
    ]
    text = "\n".join(out) + "\n"
    print(f"\nlogs: {tmp}\n\n{text}", flush=True)
    return text


def _started(proc: ManagerProcess):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return "started with" in proc.log()

    return check


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m bench.handover_memory", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--schedules", type=int, default=200_000)
    parser.add_argument("--joiners", type=int, default=3, help="managers spawned after (default 3)")
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--lease-ttl", type=float, default=15.0)
    parser.add_argument(
        "--wait", type=float, default=5.0, help="s before each RSS read (default 5)"
    )
    parser.add_argument("--out", default=None, help="also append the table to this file")
    parsed = parser.parse_args()
    text = asyncio.run(run(parsed))
    if parsed.out:
        with open(parsed.out, "a") as f:
            f.write(text + "\n")
