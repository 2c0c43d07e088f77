"""Scale out: 1, 2 and 4 real manager processes sharing the partitions of N schedules.

    .venv/bin/python -m bench.scale_out [--schedules 400000] [--managers 1,2,4] [--out FILE]

For each manager count K: a fresh PostgreSQL database with ``--partitions`` partitions and N rows
``@every <period>s`` (every row due at the same instant, once per period; default 90 s), then K
``periodic-manager manager`` processes (``PM_COORDINATION=partitions``, Redis Streams target)
spawned at once (``--stagger S``: S seconds apart, as a manager started after the others).
Measured, per K:

* **cold start**: per manager, from its spawn to the "started with N entries" log line (the
  process is up; with partitions it registers its rows after that line, in the background), and
  to *settled*: the last change of its entry count and partitions (``pm_managers``,
  ``pm_partitions``) before the whole set settled, that is every partition held, none above the
  fair share, and the entry counts summing to N. Spawned together, the managers wait one lease
  round for one another before taking their shares; one whose first round came before any other
  registered takes every partition, then hands the excess over: both are inside the figure;
* **memory**: each manager's RSS (``/proc/<pid>/status``) once settled (and its peak so far,
  VmHWM) and after the burst, next to the RSS of one manager holding no schedule at all;
* **burst**: the next slot at least ``--lead`` s after settling: the first and the last of the N
  messages on the stream, by Redis's own entry ids, minus the slot; the count must be N;
* **Redis-only floor**: the same N tasks, prepared as the manager prepares them, sent by one
  client with pipelining (``bench/burst.py``'s floor), between slots once the burst's state is
  written;
* **state written**: the burst's rows of ``pm_schedule_state`` (one per schedule, written with
  one history row each) at the slot: how many, and when the last of them was written;
* **hand-over after SIGKILL** (K >= 2): one manager killed after the burst; the time until every
  partition is held again by a live manager (``pm_partitions``), and until the survivors'
  entries sum to N again.

Needs PostgreSQL (PM_BENCH_PG_DSN, default postgresql://postgres@127.0.0.1:5432) and Redis
(PM_BENCH_REDIS_URL); creates and drops its own databases and Redis keys.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from tempfile import mkdtemp

import asyncpg
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.burst import floor  # noqa: E402
from bench.failover import log_time  # noqa: E402
from bench.scale import PG, REDIS, Bench, machine  # noqa: E402
from tests.support.servers import ManagerProcess  # noqa: E402

POLL_S = 0.1
STALL_S = 15.0  # the burst's state rows are all written once their count has not moved this long

# Per manager: its entry count and the partitions it holds under a live lease.
STATE = """SELECT m.pid, m.manager_id, m.entry_count,
    (SELECT count(*) FROM pm_partitions p WHERE p.holder = m.manager_id AND p.expires_at > now())
    AS held FROM pm_managers m"""
STORED = "SELECT count(*) FROM pm_schedule_state WHERE last_slot_at >= $1"
HELD = "SELECT count(*) FROM pm_partitions WHERE holder = ANY($1::text[]) AND expires_at > now()"


@dataclass
class Result:
    managers: int
    schedules: int
    started_s: list[float] = field(default_factory=list)  # spawn -> "started with" line
    held_s: float = math.nan  # first spawn -> every partition held under a live lease
    settled_s: list[float] = field(default_factory=list)  # spawn -> last change before settled
    entries: list[int] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    peak_mb: list[float] = field(default_factory=list)  # VmHWM once settled
    rss_burst_mb: list[float] = field(default_factory=list)
    first_s: float = math.nan
    last_s: float = math.nan
    sent: int = 0
    floor_s: float = math.nan
    stored: int = 0  # state rows of the burst's slot written
    stored_s: float = math.nan  # slot -> the last of them written
    handover_s: float = math.nan  # SIGKILL -> every partition held again
    reregistered_s: float = math.nan  # SIGKILL -> the survivors' entries sum to N


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """The process's resident memory now (VmHWM: its peak so far), MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return math.nan


def manager_env(db: str, prefix: str, ttl: float | None) -> dict[str, str]:
    env = {
        "PM_DATABASE_URL": db,
        "PM_TARGET": "redis",
        "PM_REDIS_URL": REDIS,
        "PM_STREAM_PREFIX": prefix,
        "PM_COORDINATION": "partitions",
    }
    if ttl is not None:
        env["PM_LEASE_TTL"] = str(ttl)
    return env


async def wait_until(what: str, seconds: float, check, every: float = POLL_S) -> float:  # type: ignore[no-untyped-def]
    """Poll ``check()`` (async) every ``every`` s until true; the wall time (epoch s) it first
    was."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await check():
            return time.time()
        await asyncio.sleep(every)
    raise RuntimeError(f"not reached within {seconds} s: {what}")


async def settle(
    conn: asyncpg.Connection, procs: list[ManagerProcess], n: int, parts: int
) -> tuple[dict[int, tuple[float, int, int]], float]:
    """Poll until every partition is held fairly and the entries sum to ``n``; per pid, when its
    (entries, partitions) last changed and their final values; and when every partition was
    first held (by any of them)."""
    pids = {p.pid for p in procs}
    share = math.ceil(parts / len(procs))
    seen: dict[int, tuple[int, int]] = {}
    changed: dict[int, float] = {}
    all_held = [math.nan]

    async def settled() -> bool:
        now = time.time()
        rows = {
            r["pid"]: (int(r["entry_count"]), int(r["held"]))
            for r in await conn.fetch(STATE)
            if r["pid"] in pids
        }
        for pid, value in rows.items():
            if seen.get(pid) != value:
                seen[pid] = value
                changed[pid] = now
        if math.isnan(all_held[0]) and sum(h for _, h in rows.values()) == parts:
            all_held[0] = now
        return (
            set(rows) == pids
            and sum(h for _, h in rows.values()) == parts
            and all(0 < h <= share for _, h in rows.values())
            and sum(e for e, _ in rows.values()) == n
            and all("started with" in p.log() for p in procs)
        )

    await wait_until("every partition held fairly and every schedule registered", 300, settled)
    return {pid: (changed[pid], *seen[pid]) for pid in pids}, all_held[0]


async def stream_len(client: aioredis.Redis, stream: str) -> int:
    return int(await client.xlen(stream))


def entry_ms(entry_id: bytes) -> int:
    return int(entry_id.split(b"-")[0])


async def one(k: int, n: int, args: argparse.Namespace, tmp: Path) -> Result:
    res = Result(k, n)
    os.environ["PM_PARTITIONS"] = str(args.partitions)  # read by the migration
    async with Bench() as b:
        await b.insert(n, f"@every {args.period}s")
        conn = await asyncpg.connect(f"{PG}/{b.name}")
        client = aioredis.from_url(REDIS)
        stream = f"{{{b.prefix}:default}}:stream"
        procs = [
            ManagerProcess(
                manager_env(f"{PG}/{b.name}", b.prefix, args.lease_ttl), tmp / f"k{k}-m{i}.log"
            )
            for i in range(k)
        ]
        try:
            await conn.execute("VACUUM ANALYZE periodic_jobs")
            spawned: dict[int, float] = {}
            for i, p in enumerate(procs):
                if i and args.stagger:
                    await asyncio.sleep(args.stagger)  # a manager started later than the others
                spawned_at = time.time()
                p.start()
                spawned[p.pid] = spawned_at
            final, all_held = await settle(conn, procs, n, args.partitions)
            res.held_s = all_held - min(spawned.values())
            for p in procs:
                line = next(ln for ln in p.log().splitlines() if "started with" in ln)
                res.started_s.append(log_time(line).timestamp() - spawned[p.pid])
                at, entries, held = final[p.pid]
                res.settled_s.append(at - spawned[p.pid])
                res.entries.append(entries)
                res.partitions.append(held)
            await asyncio.sleep(2)  # the hand-overs' garbage collected, the heartbeats written
            res.rss_mb = [rss_mb(p.pid) for p in procs]
            res.peak_mb = [rss_mb(p.pid, "VmHWM") for p in procs]
            print(
                f"  {k} manager(s): settled, entries {res.entries}, RSS {[round(x) for x in res.rss_mb]} MB"
                f" (peak {[round(x) for x in res.peak_mb]} MB)",
                flush=True,
            )

            # The burst: the first slot at least --lead s from now (the one before, if any, was
            # over long ago: the count starts a second before the slot).
            slot = math.ceil((time.time() + args.lead) / args.period) * args.period
            await asyncio.sleep(max(0.0, slot - 1 - time.time()))
            before = await stream_len(client, stream)
            await asyncio.sleep(max(0.0, slot - time.time()))
            try:
                await wait_until(
                    f"{n} messages of slot {slot}",
                    args.period / 2,
                    lambda: _at_least(client, stream, before + n),
                )
            except RuntimeError as exc:
                print(f"  {exc}", flush=True)
            res.sent = await stream_len(client, stream) - before
            first = await client.xrange(stream, min=f"{slot * 1000}-0", count=1)
            last = await client.xrevrange(stream, max="+", count=1)
            if first and last:
                res.first_s = (entry_ms(first[0][0]) - slot * 1000) / 1000
                res.last_s = (entry_ms(last[0][0]) - slot * 1000) / 1000
            res.rss_burst_mb = [rss_mb(p.pid) for p in procs]
            print(f"  burst: {res.sent} sent, last {res.last_s:.2f} s after the slot", flush=True)

            # The burst's state rows (one per schedule, written with its history row): until all
            # are written, or the count has not moved for STALL_S.
            progress = [0, time.time()]

            async def stored() -> bool:
                done = int(await conn.fetchval(STORED, datetime.fromtimestamp(slot, UTC)))
                if done != progress[0]:
                    progress[:] = [done, time.time()]
                return done >= n or (done > 0 and time.time() - progress[1] > STALL_S)

            try:
                await wait_until(
                    "the burst's state and history written", args.period / 2, stored, 0.5
                )
            except RuntimeError as exc:
                print(f"  {exc}", flush=True)
            res.stored, res.stored_s = int(progress[0]), progress[1] - slot

            # The floor between slots, as bench/burst.py measures it.
            res.floor_s = await floor(n, b.prefix + "f")

            if k >= 2:
                rows = {
                    r["pid"]: r["manager_id"]
                    for r in await conn.fetch("SELECT pid, manager_id FROM pm_managers")
                }
                victim = procs[-1]
                missing = [p.pid for p in procs if p.pid not in rows]
                if missing:  # a manager whose row was reaped (its heartbeat came too late)
                    raise RuntimeError(f"no pm_managers row for the manager(s) of pid {missing}")
                alive = [rows[p.pid] for p in procs[:-1]]
                killed_at = time.time()
                victim.kill()

                async def held_again() -> bool:
                    return int(await conn.fetchval(HELD, alive)) == args.partitions

                async def registered_again() -> bool:
                    total = await conn.fetchval(
                        "SELECT sum(entry_count) FROM pm_managers WHERE manager_id = ANY($1::text[])",
                        alive,
                    )
                    return int(total or 0) == n

                res.handover_s = (
                    await wait_until("every partition held again", 120, held_again) - killed_at
                )
                res.reregistered_s = (
                    await wait_until("the entries registered again", 120, registered_again)
                    - killed_at
                )
                print(f"  SIGKILL: partitions held again after {res.handover_s:.2f} s", flush=True)
        finally:
            for p in procs:
                p.stop()
            await client.aclose()
            await conn.close()
    return res


async def _at_least(client: aioredis.Redis, stream: str, count: int) -> bool:
    return await stream_len(client, stream) >= count


async def baseline(args: argparse.Namespace, tmp: Path) -> float:
    """RSS of one manager holding every partition of an empty table."""
    os.environ["PM_PARTITIONS"] = str(args.partitions)
    async with Bench() as b:
        proc = ManagerProcess(
            manager_env(f"{PG}/{b.name}", b.prefix, args.lease_ttl), tmp / "empty.log"
        )
        proc.start()
        try:

            async def started() -> bool:
                return "started with" in proc.log()

            await wait_until("an empty manager started", 60, started)
            await asyncio.sleep(3)
            return rss_mb(proc.pid)
        finally:
            proc.stop()


def span(values: list[float], fmt: str = "{:.2f}") -> str:
    lo, hi = min(values), max(values)
    return (
        fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"
    )


def describe() -> list[str]:
    mem = "?"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    return [
        f"machine: {machine()}; {mem} RAM; commit {commit}",
        f"run at {datetime.now(UTC).isoformat(timespec='seconds')}",
    ]


def table(results: list[Result], empty_mb: float, args: argparse.Namespace) -> list[str]:
    out = [
        '| managers | schedules per manager | partitions per manager | spawn -> "started with" | first spawn -> every partition held | spawn -> settled (entries and partitions final) '
        "| RSS per manager settled | peak RSS per manager before the burst | RSS above an empty manager | RSS after the burst | burst: first / last message after the slot "
        "| tasks/s | Redis-only floor | last / floor | state rows of the slot written (+ as many history rows), slot -> last | SIGKILL -> every partition held | SIGKILL -> every schedule registered |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ok = r.sent == r.schedules
        burst = f"{r.first_s:.2f} / {r.last_s:.2f} s" + (
            "" if ok else f" ({r.sent:,} of {r.schedules:,} sent)"
        )
        stored = f"{r.stored:,} in {r.stored_s:.2f} s ({2 * r.stored / r.stored_s:,.0f} rows/s)"
        handover = "-" if r.managers < 2 else f"{r.handover_s:.2f} s"
        reregistered = "-" if r.managers < 2 else f"{r.reregistered_s:.2f} s"
        out.append(
            f"| {r.managers} | {span([float(e) for e in r.entries], '{:,.0f}')} | {span([float(p) for p in r.partitions], '{:.0f}')} "
            f"| {span(r.started_s)} s | {r.held_s:.2f} s | {span(r.settled_s)} s | {span(r.rss_mb, '{:.0f}')} MB | {span(r.peak_mb, '{:.0f}')} MB "
            f"| {span([x - empty_mb for x in r.rss_mb], '{:.0f}')} MB | {span(r.rss_burst_mb, '{:.0f}')} MB | {burst} "
            f"| {r.schedules / r.last_s:,.0f} | {r.floor_s:.2f} s | {r.last_s / r.floor_s:.2f} | {stored} "
            f"| {handover} | {reregistered} |"
        )
    out += [
        "",
        f"{args.schedules:,} schedules `@every {args.period}s` (all due at one instant), {args.partitions} partitions, "
        f"PM_LEASE_TTL={'default' if args.lease_ttl is None else f'{args.lease_ttl:g}'}; "
        f"{f'managers spawned {args.stagger:g} s apart' if args.stagger else 'managers spawned at once'}; one manager holding no schedule: {empty_mb:.0f} MB RSS.",
        "Per manager figures are ranges over the managers of the run (min-max).",
    ]
    return out


async def main(args: argparse.Namespace) -> str:
    tmp = Path(mkdtemp(prefix="pm-scale-out-"))
    lines = describe()
    print("\n".join(lines), flush=True)
    empty_mb = await baseline(args, tmp)
    results = []
    for k in [int(x) for x in args.managers.split(",")]:
        print(f"{k} manager(s) over {args.schedules:,} schedules", flush=True)
        results.append(await one(k, args.schedules, args, tmp))
    text = "\n".join([*lines, "", *table(results, empty_mb, args)]) + "\n"
    print(f"\nlogs: {tmp}\n\n{text}", flush=True)
    return text


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale_out", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--schedules",
        type=int,
        default=400_000,
        help="rows, all due at one instant (default 400,000)",
    )
    parser.add_argument(
        "--managers", default="1,2,4", help="manager counts, one run each (default 1,2,4)"
    )
    parser.add_argument(
        "--partitions", type=int, default=64, help="PM_PARTITIONS at migrate (default 64)"
    )
    parser.add_argument(
        "--lease-ttl",
        type=float,
        default=None,
        help="PM_LEASE_TTL, seconds (default: not set, the product's default)",
    )
    parser.add_argument(
        "--period",
        type=int,
        default=90,
        help="seconds between bursts (@every <period>s; default 90)",
    )
    parser.add_argument(
        "--lead",
        type=float,
        default=8.0,
        help="the burst's slot at least this long after settling (default 8 s)",
    )
    parser.add_argument(
        "--stagger",
        type=float,
        default=0.0,
        help="seconds between the managers' spawns (default 0: spawned at once)",
    )
    parser.add_argument("--out", default=None, help="also write the table to this file")
    parsed = parser.parse_args()
    output = asyncio.run(main(parsed))
    if parsed.out:
        Path(parsed.out).write_text(output)
