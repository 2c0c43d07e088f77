"""How soon a plain-SQL edit of ``periodic_jobs`` is live in a running manager, per database.

    .venv/bin/python bench/propagation.py [--edits 20] [--poll-interval 1]

For each database (PostgreSQL: LISTEN/NOTIFY; MariaDB/MySQL: the revision poller,
``PM_POLL_INTERVAL``; SQLite: the next sync, ``PM_SYNC_INTERVAL`` 30 s by default, so measured
with a 1 s sync interval and said so) a fresh database is migrated, a manager is assembled from
``Settings`` as ``periodic-manager manager`` assembles it (outbox target, wall clock), and the
spec of one row is changed ``--edits`` times with plain SQL on a connection of its own; each edit
is timed from its commit to the moment the manager's entry has the new spec. Prints a markdown
table (min, median, max in ms).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text  # noqa: E402

from periodic_manager.db.engine import create_engine  # noqa: E402
from periodic_manager.db.migrate import upgrade  # noqa: E402
from periodic_manager.runtime.assemble import build_manager  # noqa: E402
from periodic_manager.settings import Settings  # noqa: E402
from tests.conftest import new_mysql_database, new_pg_database  # noqa: E402
from tests.support.polling import eventually  # noqa: E402

SPECS = ("*/2 * * * *", "*/3 * * * *")


async def measure(url: str, edits: int, **settings: float) -> list[float]:
    await upgrade(url)
    writer = create_engine(url)
    async with writer.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO periodic_jobs (name, spec, task_type, options) VALUES ('p', '* * * * *', 't', '{}')"
            )
        )
    engine = create_engine(url)
    manager = build_manager(Settings(database_url=url, target="outbox", **settings), engine)
    await manager.start()
    took: list[float] = []
    try:
        await eventually(lambda: bool(manager.entries()), "the row synced", interval=0.01)
        for i in range(edits):
            spec = SPECS[i % 2]
            async with writer.begin() as conn:
                await conn.execute(text(f"UPDATE periodic_jobs SET spec = '{spec}'"))
            committed = time.perf_counter()
            await eventually(
                lambda: [e.config.spec for e in manager.entries()] == [spec],  # noqa: B023
                "the edit synced",
                interval=0.005,
            )
            took.append((time.perf_counter() - committed) * 1000)
            await asyncio.sleep(0.137 * (i % 7))  # edits at varied moments of the poll cycle
    finally:
        await manager.stop()
        await engine.dispose()
        await writer.dispose()
    return took


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    args = parser.parse_args()
    rows = []
    async with new_pg_database() as url:
        rows.append(("PostgreSQL (LISTEN/NOTIFY)", await measure(url, args.edits)))
    async with new_mysql_database() as url:
        label = f"MariaDB (poll every {args.poll_interval:g} s)"
        rows.append((label, await measure(url, args.edits, poll_interval=args.poll_interval)))
    with tempfile.TemporaryDirectory() as tmp:
        label = "SQLite (next sync; sync interval 1 s here, 30 s by default)"
        rows.append((label, await measure(f"sqlite:///{tmp}/pm.db", args.edits, sync_interval=1.0)))
    print("| database | edits | min ms | median ms | max ms |\n| --- | --- | --- | --- | --- |")
    for label, took in rows:
        print(
            f"| {label} | {len(took)} | {min(took):.0f} | {statistics.median(took):.0f} | {max(took):.0f} |"
        )


if __name__ == "__main__":
    asyncio.run(main())
