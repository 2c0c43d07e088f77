"""A manager at rest on PostgreSQL (``PM_COORDINATION=partitions``, the default): what it sends
to the database, counted on a virtual clock (never timed). Its lease rounds carry its heartbeat:
one statement every ``ttl / 3`` does both, and nothing else reaches the database in a quiet
minute."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from asyncpg.connection import Connection
from sqlalchemy import event

from periodic_manager.clock import VirtualClock
from periodic_manager.db.engine import create_engine
from periodic_manager.db.leases import ROUND, ROUND_BEAT
from periodic_manager.db.managers import BEAT_PG
from periodic_manager.db.migrate import upgrade
from periodic_manager.db.provider import DatabaseProvider
from periodic_manager.db.store import DatabaseRuntimeStore
from periodic_manager.runtime.assemble import build_manager
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.runtime.partitions import PartitionLeases
from periodic_manager.settings import Settings
from tests.support.faults import dsn, insert_schedules

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


class Statements:
    """Every statement sent to PostgreSQL by any connection of this process: asyncpg's own
    (fetch*, execute) and SQLAlchemy's (prepared through the driver)."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def of(self, text: str) -> int:
        return sum(1 for q in self.sent if q == text)

    def others(self, *texts: str) -> list[str]:
        return [q for q in self.sent if q not in texts]


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[Statements]:
    seen = Statements()
    execute, run = Connection.execute, Connection._execute

    async def counted_execute(self: Connection, query: str, *args: Any, **kw: Any) -> Any:
        if not args:  # with arguments it goes through _execute (counted there)
            seen.sent.append(query)
        return await execute(self, query, *args, **kw)

    async def counted_run(self: Connection, query: str, args: Any, *rest: Any, **kw: Any) -> Any:
        seen.sent.append(query)
        return await run(self, query, args, *rest, **kw)

    monkeypatch.setattr(Connection, "execute", counted_execute)
    monkeypatch.setattr(Connection, "_execute", counted_run)
    yield seen


@pytest.fixture
async def rest(
    pg_url: str, statements: Statements
) -> AsyncIterator[tuple[PeriodicTaskManager, VirtualClock]]:
    await upgrade(pg_url)
    await insert_schedules(pg_url, [(f"y{i}", "0 0 1 1 *", {}) for i in range(1, 21)])  # none due
    settings = Settings(
        database_url=pg_url,
        target="outbox",  # the default lease TTL (15 s) and heartbeat (5 s)
        sync_interval=3600,
        full_sync_interval=3600,
        listen=False,
    )
    clock = VirtualClock(T0)
    engine = create_engine(pg_url)
    mgr = build_manager(settings, engine, clock=clock)
    assert isinstance(mgr.leadership, PartitionLeases) and isinstance(
        mgr.store, DatabaseRuntimeStore
    )
    await mgr.start()
    try:
        yield mgr, clock
    finally:
        await mgr.stop()
        await engine.dispose()


class SlowPrune:
    """A history prune that runs until released (after a burst, under load)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, *_args: Any, **_kw: Any) -> int:
        self.started.set()
        await self.release.wait()
        return 0


async def drive(mgr: PeriodicTaskManager, clock: VirtualClock, seconds: float) -> None:
    async def settle() -> None:
        assert isinstance(mgr.leadership, PartitionLeases)
        await mgr.leadership.quiet()
        await mgr.wait_settled(clock.now())

    for _ in range(int(seconds * 2)):
        await clock.advance(0.5, settle=settle)


async def test_the_lease_rounds_carry_the_heartbeat_one_statement_a_round(
    rest: tuple[PeriodicTaskManager, VirtualClock], statements: Statements, pg_url: str
) -> None:
    mgr, clock = rest
    await drive(mgr, clock, 30)  # the start's publishing and its first prune timer are behind
    sent_sql: list[str] = []

    def sa(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent_sql.append(statement)

    assert isinstance(mgr.store, DatabaseRuntimeStore)
    event.listen(mgr.store.engine.sync_engine, "before_cursor_execute", sa)
    statements.sent.clear()
    await drive(mgr, clock, 60)
    # 12 rounds in a minute (every 15/3 s, the heartbeat's period), each one statement with the
    # heartbeat in it; no heartbeat of its own (12 a minute before), nothing else.
    assert statements.of(ROUND_BEAT) == 12, statements.sent
    assert statements.of(BEAT_PG) == statements.of(ROUND) == 0
    assert statements.others(ROUND_BEAT) == [] and sent_sql == []
    # What the heartbeat row carries is right (the managers page reads it).
    admin = await asyncpg.connect(dsn(pg_url))
    try:
        row = await admin.fetchrow(
            "SELECT heartbeat_at, is_leader, entry_count, last_sync_at FROM pm_managers"
            " WHERE manager_id = $1",
            mgr.manager_id,
        )
        assert row is not None
        assert clock.now() - row["heartbeat_at"] < timedelta(seconds=5)
        assert row["is_leader"] is True and row["entry_count"] == 20
        assert row["last_sync_at"] == mgr.last_sync_at
        # A manager that was reaped (its row gone, its entries with it) registers again at the
        # next round: the round finds no row to beat.
        await admin.execute("DELETE FROM pm_managers WHERE manager_id = $1", mgr.manager_id)
        await drive(mgr, clock, 6)  # the next round (5 s at most), then the heartbeat registers
        assert (
            await admin.fetchval(
                "SELECT count(*) FROM pm_entries WHERE manager_id = $1", mgr.manager_id
            )
            == 20
        )
        statements.sent.clear()
        await drive(mgr, clock, 15)
        assert statements.of(BEAT_PG) == 0 and statements.of(ROUND_BEAT) == 3  # carried again
    finally:
        await admin.close()


async def test_a_dead_managers_reap_never_holds_up_a_lease_round(
    rest: tuple[PeriodicTaskManager, VirtualClock], statements: Statements, pg_url: str
) -> None:
    """A manager killed with many entries is reaped apart from the rounds: here its row stays
    locked (a slow reap, as under load the cascade of 137,500 entries was) while the rounds go
    on renewing every partition. When the reap ran inside the round's statement, every round
    of the survivors waited on it past its bound and they lost every partition."""
    mgr, clock = rest
    assert isinstance(mgr.leadership, PartitionLeases)
    await drive(mgr, clock, 6)
    admin = await asyncpg.connect(dsn(pg_url))
    blocker = await asyncpg.connect(dsn(pg_url))
    try:
        await admin.execute(
            "INSERT INTO pm_managers (manager_id, hostname, pid, version, started_at, heartbeat_at)"
            " VALUES ('dead', 'h', 1, 'v', $1, $1)",
            T0 - timedelta(hours=1),
        )
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("SELECT 1 FROM pm_managers WHERE manager_id = 'dead' FOR UPDATE")
        statements.sent.clear()
        await drive(mgr, clock, 30)  # six rounds; a lease is trusted 12 s after its renewal
        assert mgr.leadership.held == frozenset(range(64))
        assert statements.of(ROUND_BEAT) == 6
        assert (
            await admin.fetchval("SELECT count(*) FROM pm_managers WHERE manager_id = 'dead'") == 1
        )
        await tx.rollback()  # the reap goes through
        for _ in range(100):
            if not await admin.fetchval(
                "SELECT count(*) FROM pm_managers WHERE manager_id = 'dead'"
            ):
                break
            await drive(mgr, clock, 0.5)
        assert not await admin.fetchval(
            "SELECT count(*) FROM pm_managers WHERE manager_id = 'dead'"
        )
    finally:
        await blocker.close()
        await admin.close()


async def test_a_long_history_prune_never_stops_the_rounds_carrying_the_heartbeat(
    rest: tuple[PeriodicTaskManager, VirtualClock],
    statements: Statements,
    pg_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The prune that follows a carried beat may take long (after a burst, under load): the
    rounds go on writing the heartbeat meanwhile, or the other managers would reap this one."""
    mgr, clock = rest
    assert isinstance(mgr.store, DatabaseRuntimeStore)
    await drive(mgr, clock, 6)  # the first carried beat set the prune timer
    prune = SlowPrune()

    monkeypatch.setattr(mgr.store, "prune_due", lambda _now: True)
    monkeypatch.setattr(mgr.store, "prune_runs", prune)
    admin = await asyncpg.connect(dsn(pg_url))
    try:
        await drive(mgr, clock, 6)
        assert prune.started.is_set()
        statements.sent.clear()
        async with asyncio.timeout(30):  # a round waiting on the prune would wait forever
            await drive(mgr, clock, 30)  # the prune still runs
        assert statements.of(ROUND_BEAT) == 6
        beat = await admin.fetchval(
            "SELECT heartbeat_at FROM pm_managers WHERE manager_id = $1", mgr.manager_id
        )
        assert clock.now() - beat < timedelta(seconds=5)
    finally:
        prune.release.set()
        await admin.close()


async def test_a_long_history_prune_never_delays_a_leader_mode_heartbeat(
    pg_url: str, statements: Statements, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In leader mode the heartbeat loop writes the beats itself: a prune after one (long after a
    burst, under load) runs apart, so the next beats come on time (while it ran inside the beat,
    three missed beats got this manager reaped by another one, alive)."""
    await upgrade(pg_url)
    settings = Settings(
        database_url=pg_url,
        target="outbox",
        coordination="leader",
        sync_interval=3600,
        full_sync_interval=3600,
        listen=False,
    )
    clock = VirtualClock(T0)
    engine = create_engine(pg_url)
    mgr = build_manager(settings, engine, clock=clock)
    assert isinstance(mgr.store, DatabaseRuntimeStore) and mgr.heartbeat.interval == 5
    prune = SlowPrune()

    async def drive(seconds: float) -> None:
        for _ in range(int(seconds * 2)):
            # wait_settled waits for a beat under way (the heartbeat's lock), answered by the
            # real database, before the clock moves on.
            await clock.advance(0.5, settle=lambda: mgr.wait_settled(clock.now()))

    await mgr.start()
    admin = await asyncpg.connect(dsn(pg_url))
    try:
        await drive(6)  # the first beat set the prune timer
        monkeypatch.setattr(mgr.store, "prune_due", lambda _now: True)
        monkeypatch.setattr(mgr.store, "prune_runs", prune)
        async with asyncio.timeout(30):  # a beat waiting on the prune would wait forever
            await drive(6)
            assert prune.started.is_set()
            statements.sent.clear()
            await drive(30)  # the prune still runs
        assert statements.of(BEAT_PG) >= 5
        beat = await admin.fetchval(
            "SELECT heartbeat_at FROM pm_managers WHERE manager_id = $1", mgr.manager_id
        )
        assert clock.now() - beat < timedelta(seconds=6)
    finally:
        prune.release.set()
        await admin.close()
        await mgr.stop()
        await engine.dispose()


async def test_a_full_reconcile_due_at_rest_lists_no_row_and_still_finds_one_written_past_the_triggers(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await upgrade(pg_url)
    await insert_schedules(pg_url, [(f"y{i}", "0 0 1 1 *", {}) for i in range(1, 21)])  # none due
    reads: list[str] = []

    def counted(name: str) -> Any:
        method = getattr(DatabaseProvider, name)

        async def call(self: DatabaseProvider, *args: Any) -> Any:
            reads.append(name)
            return await method(self, *args)

        return call

    for name in ("get_configs", "unchanged_since_full"):
        monkeypatch.setattr(DatabaseProvider, name, counted(name))
    settings = Settings(
        database_url=pg_url, target="outbox", sync_interval=30, full_sync_interval=60, listen=False
    )
    clock = VirtualClock(T0)
    engine = create_engine(pg_url)
    mgr = build_manager(settings, engine, clock=clock)
    await mgr.start()
    try:
        # The start reads every row (no digest: the start would wait for the database to hash
        # them); the first full reconcile due lists the pairs, and takes the digest.
        await drive(mgr, clock, 70)
        assert reads[-2:] == ["unchanged_since_full", "get_configs"], reads
        reads.clear()
        await drive(mgr, clock, 240)
        # Four full reconciles were due (one a minute); nothing changed, so each was one
        # digest, and no row was listed or read.
        assert reads.count("unchanged_since_full") == 4 and "get_configs" not in reads, reads
        # A row written past the triggers (no new revision, no notification): the change feed
        # cannot see it, the next full reconcile's digest does, and the row is read and runs.
        admin = await asyncpg.connect(dsn(pg_url))
        try:
            async with admin.transaction():
                await admin.execute("SET LOCAL session_replication_role = replica")
                await admin.execute(
                    "INSERT INTO periodic_jobs (name, spec, timezone, task_type, enabled)"
                    " VALUES ('past-triggers', '*/5 * * * *', 'UTC', 'fault.task', true)"
                )
        finally:
            await admin.close()
        reads.clear()
        await drive(mgr, clock, 61)
        assert reads.count("get_configs") == 1, reads
        assert "past-triggers" in {e.name for e in mgr.entries()}
    finally:
        await mgr.stop()
        await engine.dispose()
