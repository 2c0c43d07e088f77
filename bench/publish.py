"""CPU a manager spends publishing a cold start's entries to PostgreSQL (pm_entries, for the API),
in-process: the part of Step 17's quiet window that is this process's own work.

    .venv/bin/python bench/publish.py [--rows 100000] [--repeat 3]

Rows as bench/lean.py seeds them (daily specs, payload {"n": i}, the schema's defaults), read by
the manager's provider as fresh entries before each trial (their payloads not yet in canonical
form, as on a cold start) and frozen out of the collector's sight as a sync does (the process's
collector policy, periodic_manager/gcpolicy.py, enabled as the commands do). ``publish``: CPU of the process (time.process_time) while an
EntryPublisher writes them all (records built, COPY, merge). ``floor``: CPU of copying the same
number of prebuilt rows of pm_entries' shape into a temporary table with the same driver call,
measured just before each trial: what any publication pays the driver. On a shared machine the
ratio is the figure to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lean import DAILY  # noqa: E402
from bench.scale import PG, Bench, machine, seed  # noqa: E402
from periodic_manager import gcpolicy  # noqa: E402
from periodic_manager.contracts import ManagerInfo, ManagerStatus  # noqa: E402
from periodic_manager.db.provider import DatabaseProvider  # noqa: E402
from periodic_manager.db.store import DatabaseRuntimeStore  # noqa: E402
from periodic_manager.engine.entry import ScheduledEntry  # noqa: E402
from periodic_manager.runtime.publishing import EntryPublisher  # noqa: E402


async def floor(name: str, n: int, now: datetime) -> float:
    """CPU of copying ``n`` prebuilt rows shaped like pm_entries' into a temporary table."""
    h = "0" * 64
    rows = [
        (
            "m",
            f"{i}-{h[:12]}",
            str(i),
            f"job.{i}",
            h,
            "active",
            now,
            "0 0 * * *",
            "UTC",
            None,
            "bench.task",
            "default",
            None,
            None,
            None,
            None,
            None,
        )
        for i in range(n)
    ]
    conn = await asyncpg.connect(f"{PG}/{name}")
    try:
        async with conn.transaction():
            await conn.execute("CREATE TEMP TABLE floor_in (LIKE pm_entries) ON COMMIT DROP")
            columns = [
                "manager_id",
                "entry_id",
                "schedule_key",
                "name",
                "content_hash",
                "status",
                "registered_at",
                "spec",
                "timezone",
                "anchor",
                "task_type",
                "queue",
                "last_error",
                "held_slot_at",
                "previous_task_id",
                "previous_task_state",
                "last_good_since",
            ]
            t0 = time.process_time()
            for i in range(0, n, 5000):
                await conn.copy_records_to_table(
                    "floor_in", records=rows[i : i + 5000], columns=columns
                )
            return time.process_time() - t0
    finally:
        await conn.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n = args.rows
    load = os.getloadavg()
    print(
        f"machine: {machine()}\nrun at {datetime.now(UTC).isoformat(timespec='seconds')}, load average {load[0]:.2f}\n"
    )
    print(
        "| trial | entries | floor CPU s | publish CPU s | publish / floor | us per entry |\n|---|---|---|---|---|---|"
    )
    gcpolicy.enable()  # as the periodic-manager commands do
    async with Bench() as b:
        conn = await asyncpg.connect(f"{PG}/{b.name}")
        await seed(conn, n, DAILY, by_row=True, prefix="job.")
        await conn.close()
        store = DatabaseRuntimeStore(b.engine)
        ratios = []
        for trial in range(args.repeat):
            now = datetime.now(UTC)
            provider = DatabaseProvider(b.engine)
            provider.adopt(ScheduledEntry, lambda row_id: False)
            entries = [
                ScheduledEntry.of(c, now, synced=True)
                for c in (await provider.get_configs()).configs
            ]
            gcpolicy.freeze()  # as a manager's sync does with what it built
            manager_id = f"bench-{trial}"
            await store.register_manager(
                ManagerInfo(manager_id, "bench", os.getpid(), "bench", now),
                ManagerStatus(now, True, None, None, n),
            )
            failed: list[BaseException] = []
            publisher = EntryPublisher(store, manager_id, on_failure=failed.append)
            for entry in entries:
                publisher.upsert(entry)
            base = await floor(b.name, n, now)
            t0 = time.process_time()
            await publisher.flush()
            cpu = time.process_time() - t0
            if failed:
                raise SystemExit(f"publishing failed: {failed[0]!r}")
            ratios.append(cpu / base)
            print(
                f"| {trial + 1} | {len(entries):,} | {base:.3f} | {cpu:.3f} | {cpu / base:.2f} | {cpu / len(entries) * 1e6:.1f} |",
                flush=True,
            )
            await store.unregister_manager(manager_id)
            del entries
    print(f"\nbest ratio {min(ratios):.2f}; finished at load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
