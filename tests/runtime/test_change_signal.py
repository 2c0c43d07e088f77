"""Change signal: revisions and tombstones by trigger, NOTIFY, incremental reads, LISTEN; on
MariaDB the counter row's lock and the revision poller."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from functools import partial

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.clock import VirtualClock
from periodic_manager.db.changes import peek, watermark
from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import downgrade, upgrade
from periodic_manager.db.provider import DatabaseProvider
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.runtime.memory_store import MemoryRuntimeStore
from periodic_manager.runtime.notify import PostgresChangeListener, partitions_of
from periodic_manager.runtime.poll import RevisionPoller
from periodic_manager.runtime.timing import Timing
from periodic_manager.targets.memory import MemoryTarget
from tests.support.polling import eventually
from tests.support.tcpproxy import TcpProxy

INSERT = (
    "INSERT INTO periodic_jobs (name, spec, timezone, task_type, payload, options, enabled)"
    " VALUES (:name, :spec, 'UTC', 't', 'null', '{}', true)"
)


def dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_engine(db_url)
    yield eng
    await eng.dispose()


async def sql(engine: AsyncEngine, stmt: str, **params: object) -> None:
    async with engine.begin() as conn:
        await conn.execute(text(stmt), params)


async def revisions(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        return dict((await conn.execute(text("SELECT name, revision FROM periodic_jobs"))).all())


async def test_every_write_gets_a_new_revision_and_deletes_leave_tombstones(
    engine: AsyncEngine,
) -> None:
    await sql(engine, INSERT, name="a", spec="* * * * *")
    await sql(engine, INSERT, name="b", spec="* * * * *")
    first = await revisions(engine)
    assert 0 < first["a"] < first["b"]
    await sql(engine, "UPDATE periodic_jobs SET spec = '*/5 * * * *' WHERE name = 'a'")
    second = await revisions(engine)
    assert second["a"] > first["b"] and second["b"] == first["b"]
    await sql(engine, "DELETE FROM periodic_jobs WHERE name = 'b'")
    async with engine.connect() as conn:
        [(rev, _)] = (
            await conn.execute(text("SELECT revision, id FROM periodic_jobs_deleted"))
        ).all()
    assert rev > second["a"]


async def test_a_sync_that_finds_nothing_changed_makes_one_round_trip(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At rest every sync finds nothing changed: the watermark is read outside a transaction
    (it was BEGIN, the read, ROLLBACK: three round trips, three wake-ups of the process). The
    manager command's engine, which pings no connection at checkout."""
    await upgrade(pg_url)
    eng = create_engine(pg_url, ping=False)
    try:
        await sql(eng, INSERT, name="a", spec="* * * * *")
        provider = DatabaseProvider(eng)
        snap = await provider.get_configs()
        assert snap.revision is not None
        sent: list[str] = []
        execute = asyncpg.Connection.execute

        async def counted(self: asyncpg.Connection, query: str, *args: object, **kw: object) -> str:
            sent.append(query)  # BEGIN and ROLLBACK come this way (asyncpg's transactions)
            return await execute(self, query, *args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(asyncpg.Connection, "execute", counted)
        assert await provider.get_changes(snap.revision) is None
        assert sent == []
        await sql(eng, INSERT, name="b", spec="* * * * *")
        sent.clear()
        changes = await provider.get_changes(snap.revision)  # something did: read in a transaction
        assert changes is not None and [c.name for c in changes.configs] == ["b"]
        assert any(q.startswith("BEGIN") for q in sent)
    finally:
        await eng.dispose()


async def test_provider_reads_only_what_changed(engine: AsyncEngine) -> None:
    provider = DatabaseProvider(engine)
    await sql(engine, INSERT, name="kept", spec="* * * * *")  # a row read before, never changed
    await sql(engine, INSERT, name="a", spec="* * * * *")
    await sql(engine, INSERT, name="b", spec="* * * * *")
    snap = await provider.get_configs()
    assert snap.revision is not None and len(snap.configs) == 3
    assert await provider.get_changes(snap.revision) is None  # nothing changed: one cheap query

    await sql(engine, "UPDATE periodic_jobs SET spec = '0 * * * *' WHERE name = 'a'")
    await sql(engine, "UPDATE periodic_jobs SET enabled = false WHERE name = 'b'")
    await sql(engine, INSERT, name="c", spec="61 * * * *")
    changes = await provider.get_changes(snap.revision)
    assert changes is not None and not changes.full
    assert [c.name for c in changes.configs] == ["a"] and changes.configs[0].spec == "0 * * * *"
    assert [e.name for e in changes.errors] == ["c"]
    ids = {c.name: c.key for c in snap.configs}
    assert list(changes.removed) == [ids["b"]]

    await sql(engine, "DELETE FROM periodic_jobs WHERE name = 'a'")
    later = await provider.get_changes(changes.revision)
    assert later is not None and list(later.removed) == [ids["a"]] and not later.configs

    # No row read before is left (every one changed since, or gone without a tombstone): only a
    # full read tells what is there, and it reads what reading the changes would.
    await sql(engine, "UPDATE periodic_jobs SET spec = '5 * * * *'")
    assert (every := await provider.get_changes(later.revision)) is not None and every.full
    await sql(engine, "DELETE FROM periodic_jobs")
    assert (empty := await provider.get_changes(every.revision)) is not None and empty.full
    await sql(engine, INSERT, name="d", spec="* * * * *")
    snap = await provider.get_configs()
    assert snap.revision is not None
    back = await provider.get_changes(snap.revision + 5)  # a watermark past the one now: gone back
    assert back is not None and back.full


async def test_truncate_asks_for_a_full_read(pg_url: str) -> None:
    await upgrade(pg_url)
    eng = create_engine(pg_url)
    try:
        await sql(eng, INSERT, name="a", spec="* * * * *")
        provider = DatabaseProvider(eng)
        snap = await provider.get_configs()
        await sql(eng, "TRUNCATE periodic_jobs")
        changes = await provider.get_changes(snap.revision or 0)
        assert changes is not None and changes.full
    finally:
        await eng.dispose()


async def test_writers_are_serialized_so_revisions_appear_in_commit_order(pg_url: str) -> None:
    await upgrade(pg_url)
    first = await asyncpg.connect(dsn(pg_url))
    second = await asyncpg.connect(dsn(pg_url))
    try:
        tx = first.transaction()
        await tx.start()
        await first.execute(
            "INSERT INTO periodic_jobs (name, spec, task_type, options) VALUES ('slow', '* * * * *', 't', '{}')"
        )
        other = asyncio.ensure_future(
            second.execute(
                "INSERT INTO periodic_jobs (name, spec, task_type, options) VALUES ('fast', '* * * * *', 't', '{}')"
            )
        )
        await asyncio.sleep(0.2)
        assert not other.done()  # waits for the first writer's commit
        await tx.commit()
        await asyncio.wait_for(other, 5)
        revs = dict(await first.fetch("SELECT name, revision FROM periodic_jobs"))
        assert revs["slow"] < revs["fast"]
    finally:
        await first.close()
        await second.close()


async def test_a_bulk_update_is_one_notification(pg_url: str) -> None:
    await upgrade(pg_url)
    listener = await asyncpg.connect(dsn(pg_url))
    writer = await asyncpg.connect(dsn(pg_url))
    got: list[str] = []
    try:
        await listener.add_listener("periodic_jobs", lambda *args: got.append(args[3]))
        await writer.execute(
            "INSERT INTO periodic_jobs (name, spec, task_type, options)"
            " SELECT 'bulk' || g, '* * * * *', 't', '{}' FROM generate_series(1, 2000) g"
        )
        await writer.execute("UPDATE periodic_jobs SET spec = '*/2 * * * *'")
        await eventually(lambda: len(got) >= 2, "two notifications", seconds=5)
        await asyncio.sleep(0.2)
        every = ",".join(str(p) for p in range(64))
        assert got == [every, every]  # one per statement, naming the partitions written
        del got[:]
        await writer.execute("UPDATE periodic_jobs SET spec = '* * * * *' WHERE id IN (3, 67, 5)")
        await writer.execute("DELETE FROM periodic_jobs WHERE id = 130")
        await writer.execute("TRUNCATE periodic_jobs")
        await eventually(lambda: len(got) >= 3, "three notifications", seconds=5)
        await asyncio.sleep(0.2)
        assert got == ["3,5", "2", ""]  # TRUNCATE: anything may have changed
        assert [partitions_of(p) for p in got] == [frozenset({3, 5}), frozenset({2}), None]
        assert partitions_of("3,x") is None and partitions_of("-1") is None  # data, not trusted
    finally:
        await listener.close()
        await writer.close()


async def test_sql_edits_reach_the_manager_without_waiting_for_the_sync_interval(
    pg_url: str,
) -> None:
    await upgrade(pg_url)
    eng = create_engine(pg_url)
    clock = VirtualClock(datetime(2024, 5, 1, 12, tzinfo=UTC))
    mgr = PeriodicTaskManager(
        DatabaseProvider(eng),
        MemoryTarget(),
        clock=clock,
        store=MemoryRuntimeStore(),
        timing=Timing(sync_interval=3600),
    )
    listener = PostgresChangeListener(dsn(pg_url), check_interval=0.2)
    # The sync interval is on the virtual clock, which never moves here: only the signal can
    # bring an edit in, however long the polls below wait (their bound is no measure of speed).
    mgr.signals.append(listener)
    await mgr.start()
    try:
        await eventually(listener.connected.is_set, "the listener connected")

        def names() -> list[str]:
            return sorted(e.config.name for e in mgr.entries())

        await sql(eng, INSERT, name="raw.sql", spec="* * * * *")
        await eventually(lambda: names() == ["raw.sql"], "the inserted row synced")
        await sql(eng, "UPDATE periodic_jobs SET spec = '*/2 * * * *'")
        await eventually(
            lambda: [e.config.spec for e in mgr.entries()] == ["*/2 * * * *"],
            "the updated spec synced",
        )
        await sql(eng, "DELETE FROM periodic_jobs")
        await eventually(lambda: names() == [], "the deletion synced")

        # The listener's connection is killed: it reconnects and asks for a sync at once.
        admin = await asyncpg.connect(dsn(pg_url))
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'periodic_manager listener' AND datname = current_database()"
        )
        await admin.close()
        await eventually(lambda: listener.reconnects == 1, "the listener reconnected")
        await sql(eng, INSERT, name="after.reconnect", spec="* * * * *")
        await eventually(lambda: names() == ["after.reconnect"], "a row synced after the reconnect")
        assert listener.reconnects == 1
    finally:
        await mgr.stop()
        await eng.dispose()


async def test_a_listener_that_found_its_connection_dead_reconnects_once(
    proxied: tuple[str, TcpProxy],
) -> None:
    # A half-open connection (the proxy forwards nothing) fails the health check; the listener
    # drops it and reconnects. Dropping it ends that connection, and asyncpg calls its
    # termination callbacks a loop turn later, while the next connection is being opened: the
    # dead connection's callback must not end the new one (it did, and each close then ended
    # the next: a loop of reconnects, which made "reconnects == 1" flaky under load).
    url, proxy = proxied
    await upgrade(url)
    got: list[frozenset[int] | None] = []
    listener = PostgresChangeListener(dsn(url), check_interval=0.1, timeout=2.0)
    await listener.start(got.append)
    writer = await asyncpg.connect(dsn(url))
    try:
        await eventually(listener.connected.is_set, "the listener connected")
        proxy.freeze()
        await eventually(lambda: not listener.connected.is_set(), "the health check failed")
        proxy.thaw()
        await eventually(lambda: listener.reconnects >= 1, "the listener reconnected")
        del got[:]
        await writer.execute(INSERT.replace(":name", "'x'").replace(":spec", "'* * * * *'"))
        await eventually(lambda: len(got) >= 1, "the insert's notification")
        assert listener.reconnects == 1 and listener.connected.is_set()
    finally:
        await listener.stop()
        await writer.close()


async def test_the_listener_probes_its_connection_once_a_minute_and_notices_a_loss_without_one(
    pg_url: str,
) -> None:
    """At rest the LISTEN connection costs no round trip every 5 s: its socket has TCP
    keepalives (the kernel ends a half-open one, which asyncpg reports like any loss), a probe
    runs once a minute as the backstop, and a lost connection is noticed at once (the
    termination callback) with no probe at all: the listener reconnects and asks for a sync."""
    import socket

    from periodic_manager.db.dialects.postgresql import KEEPALIVE

    await upgrade(pg_url)
    clock = VirtualClock(datetime(2024, 5, 1, 12, tzinfo=UTC))
    listener = PostgresChangeListener(dsn(pg_url), clock=clock)
    asked: list[frozenset[int] | None] = []
    await listener.start(asked.append)
    try:
        await eventually(listener.connected.is_set, "the listener connected", seconds=5)
        sock = listener._conn._transport.get_extra_info("socket")
        assert listener.kept_alive
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE["TCP_KEEPIDLE"]
        probes: list[str] = []
        listener._conn.add_query_logger(lambda q: probes.append(q.query))
        for _ in range(60):  # five minutes, in the steps of the manager's 5 s ticks
            await clock.advance(5)
            await asyncio.sleep(0.001)  # a probe under way answers (real I/O)
        await eventually(lambda: len(probes) >= 5, "five probes", seconds=5)
        assert probes == ["SELECT 1"] * 5  # one a minute (60 before)
        asked.clear()
        admin = await asyncpg.connect(dsn(pg_url))
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'periodic_manager listener' AND datname = current_database()"
        )
        await admin.close()
        # The clock stands still: no probe runs; the loss is seen all the same.
        await eventually(lambda: listener.reconnects == 1, "the listener reconnected", seconds=10)
        assert asked == [None]  # anything may have changed meanwhile: a sync
    finally:
        await listener.stop()


async def test_a_row_turned_bad_keeps_its_last_good_schedule(engine: AsyncEngine) -> None:
    clock = VirtualClock(datetime(2024, 5, 1, 12, tzinfo=UTC))
    mgr = PeriodicTaskManager(
        DatabaseProvider(engine), MemoryTarget(), clock=clock, store=MemoryRuntimeStore()
    )
    await sql(engine, INSERT, name="keep", spec="*/5 * * * *")
    await mgr.start()
    try:
        await sql(engine, "UPDATE periodic_jobs SET spec = '61 * * * *' WHERE name = 'keep'")
        for full in (False, True):
            report = await mgr.sync(full=full)
            assert [e.name for e in report.errors] == ["keep"]
            assert [e.config.spec for e in mgr.entries()] == ["*/5 * * * *"]
        await sql(engine, "DELETE FROM periodic_jobs WHERE name = 'keep'")
        await mgr.sync()
        assert mgr.entries() == []
    finally:
        await mgr.stop()


async def test_downgrading_the_partition_signal_restores_the_empty_payload(pg_url: str) -> None:
    await upgrade(pg_url)
    await downgrade(pg_url, "0016_calendars")
    listener = await asyncpg.connect(dsn(pg_url))
    writer = await asyncpg.connect(dsn(pg_url))
    got: list[str] = []
    try:
        await listener.add_listener("periodic_jobs", lambda *args: got.append(args[3]))
        await writer.execute(
            "INSERT INTO periodic_jobs (name, spec, task_type, options) VALUES ('d', '* * * * *', 't', '{}')"
        )
        await eventually(lambda: len(got) >= 1, "a notification", seconds=5)
        assert got == [""]  # as migration 0003 made it: every manager reads
    finally:
        await listener.close()
        await writer.close()
    await upgrade(pg_url)


# -- MariaDB/MySQL: the counter row's lock and the poller --------------------------------------


async def test_mysql_writers_are_serialized_so_revisions_appear_in_commit_order(
    mariadb_url: str,
) -> None:
    import asyncmy

    await upgrade(mariadb_url)
    u = make_url(mariadb_url)
    args = {
        "host": u.host,
        "port": u.port or 3306,
        "user": u.username,
        "password": u.password or "",
        "database": u.database,
    }
    first = await asyncmy.connect(**args, autocommit=False)
    second = await asyncmy.connect(**args, autocommit=True)
    try:
        async with first.cursor() as cur:
            await cur.execute(
                "INSERT INTO periodic_jobs (name, spec, task_type, options) VALUES ('slow', '* * * * *', 't', '{}')"
            )

        async def fast() -> None:
            async with second.cursor() as cur:
                await cur.execute(
                    "INSERT INTO periodic_jobs (name, spec, task_type, options) VALUES ('fast', '* * * * *', 't', '{}')"
                )

        other = asyncio.ensure_future(fast())
        await asyncio.sleep(0.3)
        assert not other.done()  # waits for the first writer's commit (the counter row's lock)
        await first.commit()
        await asyncio.wait_for(other, 5)
        async with first.cursor() as cur:
            await cur.execute("SELECT name, revision FROM periodic_jobs")
            revs = dict(await cur.fetchall())
        assert revs["slow"] < revs["fast"]
    finally:
        first.close()
        second.close()


async def test_mysql_sql_edits_reach_the_manager_by_polling_even_after_a_gap(
    mariadb_url: str,
) -> None:
    await upgrade(mariadb_url)
    eng = create_engine(mariadb_url)
    u = make_url(mariadb_url)
    proxy = TcpProxy(u.host or "127.0.0.1", u.port or 3306)
    port = await proxy.start()
    # The poller reads through a proxy the test can cut; the manager reads directly.
    polled = create_engine(
        u.set(port=port).render_as_string(hide_password=False), command_timeout=1
    )
    clock = VirtualClock(datetime(2024, 5, 1, 12, tzinfo=UTC))
    mgr = PeriodicTaskManager(
        DatabaseProvider(eng),
        MemoryTarget(),
        clock=clock,
        store=MemoryRuntimeStore(),
        timing=Timing(sync_interval=3600),
    )
    poller = RevisionPoller(partial(peek, polled), interval=0.1, timeout=1)
    mgr.signals.append(poller)
    await mgr.start()
    try:
        await eventually(lambda: poller.polls > 0, "the poller polled", seconds=5)

        def names() -> list[str]:
            return sorted(e.config.name for e in mgr.entries())

        await sql(eng, INSERT, name="raw.sql", spec="* * * * *")
        await eventually(lambda: names() == ["raw.sql"], "the inserted row synced", seconds=5)
        await sql(eng, "UPDATE periodic_jobs SET spec = '*/2 * * * *'")
        await eventually(
            lambda: [e.config.spec for e in mgr.entries()] == ["*/2 * * * *"],
            "the updated spec synced",
            seconds=5,
        )
        await sql(eng, "DELETE FROM periodic_jobs")
        await eventually(lambda: names() == [], "the deletion synced", seconds=5)

        # Polls fail while the proxy is cut; a change made meanwhile is synced once they work.
        await proxy.cut()
        await sql(eng, INSERT, name="during.gap", spec="* * * * *")
        await asyncio.sleep(0.5)
        assert names() == []  # nothing polled it yet (the sync interval is an hour)
        await proxy.restore()
        await eventually(
            lambda: names() == ["during.gap"], "the row synced after the gap", seconds=10
        )
    finally:
        await mgr.stop()
        await polled.dispose()
        await eng.dispose()
        await proxy.close()


async def test_a_mysql_peek_costs_no_more_statements_than_a_read_in_a_transaction(
    migrated_mariadb_url: str,
) -> None:
    """The poller peeks every second. On MariaDB/MySQL a read in the session's implicit
    transaction is the read and a ROLLBACK; switching the session to autocommit for it (what
    saves BEGIN and ROLLBACK on PostgreSQL) would add a ``SET autocommit`` each way. Counted on
    the server, by the pool's one connection's own ``Questions``."""
    eng = create_engine(migrated_mariadb_url, pool_size=1, max_overflow=0)

    async def questions() -> int:
        async with eng.connect() as conn:
            return int((await conn.execute(text("SHOW SESSION STATUS LIKE 'Questions'"))).one()[1])

    async def in_a_transaction() -> None:
        async with eng.connect() as conn:
            await watermark(conn)

    try:
        await peek(eng)  # the pool's one connection, opened and set up
        cost: dict[str, int] = {}
        for name, read in (("peek", partial(peek, eng)), ("in a transaction", in_a_transaction)):
            before = await questions()
            for _ in range(10):
                await read()
            cost[name] = await questions() - before
        assert cost["peek"] <= cost["in a transaction"], cost
    finally:
        await eng.dispose()


async def test_mysql_truncate_is_seen_at_the_next_poll_not_at_the_next_full_reconcile(
    mariadb_url: str,
) -> None:
    """MariaDB/MySQL fire no trigger on a TRUNCATE: no tombstone. The poller still sees it (the
    oldest row's revision moved, or there is no row), and the sync reads everything, because no
    row it read before is left. Before, the truncated schedules kept running until the full
    reconcile (PM_FULL_SYNC_INTERVAL, five minutes), also when rows were inserted right after."""
    await upgrade(mariadb_url)
    eng = create_engine(mariadb_url)
    clock = VirtualClock(datetime(2024, 5, 1, 12, tzinfo=UTC))
    mgr = PeriodicTaskManager(
        DatabaseProvider(eng),
        MemoryTarget(),
        clock=clock,
        store=MemoryRuntimeStore(),
        timing=Timing(sync_interval=3600),
    )
    poller = RevisionPoller(partial(peek, eng), interval=0.05, timeout=2)
    mgr.signals.append(poller)

    def names() -> list[str]:
        return sorted(e.config.name for e in mgr.entries())

    await mgr.start()
    try:
        await eventually(lambda: poller.polls > 0, "the poller polled")
        for name in ("a", "b", "c"):
            await sql(eng, INSERT, name=name, spec="* * * * *")
        await eventually(lambda: names() == ["a", "b", "c"], "the inserted rows synced")
        # The last write a DELETE: its tombstone holds the watermark, which a TRUNCATE leaves as is.
        await sql(eng, "DELETE FROM periodic_jobs WHERE name = 'c'")
        await eventually(lambda: names() == ["a", "b"], "the deletion synced")
        await sql(eng, "TRUNCATE TABLE periodic_jobs")
        await eventually(lambda: names() == [], "the truncated rows removed")

        # The usual reload: TRUNCATE, then INSERT, within one poll.
        for name in ("d", "e"):
            await sql(eng, INSERT, name=name, spec="* * * * *")
        await eventually(lambda: names() == ["d", "e"], "the inserted rows synced")
        async with eng.begin() as conn:
            await conn.execute(text("TRUNCATE TABLE periodic_jobs"))
        await sql(eng, INSERT, name="f", spec="* * * * *")
        await eventually(lambda: names() == ["f"], "the reloaded table synced")
    finally:
        await mgr.stop()
        await eng.dispose()
