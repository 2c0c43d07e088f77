"""Step 17 goals, measured from outside on the real command `periodic-manager manager` (PostgreSQL
provider and store, Redis Streams target), as an operator starts it.

    .venv/bin/python bench/lean.py [coldstart|rest|sync|all] [--sizes 100000,1000000] [--repeat 3]

Each case spawns the command with its own database (``<prefix>_<rows>``, made once per run and
dropped at the end) and its own Redis key prefix (Redis: --redis-url, else PM_BENCH_REDIS_URL),
and times it beside floors measured in the same run:

- start: spawn until the log line ``started with N entries`` (the line operators and benches time
  starts by); ``empty``: the same command on a table of one row; floors: ``python -c pass`` and a
  fresh asyncpg connection reading ``SELECT * FROM periodic_jobs`` of the same table (timed
  before and after each start, the better of the two).
- quiet: from "started" until the command's CPU, read from /proc/<pid>/stat every 0.1 s, stays
  below 10 % of a core over 3 s (the publishing of the entries for the API is done; a 3 s
  window is not fooled by a wait on the database between two busy moments).
- RSS (/proc/<pid>/status) at "started" and at rest (1 s after quiet).
- CPU-s to "started": the command's own CPU from spawn to the line (less moved by a loaded
  machine than the wall times: compare two commands by it there).
- ``--probe`` (coldstart): the machine's own speed during each start. This VM's CPUs run the same
  work 1.3-1.7x slower for seconds at a time (the host's other guests; no ``steal`` shows it,
  no work in the guest causes it), and a start's CPU-s follow (bench/lean.txt, "two kinds of
  start"). A process pinned to each CPU times a fixed loop every 50 ms (~5 % of each core);
  the row gives that loop's CPU time during the start and the start's CPU in such loops (the
  work, whatever the machine's speed of the moment: compare commands by it).
- rest: 10,000 schedules none of which is due during the run; CPU-seconds the command uses per
  minute once quiet (after 5 s more), and its RSS.
- sync (in-process, kept because no command exposes it): the cost of a sync of 100,000 rows (of
  each of --sizes with ``sync`` alone) when nothing changed, when 1 % changed, a full reconcile
  that lists every row, and one due when nothing was written since the last (PostgreSQL's
  digest), inside one manager, with the manager's own CPU beside the full reconciles.

Rows: daily specs spread over the day (a cold start) or yearly ones on 1 January (at rest, none
due), payload {"n": i}, the schema's defaults. Goals: 100k start <= empty + 2x its fetch floor;
quiet within 2 s of "started" (100k); 1M start <= empty + 2x its fetch floor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import scale  # noqa: E402
from bench.scale import PG, REDIS, Bench, machine, timed, verdict  # noqa: E402
from periodic_manager.db.provider import DatabaseProvider  # noqa: E402
from periodic_manager.targets.redis.streams import RedisStreamsTarget  # noqa: E402

COMMAND = [str(Path(sys.executable).with_name("periodic-manager")), "manager"]
TICK = os.sysconf("SC_CLK_TCK")
QUIET_SHARE = 0.10  # of a core
QUIET_WINDOW = 3.0  # s: longer than a wait on the database between two busy moments
SAMPLE = 0.1  # s
REST_ROWS = 10_000
PROBE_EVERY = 0.05  # s
# Pinned to one CPU, time (CPU-s) a fixed loop every PROBE_EVERY s; one line "<epoch> <CPU-s>"
# per loop, flushed, to the file named.
PROBE_CODE = f"""
import os, sys, time
os.sched_setaffinity(0, {{int(sys.argv[1])}})
with open(sys.argv[2], "a", buffering=1) as out:
    while True:
        t, c0 = time.time(), time.process_time()
        x = 0
        for i in range(15_000):
            x += i ^ 5
        out.write(f"{{t}} {{time.process_time() - c0}}\\n")
        time.sleep({PROBE_EVERY})
"""
DAILY = "(g % 60) || ' ' || (g / 60 % 24) || ' * * *'"
YEARLY = "(g % 60) || ' ' || (g / 60 % 24) || ' 1 1 *'"  # 1 January: none due in a run


# -- databases and floors ----------------------------------------------------------------------


def db_url(name: str) -> str:
    return f"{PG.replace('postgresql://', 'postgresql+asyncpg://')}/{name}"


def make_db(name: str, n: int, spec_sql: str) -> None:
    asyncio.run(drop_db(name))
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    # Migrated by the command measured (its schema head, whatever version it is).
    subprocess.run(
        [COMMAND[0], "migrate"],
        env={**os.environ, "PM_DATABASE_URL": db_url(name)},
        check=True,
        capture_output=True,
    )
    asyncio.run(_fill(name, n, spec_sql))


async def _admin(sql: str) -> None:
    admin = await asyncpg.connect(f"{PG}/postgres")
    try:
        await admin.execute(sql)
    finally:
        await admin.close()


async def _fill(name: str, n: int, spec_sql: str) -> None:
    conn = await asyncpg.connect(f"{PG}/{name}")
    try:
        await scale.seed(conn, n, spec_sql, by_row=True, prefix="job.")
        await conn.execute("VACUUM ANALYZE periodic_jobs")
    finally:
        await conn.close()


async def drop_db(name: str) -> None:
    await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def fetch_floor(name: str) -> float:
    """A fresh asyncpg connection reading every row of periodic_jobs (connect included)."""
    t0 = time.perf_counter()
    conn = await asyncpg.connect(f"{PG}/{name}")
    rows = await conn.fetch("SELECT * FROM periodic_jobs")
    took = time.perf_counter() - t0
    await conn.close()
    del rows
    return took


def python_floor(times: int = 5) -> float:
    runs = []
    for _ in range(times):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


async def redis_floor(times: int = 200) -> float:
    """Median PING round trip, in ms."""
    client = aioredis.from_url(REDIS)
    runs = []
    for _ in range(times):
        t0 = time.perf_counter()
        await client.ping()
        runs.append(time.perf_counter() - t0)
    await client.aclose()
    return statistics.median(runs) * 1000


async def clear_prefix(prefix: str) -> None:
    client = aioredis.from_url(REDIS)
    # The target's keys carry the prefix in a hash tag: {prefix}:sentinel, {prefix:queue}:stream.
    keys = [k async for k in client.scan_iter(match=f"*{prefix}*", count=1000)]
    for i in range(0, len(keys), 1000):
        await client.delete(*keys[i : i + 1000])
    await client.aclose()


class SpeedProbe:
    """The machine's speed as one fixed loop's CPU time, timed on every CPU (see --probe)."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="pmlean-probe")
        self.procs = [
            subprocess.Popen([sys.executable, "-c", PROBE_CODE, str(cpu), f"{self.dir}/{cpu}"])
            for cpu in sorted(os.sched_getaffinity(0))
        ]
        time.sleep(1.0)  # started and looping

    def loop_ms(self, since: float, until: float) -> float:
        """The mean CPU time of the loop, in ms, over the samples taken between two epochs."""
        taken = []
        for name in os.listdir(self.dir):
            with open(f"{self.dir}/{name}") as f:
                for line in f:
                    t, c = line.split()
                    if since <= float(t) <= until:
                        taken.append(float(c))
        return statistics.mean(taken) * 1000 if taken else float("nan")

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        for name in os.listdir(self.dir):
            os.unlink(f"{self.dir}/{name}")
        os.rmdir(self.dir)


# -- the spawned command ----------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def cpu_exact_s(pid: int) -> float:
    """CPU time of every live thread of ``pid`` to the nanosecond (/proc/<pid>/task/*/schedstat:
    user and kernel), where /proc/<pid>/stat counts clock ticks (10 ms: a fifth of the rest goal
    over a minute)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    return total / 1e9


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def spawn(db: str, *, rest_seconds: float = 0, timeout: float = 180) -> dict[str, Any]:
    """Run the command on ``db`` until it is quiet (and ``rest_seconds`` more), then SIGTERM."""
    prefix = f"pmlean{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PM_DATABASE_URL": db_url(db),
        "PM_TARGET": "redis",
        "PM_REDIS_URL": REDIS,
        "PM_STREAM_PREFIX": prefix,
        "PM_LOG_LEVEL": "INFO",
    }
    lines: queue.Queue[tuple[float, str | None]] = queue.Queue()
    out: dict[str, Any] = {"db": db, "since": time.time()}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        COMMAND, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put((time.perf_counter(), line))
        lines.put((time.perf_counter(), None))  # the command ended

    threading.Thread(target=drain, daemon=True).start()
    try:
        said: list[str] = []
        while True:
            at, line = lines.get(timeout=timeout)
            if line is None:
                raise RuntimeError("the command ended before it started:\n" + "".join(said[-10:]))
            said.append(line)
            if "started with" in line:
                out["start"] = at - t0
                out["until"] = out["since"] + out["start"]
                out["entries"] = int(line.split("started with ")[1].split()[0])
                break
        started = time.perf_counter()
        out["cpu_at_start"] = cpu_s(proc.pid)
        out["rss_start"] = rss_mb(proc.pid)
        samples: list[tuple[float, float]] = []
        quiet_at = None
        while time.perf_counter() - started < timeout:
            samples.append((time.perf_counter(), cpu_s(proc.pid)))
            # The first sample from which the next QUIET_WINDOW used < QUIET_SHARE of a core.
            for i, (t, c) in enumerate(samples):
                later = [(t2, c2) for t2, c2 in samples[i:] if t2 - t >= QUIET_WINDOW]
                if later:
                    t2, c2 = later[0]
                    if (c2 - c) / (t2 - t) < QUIET_SHARE:
                        quiet_at = t
                        break
            if quiet_at is not None:
                break
            samples = samples[-int(3 * QUIET_WINDOW / SAMPLE) :]
            time.sleep(SAMPLE)
        out["quiet"] = None if quiet_at is None else max(0.0, quiet_at - started)
        out["cpu_to_quiet"] = cpu_s(proc.pid) - out["cpu_at_start"]
        time.sleep(1.0)
        out["rss_rest"] = rss_mb(proc.pid)
        if rest_seconds:
            time.sleep(5.0)
            c0, w0 = cpu_exact_s(proc.pid), time.perf_counter()
            time.sleep(rest_seconds)
            c1, w1 = cpu_exact_s(proc.pid), time.perf_counter()
            out["cpu_per_min"] = (c1 - c0) / (w1 - w0) * 60
            out["rss_rest"] = rss_mb(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        asyncio.run(clear_prefix(prefix))
    return out


# -- parts --------------------------------------------------------------------------------------


def coldstart(sizes: list[int], repeat: int, db_prefix: str, probe: bool = False) -> None:
    empty_db = f"{db_prefix}_1"
    make_db(empty_db, 1, DAILY)
    for n in sizes:
        make_db(f"{db_prefix}_{n}", n, DAILY)
    print(f"`python -c pass`: {python_floor() * 1000:.0f} ms (median of 5)\n")
    print(
        '| schedules | start (spawn -> "started") | empty start (1 row) | fetch floor | goal: <= empty + 2x floor'
        ' | (start - empty) / floor | verdict | quiet after "started" | goal | verdict'
        ' | CPU-s to "started" | CPU-s after "started" | RSS at start / at rest |'
        + (' probe loop during the start | CPU to "started" in probe loops |' if probe else "")
    )
    print(
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if probe else ""),
        flush=True,
    )
    speed = SpeedProbe() if probe else None
    results: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    for _ in range(repeat):
        for n in sizes:
            db = f"{db_prefix}_{n}"
            empty = spawn(empty_db)
            floor_before = asyncio.run(fetch_floor(db))
            r = spawn(db)
            floor = min(floor_before, asyncio.run(fetch_floor(db)))
            r.update(empty=empty["start"], floor=floor)
            if speed is not None:
                r["probe_ms"] = speed.loop_ms(r["since"], r["until"])
            results[n].append(r)
            print(row(n, r), flush=True)
    if repeat > 1:
        for n in sizes:
            runs = results[n]
            med = {
                k: statistics.median(x[k] for x in runs)
                for k in (
                    "start",
                    "empty",
                    "floor",
                    "rss_start",
                    "rss_rest",
                    "cpu_at_start",
                    "cpu_to_quiet",
                )
            }
            quiets = [x["quiet"] for x in runs]
            med["quiet"] = None if None in quiets else statistics.median(quiets)
            med["entries"] = runs[0]["entries"]
            if speed is not None:
                med["probe_ms"] = statistics.median(x["probe_ms"] for x in runs)
                med["loops"] = statistics.median(x["cpu_at_start"] / x["probe_ms"] for x in runs)
            print(row(n, med, label=f"{n:,} (median of {len(runs)})"), flush=True)
    if speed is not None:
        speed.close()
    print()
    for n in sizes:
        asyncio.run(drop_db(f"{db_prefix}_{n}"))
    asyncio.run(drop_db(empty_db))


def row(n: int, r: dict[str, Any], label: str | None = None) -> str:
    goal = r["empty"] + 2 * r["floor"]
    ok = r["start"] <= goal and r["entries"] == n
    ratio = (r["start"] - r["empty"]) / r["floor"]
    quiet = r["quiet"]
    quiet_text = "not within the timeout" if quiet is None else f"{quiet:.2f} s"
    probe = ""
    if "probe_ms" in r:
        loops = r.get("loops", r["cpu_at_start"] / r["probe_ms"])  # CPU-s / ms: thousands
        probe = f" {r['probe_ms']:.2f} ms | {loops * 1000:,.0f} |"
    if n <= 100_000:
        quiet_goal, quiet_ok = "<= 2 s", verdict(quiet is not None and quiet <= 2.0)
    else:
        quiet_goal, quiet_ok = "(none)", "-"
    return (
        f"| {label or f'{n:,}'} | {r['start']:.2f} s | {r['empty']:.2f} s | {r['floor']:.2f} s | <= {goal:.2f} s"
        f" | {ratio:.2f} | {verdict(ok)} | {quiet_text} | {quiet_goal} | {quiet_ok}"
        f" | {r['cpu_at_start']:.2f} | {r['cpu_to_quiet']:.2f} | {r['rss_start']:.0f} / {r['rss_rest']:.0f} MB |"
        + probe
    )


def rest(repeat: int, db_prefix: str, seconds: float) -> None:
    db = f"{db_prefix}_rest"
    make_db(db, REST_ROWS, YEARLY)
    print(
        f"| schedules, none due | CPU at rest (over {seconds:.0f} s) | goal | verdict | RSS at rest"
        ' | start | quiet after "started" |'
    )
    print("|---|---|---|---|---|---|---|", flush=True)
    for _ in range(repeat):
        r = spawn(db, rest_seconds=seconds)
        cpu = r["cpu_per_min"]
        quiet = "-" if r["quiet"] is None else f"{r['quiet']:.2f} s"
        print(
            f"| {REST_ROWS:,} | {cpu:.3f} CPU-s per minute ({cpu / 60 * 100:.3f} % of a core)"
            f" | <= 0.02 CPU-s per minute, <= 55 MB | {verdict(cpu <= 0.02 and r['rss_rest'] <= 55)}"
            f" | {r['rss_rest']:.0f} MB"
            f" | {r['start']:.2f} s | {quiet} |",
            flush=True,
        )
    print()
    asyncio.run(drop_db(db))


async def sync_cost(n: int) -> list[str]:
    rows = []
    async with Bench() as b:
        conn = await asyncpg.connect(f"{PG}/{b.name}")
        await scale.seed(conn, n, DAILY, by_row=True, prefix="job.")
        mgr = b.manager(RedisStreamsTarget.from_url(REDIS, prefix=b.prefix), close_target=True)
        await mgr.start()
        await mgr.flush()
        try:
            nothing = await timed(lambda: mgr.sync(), 5)
            rows.append(
                f"| {n:,} | nothing changed | {nothing * 1000:.1f} ms | <= 10 ms | {verdict(nothing <= 0.01)} |"
            )
            counter = iter(range(100))

            async def one_percent() -> None:
                await conn.execute(
                    "UPDATE periodic_jobs SET spec = $1 WHERE id % 100 = 0",
                    f"{next(counter)} 5 * * *",
                )
                await mgr.sync()

            changed = await timed(one_percent, 3)
            rows.append(
                f"| {n:,} | 1% changed (includes the UPDATE) | {changed * 1000:.1f} ms | (proportional) | - |"
            )
            await mgr.flush()
            cpu = time.process_time()
            full = await timed(lambda: mgr.sync(full=True), 3)
            cpu = (time.process_time() - cpu) / 3
            rows.append(
                f"| {n:,} | full reconcile (every (id, revision) pair listed) | {full * 1000:.1f} ms"
                f" ({cpu * 1000:.1f} ms of this process's CPU) | <= 300 ms | {verdict(full <= 0.3)} |"
            )
            # What a full reconcile due at rest costs on PostgreSQL since the digest: nothing was
            # written since the full read above, so it is that one query (the sync's housekeeping
            # aside: forgetting retired entries, the tombstone prune).
            assert isinstance(mgr.provider, DatabaseProvider)
            provider = mgr.provider

            async def digest() -> None:
                assert await provider.unchanged_since_full()

            cpu = time.process_time()
            due = await timed(digest, 5)
            cpu = (time.process_time() - cpu) / 5
            rows.append(
                f"| {n:,} | full reconcile due, nothing written since the last (the digest) |"
                f" {due * 1000:.1f} ms ({cpu * 1000:.1f} ms of this process's CPU) | - | - |"
            )
        finally:
            await conn.close()
            await mgr.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "part", nargs="?", default="all", choices=["coldstart", "rest", "sync", "all"]
    )
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rest-seconds", type=float, default=60.0)
    parser.add_argument(
        "--probe",
        action="store_true",
        help="coldstart: time a fixed loop on every CPU during each start (the machine's speed; ~5 %% of each core)",
    )
    parser.add_argument(
        "--command", default=None, help="the periodic-manager executable (default: this venv's)"
    )
    parser.add_argument(
        "--db-prefix", default="pm_lean", help="databases made (and dropped): <prefix>_<rows>"
    )
    parser.add_argument(
        "--redis-url",
        default=None,
        help="Redis of the target (default: PM_BENCH_REDIS_URL, else DB 0)",
    )
    args = parser.parse_args()
    if args.redis_url:
        global REDIS
        REDIS = scale.REDIS = args.redis_url
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.command:
        COMMAND[0] = args.command
    load = os.getloadavg()
    print(
        f"machine: {machine()}; Redis floor (PING round trip, median of 200): {asyncio.run(redis_floor()):.3f} ms\n"
        f"run at {datetime.now(UTC).isoformat(timespec='seconds')}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
        f"\ncommand: {' '.join(COMMAND)}\n",
        flush=True,
    )
    if args.part in ("coldstart", "all"):
        coldstart(sizes, args.repeat, args.db_prefix, probe=args.probe)
    if args.part in ("rest", "all"):
        rest(args.repeat, args.db_prefix, args.rest_seconds)
    if args.part in ("sync", "all"):
        sync_sizes = sizes if args.part == "sync" else [100_000]
        print(
            f"In-process (one manager, no command): a sync of {', '.join(f'{n:,}' for n in sync_sizes)} rows.\n"
        )
        print("| schedules | sync | time (best of 3-5) | goal | verdict |\n|---|---|---|---|---|")
        for n in sync_sizes:
            for line in asyncio.run(sync_cost(n)):
                print(line, flush=True)
        print()
    print(
        f"finished at {datetime.now(UTC).isoformat(timespec='seconds')}, load average {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
