"""Two `periodic-manager manager` commands at rest side by side, over the same window (Step 17).

    .venv/bin/python bench/rest_pair.py --a OTHER/.venv/bin/periodic-manager [--b THIS] [--rounds 3]

`bench/lean.py rest` runs one command after the other; at 0.02 CPU-seconds a minute what else
the machine does in each window moves the figure by more than a change does. Here both commands
run at once, each on its own database of 10,000 schedules none of which is due (the rows of
`bench/lean.py rest`), and their CPU (`/proc/<pid>/task/*/schedstat`, to the nanosecond) is
read over the same window, once both have been up for ``--settle`` seconds. The process's
wake-ups are counted too: CPU read every 10 ms, and a wake-up is a run of readings that moved,
50 ms apart at most. Printed: one row per round, then the ratio B / A of the totals.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import lean, scale  # noqa: E402
from bench.scale import machine  # noqa: E402

STEP = 0.01  # s between CPU readings
GAP = 0.05  # s: readings that moved closer than this are one wake-up


def start(command: str, db: str) -> tuple[subprocess.Popen[bytes], str]:
    prefix = f"pmpair{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PM_DATABASE_URL": lean.db_url(db),
        "PM_TARGET": "redis",
        "PM_REDIS_URL": scale.REDIS,
        "PM_STREAM_PREFIX": prefix,
        "PM_LOG_LEVEL": "WARNING",
    }
    proc = subprocess.Popen(
        [command, "manager"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return proc, prefix


def watch(pids: list[int], seconds: float) -> list[tuple[float, int]]:
    """CPU-seconds used and wake-ups of each of ``pids`` over the same ``seconds``."""
    first = [lean.cpu_exact_s(p) for p in pids]
    last = list(first)
    moved_at: list[float | None] = [None for _ in pids]
    wakes = [0 for _ in pids]
    end = time.perf_counter() + seconds
    while (now := time.perf_counter()) < end:
        time.sleep(STEP)
        for i, pid in enumerate(pids):
            cpu = lean.cpu_exact_s(pid)
            if cpu != last[i]:
                seen = moved_at[i]
                if seen is None or now - seen > GAP:
                    wakes[i] += 1
                moved_at[i] = now
                last[i] = cpu
    return [(last[i] - first[i], wakes[i]) for i in range(len(pids))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--a", required=True, help="the periodic-manager executable to compare against"
    )
    parser.add_argument("--b", default=lean.COMMAND[0], help="the other one (default: this venv's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--settle", type=float, default=30.0)
    parser.add_argument("--db-prefix", default="pm_pair")
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    if args.redis_url:
        scale.REDIS = lean.REDIS = args.redis_url
    dbs = {"A": f"{args.db_prefix}_a", "B": f"{args.db_prefix}_b"}
    commands = {"A": args.a, "B": args.b}
    for name, db in dbs.items():
        lean.COMMAND[0] = commands[name]  # each database migrated by its own command
        lean.make_db(db, lean.REST_ROWS, lean.YEARLY)
    load = os.getloadavg()
    print(
        f"machine: {machine()}\nrun at {datetime.now(UTC).isoformat(timespec='seconds')}, load average"
        f" {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\nA: {args.a}\nB: {args.b}\n"
        f"{lean.REST_ROWS:,} schedules none due, each command on its own database; CPU over the same"
        f" {args.seconds:.0f} s, {args.settle:.0f} s after both started\n",
        flush=True,
    )
    print(
        "| round | A: CPU-s per minute | A: wake-ups per minute | B: CPU-s per minute | B: wake-ups per minute | B / A |"
    )
    print("|---|---|---|---|---|---|", flush=True)
    totals = {"A": 0.0, "B": 0.0}
    for r in range(1, args.rounds + 1):
        procs = {name: start(commands[name], dbs[name]) for name in ("A", "B")}
        try:
            time.sleep(args.settle)
            for name, (proc, _) in procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} ended early (exit {proc.returncode})")
            (ca, wa), (cb, wb) = watch([procs["A"][0].pid, procs["B"][0].pid], args.seconds)
        finally:
            for proc, prefix in procs.values():
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
                asyncio.run(lean.clear_prefix(prefix))
        per = 60 / args.seconds
        totals["A"] += ca
        totals["B"] += cb
        print(
            f"| {r} | {ca * per:.4f} | {wa * per:.1f} | {cb * per:.4f} | {wb * per:.1f} | {cb / ca:.2f} |",
            flush=True,
        )
    print(f"\nB / A over every round: {totals['B'] / totals['A']:.2f}")
    for db in dbs.values():
        asyncio.run(lean.drop_db(db))
    print(
        f"finished at {datetime.now(UTC).isoformat(timespec='seconds')}, load average {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
