"""A bulk statement on periodic_jobs never stalls dispatch or the leadership proof.

The issue's reproduction: one INSERT of 100,000 rows made every other schedule fire 4-10 s late
and the leader lose and retake leadership, because the incremental sync validated and registered
every changed row without yielding. Here a real manager (real clock, PostgreSQL leadership,
LISTEN) takes such a statement while a watchdog on its event loop measures the longest stall.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import upgrade
from periodic_manager.runtime.assemble import build_manager
from periodic_manager.settings import Settings
from periodic_manager.targets.memory import MemoryTarget

ROWS = 100_000
STALL_BOUND_S = 1.0  # the leader proves itself every second and must answer within 2 s
SCHEDSTAT = Path("/proc/thread-self/schedstat")  # Linux: on CPU, waiting for a CPU (ns), slices


def waited() -> float:
    """Seconds the calling thread has spent ready to run while others had the CPUs (0 where the
    kernel does not say)."""
    try:
        return int(SCHEDSTAT.read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


async def test_a_100k_row_insert_never_stalls_dispatch_or_loses_leadership(pg_url: str) -> None:
    await upgrade(pg_url)
    dsn = pg_url.replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(dsn)
    await conn.execute(
        "INSERT INTO periodic_jobs (name, spec, task_type) VALUES ('heartbeat', '@every 1s', 't')"
    )
    settings = Settings(database_url=pg_url, sync_interval=3600, leader_election=True)
    engine = create_engine(pg_url)
    target = MemoryTarget()
    manager = build_manager(settings, engine, target=target)
    changes: list[bool] = []
    stalls: list[float] = []
    stop = asyncio.Event()

    async def watchdog() -> None:
        # A stall is the loop's own doing: the wall time between two wake-ups less the time its
        # thread was ready but other processes had the CPUs (a loaded machine, other tests).
        last, last_waited = time.monotonic(), waited()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now, now_waited = time.monotonic(), waited()
            stalls.append(now - last - 0.01 - (now_waited - last_waited))
            last, last_waited = now, now_waited

    try:
        await manager.start()
        assert manager.is_leader
        inner = manager.leadership._on_change  # type: ignore[attr-defined]
        manager.leadership._on_change = lambda leads: (changes.append(leads), inner(leads))[1]  # type: ignore[attr-defined]
        dog = asyncio.create_task(watchdog())
        started, started_waited = datetime.now(UTC), waited()
        await conn.execute(
            "INSERT INTO periodic_jobs (name, spec, task_type, payload)"
            " SELECT 'bulk.' || i, '0 3 * * *', 'bulk.task', jsonb_build_object('i', i)"
            " FROM generate_series(1, $1) AS i",
            ROWS,
        )
        deadline = time.monotonic() + 120
        while len(manager.entries()) < ROWS + 1:  # the LISTEN-triggered sync takes them all
            assert time.monotonic() < deadline, f"{len(manager.entries())} entries after 120 s"
            await asyncio.sleep(0.05)
        synced_in = datetime.now(UTC) - started
        # The window also holds a heartbeat slot due after the sync's rows were in (the sync may
        # take less than the heartbeat's second on a quiet machine): watched for, not slept for.
        while not [s for s in target.slots("heartbeat") if s >= started + synced_in]:
            assert time.monotonic() < deadline, "no heartbeat after the sync"
            await asyncio.sleep(0.05)
        finished, denied = datetime.now(UTC), waited() - started_waited
        stop.set()
        await dog
        held = list(changes)  # before stop(), which steps down
    finally:
        await manager.stop()
        await engine.dispose()
        await conn.close()
    worst = max(stalls)
    sent = [slot for slot in target.slots("heartbeat") if started <= slot <= finished]
    late = [
        (at - t.scheduled_at).total_seconds()
        for t, at in target.messages
        if started <= t.scheduled_at <= finished
    ]
    print(
        f"sync of {ROWS} new rows: {synced_in.total_seconds():.2f} s, worst loop stall"
        f" {worst * 1000:.0f} ms, {len(sent)} heartbeat slots meanwhile, worst lateness"
        f" {max(late, default=0) * 1000:.0f} ms ({denied * 1000:.0f} ms waiting for a CPU)"
    )
    assert held == []  # leadership held throughout
    assert worst < STALL_BOUND_S
    # The other schedule kept firing on time: late by no more than the bound, plus the time the
    # loop's thread was kept off the CPUs in the window (0 on a quiet machine; other tests' and
    # processes' doing on a loaded one, as the watchdog's stalls leave out).
    assert sent and max(late) < STALL_BOUND_S + denied, (
        f"{max(late):.2f} s late, {denied:.2f} s denied the CPU"
    )
