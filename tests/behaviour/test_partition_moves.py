"""Partitions moving between in-process managers on one PostgreSQL database, sending to Redis
Streams under a virtual clock: joins, a graceful leave and a manager cut off from PostgreSQL
(still reaching Redis) never send a slot twice nor lose one, and every schedule is held by
exactly one manager at each checkpoint. The audit counts the messages on the stream itself.

The database's clock runs on real time; a lease that expires "after the TTL" is moved into the
past with SQL once the cut-off manager has stopped trusting it, as the database would let it
expire (a manager stops trusting a lease before the database can let another take it).
"""

from __future__ import annotations

import asyncio
import gc
import sys
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis
from sqlalchemy.dialects import postgresql

from periodic_manager import gcpolicy
from periodic_manager.clock import VirtualClock
from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import upgrade
from periodic_manager.db.provider import DatabaseProvider
from periodic_manager.db.provider_scope import EVERY_RUNS
from periodic_manager.engine.entries import Entries
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.runtime import reconcile, sync
from periodic_manager.runtime.assemble import build_manager
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.runtime.notify import PostgresChangeListener
from periodic_manager.runtime.partitions import PartitionLeases
from periodic_manager.schedules.partition import partition_of
from periodic_manager.settings import Settings
from tests.support import managers
from tests.support.api import api_client
from tests.support.faults import (
    T0,
    assert_exactly_once,
    dsn,
    expected_slots,
    insert_schedules,
    stream_keys,
)
from tests.support.polling import eventually
from tests.support.tcpproxy import TcpProxy

SCHEDULES = 120
N = 64


class Fleet(managers.Fleet):
    """The fleet, with what this file asks of the schedules it holds."""

    def held(self) -> dict[str, set[int]]:
        return {n: {e.ident for e in m.entries()} for n, m in self.managers.items()}  # type: ignore[misc]

    def assert_each_schedule_held_once(self, live: list[str]) -> None:
        held = self.held()
        seen: set[int] = set()
        for name in live:
            assert not held[name] & seen, f"schedules held twice: {sorted(held[name] & seen)[:5]}"
            seen |= held[name]
        assert seen == set(range(1, SCHEDULES + 1))
        parts = [self.managers[n].partitions for n in live]
        assert sum(len(p) for p in parts) == N and max(len(p) for p in parts) <= -(-N // len(live))


async def test_joins_a_leave_and_a_cut_off_manager_move_partitions_with_every_slot_once(
    pg_url: str,
    proxied: tuple[str, TcpProxy],
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
) -> None:
    await upgrade(pg_url)
    await insert_schedules(
        pg_url, [(f"p{i:03d}", "@every 1s", {}) for i in range(1, SCHEDULES + 1)]
    )
    common = dict(
        target="redis",
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        coordination="partitions",
        lease_ttl=10,
        grace=30,
        sync_interval=600,
        heartbeat_interval=5,
        listen=False,
    )
    direct = Settings(database_url=pg_url, **common)  # type: ignore[arg-type]
    cut_url, proxy = proxied
    through_proxy = Settings(database_url=cut_url, **common)  # type: ignore[arg-type]
    fleet = Fleet(VirtualClock(T0))
    admin = await asyncpg.connect(dsn(pg_url))
    try:
        a = await fleet.start("a", direct)
        assert a.partitions == frozenset(range(N))  # alone: every partition
        await fleet.drive(10)
        fleet.assert_each_schedule_held_once(["a"])

        await fleet.start("b", direct)  # a join: a hands half over
        await fleet.drive(10)
        fleet.assert_each_schedule_held_once(["a", "b"])
        assert a.partition_handovers == N // 2
        assert a.registry.get_sample_value("periodic_manager_partition_handovers_total") == N // 2
        assert (
            a.registry.get_sample_value("periodic_manager_partitions")
            == len(a.partitions)
            == N // 2
        )

        c = await fleet.start("c", through_proxy)
        await fleet.drive(10)
        fleet.assert_each_schedule_held_once(["a", "b", "c"])
        async with api_client(pg_url, fleet.clock, fleet.engines[0]) as client:
            shown = {m["manager_id"]: m for m in (await client.get("/managers")).json()["items"]}
        assert {i: shown[m.manager_id]["partitions"] for i, m in fleet.managers.items()} == {
            i: sorted(m.partitions) for i, m in fleet.managers.items()
        }
        assert {i: shown[m.manager_id]["entry_count"] for i, m in fleet.managers.items()} == {
            i: len(m.entries()) for i, m in fleet.managers.items()
        }

        b = fleet.managers["b"]
        await fleet.stop("b")  # a graceful leave: released at once, taken at the next rounds
        await fleet.drive(10)
        fleet.assert_each_schedule_held_once(["a", "c"])
        # Clean hand-overs: no manager even tried a slot another had sent (no claim needed).
        assert [m.scheduler.counts["duplicate"] for m in (a, b, c)] == [0, 0, 0]

        await proxy.cut()  # c reaches Redis, not PostgreSQL: it stops sending at once
        await fleet.drive(10)
        assert not c.partitions and not c.entries()
        # Its session ended with the connection, and its liveness lock with it: a took its
        # partitions without waiting for their TTL (c stopped sending the moment it lost it).
        assert (
            await admin.fetchval(
                "SELECT count(*) FROM pm_partitions WHERE holder = $1", c.manager_id
            )
            == 0
        )
        assert a.partitions == frozenset(range(N))
        assert {e.ident for e in a.entries()} == set(range(1, SCHEDULES + 1))
        end = fleet.clock.now()
    finally:
        await fleet.close()
        await admin.close()
    counts = await stream_keys(redis_client, redis_prefix)
    expected = [
        k
        for i in range(1, SCHEDULES + 1)
        for k in expected_slots(f"p{i:03d}", "@every 1s", T0, end)
    ]
    assert len(expected) == SCHEDULES * int((end - T0).total_seconds() + 0.5)
    assert_exactly_once(counts, expected)
    assert sum(counts.values()) == len(expected)  # nothing else either
    print(f"{len(expected)} slots audited, {len(counts)} keys on the stream")


async def test_a_share_taken_over_and_registered_late_still_gets_every_slot_due_meanwhile_once(
    pg_url: str, redis_client: aioredis.Redis, redis_prefix: str, redis_url: str
) -> None:
    """A joining manager takes its share by a clean hand-over, and its takeover reads their rows
    late (a starved machine): the holder stopped sending for them at the hand-over, the new one
    registers them seconds later, and the slots due in between are sent once, by its look back
    (after what the old holder recorded as sent). Only a partition no manager held before starts
    at its registration, as a first start does (test_partition_processes waits for it)."""
    await upgrade(pg_url)
    names = [f"s{i:03d}" for i in range(1, SCHEDULES + 1)]
    await insert_schedules(pg_url, [(name, "@every 1s", {}) for name in names])
    settings = Settings(
        database_url=pg_url,
        target="redis",
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        coordination="partitions",
        lease_ttl=10,
        grace=30,
        sync_interval=600,
        heartbeat_interval=5,
        listen=False,
    )
    clock = VirtualClock(T0)
    fleet = Fleet(clock)
    read = asyncio.Event()  # b's takeover may read its rows
    try:
        a = await fleet.start("a", settings)
        await fleet.drive(5)
        engine = create_engine(settings.database_url)
        fleet.engines.append(engine)
        b = build_manager(settings, engine, clock=clock)
        assert b.holding is not None and isinstance(b.provider, DatabaseProvider)
        rows = b.provider.get_partitions

        async def late(partitions: frozenset[int]) -> Any:
            await read.wait()
            return await rows(partitions)

        b.provider.get_partitions = late  # type: ignore[method-assign]
        fleet.managers["b"] = b
        await b.start()

        async def settle() -> None:  # b's takeover waits for ``read``: not waited for
            for m in fleet.managers.values():
                assert isinstance(m.leadership, PartitionLeases) and m.holding is not None
                await m.leadership.quiet()
                if m is not b:
                    await m.holding.quiet()
                    await m.wait_settled(clock.now())

        for _ in range(20):  # 10 s: a hands half over, b takes it and waits to read it
            await clock.advance(0.5, settle=settle)
        # b holds its share, and a sends nothing for it since it handed it over, seconds ago.
        assert len(b.partitions) == N // 2 and not b.entries() and b.holding.taking
        assert a.partition_handovers == N // 2
        read.set()
        await fleet.drive(5)
        fleet.assert_each_schedule_held_once(["a", "b"])
        end = clock.now()
    finally:
        read.set()  # a failure above must not leave b's stop waiting for it
        await fleet.close()
    counts = await stream_keys(redis_client, redis_prefix)
    expected = [k for name in names for k in expected_slots(name, "@every 1s", T0, end)]
    assert_exactly_once(counts, expected)  # the seconds b's share waited for its rows included
    assert sum(counts.values()) == len(expected)


async def test_a_share_handed_over_before_its_first_slot_sends_nothing_due_before_it_was_held(
    pg_url: str, redis_client: aioredis.Redis, redis_prefix: str, redis_url: str
) -> None:
    """At a cluster's first start the first manager is alone: it takes every partition (never
    held before: no look back) and hands half of them over a round later, as the second one
    joins, before any of their slots came due. The new holder looks back for what the first
    may have missed, but no further than when the first took them: slots due before any manager
    held a partition are owed by nobody (it sent the grace's worth of them: 27 slots here)."""
    await upgrade(pg_url)
    names = [f"t{i:02d}" for i in range(1, 41)]
    await insert_schedules(pg_url, [(name, "@every 10s", {}) for name in names])
    settings = Settings(
        database_url=pg_url,
        target="redis",
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        coordination="partitions",
        lease_ttl=3,
        grace=30,
        sync_interval=600,
        heartbeat_interval=1,
        listen=False,
    )
    fleet = Fleet(VirtualClock(T0))
    try:
        a = await fleet.start("a", settings)  # alone: every partition, never held before
        assert a.partitions == frozenset(range(N))
        b = await fleet.start("b", settings)  # before a's first slot (12:00:10)
        await fleet.drive(5)  # a hands half over at its next round, b takes it (epoch 2)
        assert a.partition_handovers == N // 2 and len(b.partitions) == N // 2
        assert {e.ident for e in b.entries()} == set(range(N // 2, len(names) + 1))
        await fleet.drive(30)
        end = fleet.clock.now()
    finally:
        await fleet.close()
    counts = await stream_keys(redis_client, redis_prefix)
    expected = [k for name in names for k in expected_slots(name, "@every 10s", T0, end)]
    assert_exactly_once(counts, expected)  # every slot after the first hold, once
    old = sorted(set(counts) - set(expected))
    assert not old, f"{len(old)} slot(s) from before any manager held them, e.g. {old[:4]}"


async def test_a_share_taken_after_its_first_holder_was_cut_off_looks_back_to_its_first_hold(
    pg_url: str,
    proxied: tuple[str, TcpProxy],
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
) -> None:
    """A lone first manager is cut off from PostgreSQL seconds after it took every partition;
    once its leases expire the next manager takes them over and looks back: every slot due
    since the first hold that the first did not send is sent, once (the look back still covers
    a move after the first hold), and none due before it (the first hold bounds it, not grace):
    the ``@every 10s`` schedules had no slot sent yet, so nothing recorded bounds theirs."""
    await upgrade(pg_url)
    specs = {f"k{i:02d}": "@every 1s" if i <= 20 else "@every 10s" for i in range(1, 41)}
    await insert_schedules(pg_url, [(name, spec, {}) for name, spec in specs.items()])
    common = dict(
        target="redis",
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        coordination="partitions",
        lease_ttl=3,
        grace=30,
        sync_interval=600,
        heartbeat_interval=1,
        listen=False,
    )
    cut_url, proxy = proxied
    fleet = Fleet(VirtualClock(T0))
    admin = await asyncpg.connect(dsn(pg_url))
    try:
        a = await fleet.start("a", Settings(database_url=cut_url, **common))  # type: ignore[arg-type]
        assert a.partitions == frozenset(range(N))
        await fleet.drive(3)
        await proxy.cut()  # a stops sending within its trust, its leases stay in the database
        await fleet.drive(5)
        assert not a.partitions and not a.entries()
        await admin.execute("UPDATE pm_partitions SET expires_at = now() - interval '1 second'")
        await admin.execute(
            "UPDATE pm_partition_members SET expires_at = now() - interval '1 second'"
        )
        b = await fleet.start("b", Settings(database_url=pg_url, **common))  # type: ignore[arg-type]
        assert b.partitions == frozenset(range(N))  # taken over at epoch 2, first held at T0
        await fleet.drive(5)
        end = fleet.clock.now()
    finally:
        await fleet.close()
        await admin.close()
    counts = await stream_keys(redis_client, redis_prefix)
    expected = [k for name, spec in specs.items() for k in expected_slots(name, spec, T0, end)]
    assert_exactly_once(counts, expected)  # the seconds nobody sent included
    old = sorted(set(counts) - set(expected))
    assert not old, f"{len(old)} slot(s) from before any manager held them, e.g. {old[:4]}"


async def test_a_manager_leaves_the_last_good_versions_of_other_partitions_alone(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full read covers only the partitions held: a row of another manager's partition that
    turned bad is unseen, not over being bad, so its stored last good version stays."""
    monkeypatch.setenv("PM_PARTITIONS", "4")
    await upgrade(pg_url)
    await insert_schedules(pg_url, [(f"g{i}", "@every 1s", {}) for i in range(1, 9)])
    settings = Settings(
        database_url=pg_url,
        target="outbox",
        coordination="partitions",
        lease_ttl=10,
        sync_interval=600,
        heartbeat_interval=5,
        listen=False,
    )
    fleet = Fleet(VirtualClock(T0))
    admin = await asyncpg.connect(dsn(pg_url))
    try:
        a = await fleet.start("a", settings)
        b = await fleet.start("b", settings)
        await fleet.drive(10)  # a hands two partitions over at its next round, b takes them
        bs = sorted(e.ident for e in b.entries())
        assert bs and not {e.ident for e in a.entries()} & set(bs)
        bad = bs[0]
        await admin.execute("UPDATE periodic_jobs SET spec = '61 * * * *' WHERE id = $1", bad)
        await b.sync()  # b sees it bad: it stores the version it runs
        assert (
            await admin.fetchval(
                "SELECT count(*) FROM pm_last_good WHERE schedule_key = $1", str(bad)
            )
            == 1
        )
        await a.sync(full=True)  # a reads only its partitions
        assert (
            await admin.fetchval(
                "SELECT count(*) FROM pm_last_good WHERE schedule_key = $1", str(bad)
            )
            == 1
        )
        assert b.entry(bad) is not None and b.entry(bad).spec == "@every 1s"  # type: ignore[union-attr]
    finally:
        await fleet.close()
        await admin.close()


async def test_a_lone_manager_restarted_within_grace_sends_what_was_due_meanwhile_once(
    pg_url: str, redis_client: aioredis.Redis, redis_prefix: str, redis_url: str
) -> None:
    await upgrade(pg_url)
    await insert_schedules(pg_url, [(f"r{i:02d}", "@every 1s", {}) for i in range(1, 21)])
    settings = Settings(
        database_url=pg_url,
        target="redis",
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        coordination="partitions",
        lease_ttl=10,
        grace=30,
        sync_interval=600,
        heartbeat_interval=5,
        listen=False,
    )
    fleet = Fleet(VirtualClock(T0))
    try:
        await fleet.start("a", settings)
        await fleet.drive(5)
        await fleet.stop("a")  # SIGTERM: its partitions are released, what it sent recorded
        await fleet.clock.advance(10)  # down for 10 s, within grace
        again = await fleet.start("a2", settings)
        assert again.partitions == frozenset(range(N))
        await fleet.drive(5)
        end = fleet.clock.now()
        assert again.scheduler.counts["duplicate"] == 0  # it started after what a recorded
    finally:
        await fleet.close()
    counts = await stream_keys(redis_client, redis_prefix)
    expected = [k for i in range(1, 21) for k in expected_slots(f"r{i:02d}", "@every 1s", T0, end)]
    assert_exactly_once(counts, expected)  # the 10 s it was down included
    assert sum(counts.values()) == len(expected) == 20 * 20


async def test_a_lone_managers_start_reads_its_rows_once_unfiltered_and_computes_each_slot_once(
    pg_url: str, redis_prefix: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manager alone takes every partition at its first round: its start reads the rows once,
    in EVERY_RUNS runs of partition ranges, none sorted (``ORDER BY`` with ``id % n`` made
    PostgreSQL sort the whole table before the first row came), its first sync before that round reads none,
    and the takeover registers them by a full sync, the path of a leader's first sync (not the
    path of a takeover of some partitions), filing each entry once, already rebased (not
    registered, then rebased: two slots computed per schedule). Both at a first start (partitions never held) and at a
    restart (a takeover that looks back after what is settled). Counted, not timed."""
    await upgrade(pg_url)
    count = 30
    await insert_schedules(pg_url, [(f"c{i:02d}", "@every 1s", {}) for i in range(1, count + 1)])
    settings = Settings(
        database_url=pg_url,
        target="redis",
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        coordination="partitions",
        lease_ttl=10,
        grace=30,
        sync_interval=600,
        heartbeat_interval=5,
        listen=False,
    )
    reads: list[str] = []  # the statements that read rows of periodic_jobs
    slots = 0  # next slots computed
    rebased: list[int] = []  # entries rebased after their registration
    some: list[int] = []  # partitions' rows registered by the path of a takeover of some
    stream, next_after, rebase_some = (
        DatabaseProvider._stream,
        Entries.next_after,
        Scheduler.rebase_some,
    )
    apply_some = reconcile.Reconciler.apply_some

    async def counted_apply_some(self: reconcile.Reconciler, snapshot: Any, now: datetime) -> Any:
        some.append(len(snapshot.configs))
        return await apply_some(self, snapshot, now)

    def counted_stream(
        self: DatabaseProvider, conn: object, query: object, params: object = None
    ) -> object:
        reads.append(str(query.compile(dialect=postgresql.dialect())))  # type: ignore[attr-defined]
        return stream(self, conn, query, params)  # type: ignore[arg-type]

    def counted_next_after(self: Entries, entry: object, after: datetime) -> datetime | None:
        nonlocal slots
        slots += 1
        return next_after(self, entry, after)  # type: ignore[arg-type]

    async def counted_rebase_some(self: Scheduler, entries: list[object], *args: object) -> None:
        rebased.append(len(entries))
        await rebase_some(self, entries, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(DatabaseProvider, "_stream", counted_stream)
    monkeypatch.setattr(Entries, "next_after", counted_next_after)
    monkeypatch.setattr(Scheduler, "rebase_some", counted_rebase_some)
    monkeypatch.setattr(reconcile.Reconciler, "apply_some", counted_apply_some)
    # The collector policy of the command, freezing from the first entry: the takeover freezes
    # what it registered before the collector runs again (a first pass over a million young
    # objects cost ~1 s of a 1M start).
    collecting: list[bool] = []  # whether the collector was on at each freeze
    monkeypatch.setattr(gcpolicy, "_enabled", True)
    monkeypatch.setattr(gcpolicy, "_trim", None)
    monkeypatch.setattr(gcpolicy, "freeze", lambda: collecting.append(gc.isenabled()))
    monkeypatch.setattr(sync, "FREEZE_AFTER", 1)
    clock = VirtualClock(T0)
    for run in ("first start", "restart"):
        reads.clear()
        rebased.clear()
        some.clear()
        collecting.clear()
        slots = 0
        engine = create_engine(pg_url)
        mgr = build_manager(settings, engine, clock=clock)
        try:
            assert mgr.holding is not None and not mgr.holding.holds(1)  # no round yet: none
            await mgr.start()  # returns at "started with N entries"; nothing sent before
            assert len(mgr.scheduler) == count and mgr.partitions == frozenset(range(N)), run
            assert mgr.holding.holds(1) and mgr.holding.holds(N + 1)
            rows = [r for r in reads if "FROM periodic_jobs" in r]
            assert len(rows) == EVERY_RUNS and all(
                "run_from" in r and "ORDER BY" not in r for r in rows
            ), (run, rows)
            assert slots == count and not any(rebased), (run, slots, rebased)
            assert some == [], (run, some)  # registered by a full sync, as a leader's first one
            assert collecting == [False], (run, collecting)  # frozen once, still paused
        finally:
            await mgr.stop()
            await engine.dispose()
        await clock.advance(10)


async def test_a_lone_managers_start_does_not_wait_for_its_catch_up_nor_holds_the_syncs_back(
    pg_url: str, redis_client: aioredis.Redis, redis_prefix: str, redis_url: str
) -> None:
    """The catch-up of what a takeover took runs beside it, as a leader's does after its start:
    a misfire "all" catch-up paced over a minute (60 missed slots at 1 a second) neither holds
    "started" back (the start waited for it, up to its 120 s bound) nor the syncs (it ran under
    the sync lock). Every missed slot is still sent once, oldest first. The clock does not move
    until start() has returned."""
    await upgrade(pg_url)
    await insert_schedules(pg_url, [("all", "@every 1s", {"misfire": "all", "catchup_window": 60})])
    settings = Settings(
        database_url=pg_url,
        target="redis",
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        coordination="partitions",
        lease_ttl=10,
        grace=30,
        sync_interval=600,
        heartbeat_interval=5,
        listen=False,
        catchup_rate=1,
    )
    fleet = Fleet(VirtualClock(T0))
    try:
        mgr = await asyncio.wait_for(fleet.start("a", settings), 60)  # a hang guard, not a timing
        assert fleet.clock.now() == T0 and len(mgr.scheduler) == 1
        assert not mgr.syncer.lock.locked()  # a sync may run while the catch-up paces
        await fleet.drive(65)
    finally:
        await fleet.close()
    counts = await stream_keys(redis_client, redis_prefix)
    missed = expected_slots("all", "@every 1s", T0 - timedelta(seconds=60), T0)
    assert all(counts[k] == 1 for k in missed), [k for k in missed if counts[k] != 1][:5]


async def test_limited_schedules_send_exactly_max_runs_through_a_join_and_a_leave(
    pg_url: str,
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """options.max_runs across hand-overs: the taker reads each limited schedule's count with
    what was settled, so the runs go on where the giver stopped, and run N+1 is never sent."""
    monkeypatch.setenv("PM_PARTITIONS", "4")
    runs = 12
    await upgrade(pg_url)
    # Created at T0 (a row that existed earlier with nothing recorded costs one run at the first
    # start: a manager that died may have sent a slot without recording it; docs/schedules.md).
    await insert_schedules(
        pg_url, [(f"m{i:02d}", "@every 1s", {"max_runs": runs}) for i in range(1, 17)], T0
    )
    settings = Settings(
        database_url=pg_url,
        target="redis",
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        coordination="partitions",
        lease_ttl=10,
        grace=30,
        sync_interval=600,
        heartbeat_interval=5,
        listen=False,
    )
    fleet = Fleet(VirtualClock(T0))
    try:
        a = await fleet.start("a", settings)
        await fleet.drive(4)
        await fleet.start("b", settings)  # a join: a hands half of the partitions over
        await fleet.drive(5)
        assert a.partitions and fleet.managers["b"].partitions
        await fleet.stop("b")  # a leave: a takes them back
        await fleet.drive(10)
        assert a.partitions == frozenset(range(4))
    finally:
        await fleet.close()
    counts = await stream_keys(redis_client, redis_prefix)
    expected = [
        k
        for i in range(1, 17)
        for k in expected_slots(f"m{i:02d}", "@every 1s", T0, T0 + timedelta(seconds=runs))
    ]
    assert_exactly_once(counts, expected)  # the first `runs` slots of each, once
    assert sum(counts.values()) == len(expected) == 16 * runs  # and nothing after them


async def test_a_change_signal_wakes_only_the_manager_holding_the_rows_partition(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The NOTIFY names the partitions of the rows changed (migration 0016): the manager holding
    the row syncs, the other hears it and does not."""
    monkeypatch.setenv("PM_PARTITIONS", "4")
    await upgrade(pg_url)
    await insert_schedules(pg_url, [(f"n{i}", "@every 1h", {}) for i in range(1, 9)])
    settings = Settings(
        database_url=pg_url,
        target="outbox",
        coordination="partitions",
        lease_ttl=10,
        sync_interval=600,
        heartbeat_interval=5,
        listen=True,
    )
    fleet = Fleet(VirtualClock(T0))
    admin = await asyncpg.connect(dsn(pg_url))

    def syncs(m: PeriodicTaskManager) -> float:
        return m.registry.get_sample_value("periodic_manager_syncs_total", {"result": "ok"}) or 0.0

    def idle(m: PeriodicTaskManager) -> bool:
        listener = m.signals[0]
        assert isinstance(listener, PostgresChangeListener)
        return (
            listener.connected.is_set()
            and not m.syncer.requested.is_set()
            and not m.syncer.lock.locked()
        )

    try:
        a = await fleet.start("a", settings)
        b = await fleet.start("b", settings)
        await fleet.drive(10)  # a hands two partitions over, b takes them
        assert a.partitions and b.partitions and not a.partitions & b.partitions
        # The work done once (pruning by age) is the holder of partition 0's alone.
        assert [m._status().shared_work for m in (a, b)] == [0 in a.partitions, 0 in b.partitions]
        for m in (a, b):
            await eventually(lambda m=m: idle(m), "the listener connected, its first sync done")
        for holder, other in ((a, b), (b, a)):
            row = min(i for i in range(1, 9) if partition_of(i, 4) in holder.partitions)
            before = syncs(holder), syncs(other), other.signals_ignored
            await admin.execute("UPDATE periodic_jobs SET spec = '@every 2h' WHERE id = $1", row)
            await eventually(
                lambda h=holder, r=row: h.entry(r).spec == "@every 2h", "the holder synced"
            )  # type: ignore[union-attr]
            await eventually(
                lambda o=other, n=before[2]: o.signals_ignored > n, "the other heard it"
            )
            assert syncs(holder) == before[0] + 1
            assert syncs(other) == before[1]  # not woken: it holds none of the row's partition
            ignored = other.registry.get_sample_value(
                "periodic_manager_change_signals_ignored_total"
            )
            assert ignored == other.signals_ignored > before[2]
    finally:
        await fleet.close()
        await admin.close()


async def lone_manager(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, *, partitions: int, spec: str, many: int
) -> tuple[Fleet, PeriodicTaskManager]:
    """A manager alone over ``partitions`` partitions and ``many`` schedules of ``spec`` named
    l1, l2, ... (ids 1..many), started on a virtual clock: the fleet (to close) and the manager."""
    monkeypatch.setenv("PM_PARTITIONS", str(partitions))
    await upgrade(pg_url)
    await insert_schedules(pg_url, [(f"l{i}", spec, {}) for i in range(1, many + 1)])
    settings = Settings(
        database_url=pg_url,
        target="outbox",
        coordination="partitions",
        lease_ttl=10,
        sync_interval=600,
        heartbeat_interval=5,
        listen=False,
    )
    fleet = Fleet(VirtualClock(T0))
    try:
        return fleet, await fleet.start("a", settings)
    except BaseException:
        await fleet.close()
        raise


async def test_a_lost_partition_is_fenced_at_once_and_its_entries_go_in_turns(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    many = 2000
    fleet, a = await lone_manager(pg_url, monkeypatch, partitions=2, spec="@every 1s", many=many)
    try:
        assert a.holding is not None and len(a.entries()) == many
        a.holding.lost(frozenset({1}))  # as when its trust ran out
        fenced = a.scheduler.decisions.fenced
        assert fenced is not None and fenced(3) and not fenced(2)  # sending stops at once...
        assert len(a.entries()) == many  # ... before any entry is unregistered
        quiet = asyncio.ensure_future(a.holding.quiet())
        seen: set[int] = set()
        while not quiet.done():
            seen.add(len(a.entries()))
            await asyncio.sleep(0)
        await quiet
        assert any(many // 2 < n < many for n in seen)  # in turns: the loop ran between slices
        assert {e.ident for e in a.entries()} == set(range(2, many + 1, 2))
        assert a.scheduler.decisions.fenced is None  # lifted once they are gone
        assert a.health() is None  # a drop is work that ends, not a loop that died
    finally:
        await fleet.close()


async def test_a_dropped_partitions_entries_leave_the_timetable_and_the_map_at_once(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unregistered entries used to stay filed (and in memory) until their next slot: a manager
    that handed over most of its partitions kept their memory for hours."""
    many = 2000
    fleet, a = await lone_manager(pg_url, monkeypatch, partitions=4, spec="@every 3600s", many=many)
    try:
        assert a.holding is not None and len(a.entries()) == many
        timetable = a.scheduler.registered.timetable
        at = timetable.next_instant()
        assert at is not None and timetable.size(at) == many
        room = sys.getsizeof(a.scheduler.held())
        a.holding.lost(frozenset({1, 2, 3}))
        await a.holding.quiet()
        assert {e.ident for e in a.entries()} == set(range(4, many + 1, 4))
        assert timetable.size(at) == many // 4  # their filings went with them
        assert sys.getsizeof(a.scheduler.held()) < room / 2
    finally:
        await fleet.close()


async def test_leases_expiring_under_load_stop_the_sending_at_trust_end_with_the_renewal_in_flight(
    pg_url: str,
    proxied: tuple[str, TcpProxy],
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A renewal hangs (PostgreSQL reached through a proxy that stops answering: the round is in
    flight, so the lease loop cannot drop anything) while the scheduler keeps waking for slots:
    nothing is sent for a partition after its trust ends (renewal start + TTL - margin). Another
    manager takes the partitions once the database lets the leases expire, and every slot is on
    the stream once."""
    monkeypatch.setenv("PM_PARTITIONS", "4")
    schedules = 40
    await upgrade(pg_url)
    await insert_schedules(
        pg_url, [(f"x{i:02d}", "@every 1s", {}) for i in range(1, schedules + 1)]
    )
    common = dict(
        target="redis",
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        coordination="partitions",
        lease_ttl=10,
        grace=30,
        sync_interval=600,
        heartbeat_interval=5,
        listen=False,
    )
    cut_url, proxy = proxied
    fleet = Fleet(VirtualClock(T0))
    admin = await asyncpg.connect(dsn(pg_url))
    try:
        a = await fleet.start("a", Settings(database_url=cut_url, **common))  # type: ignore[arg-type]
        await fleet.drive(4)
        assert isinstance(a.leadership, PartitionLeases) and a.partitions == frozenset(range(4))
        proxy.freeze()  # the next renewal (and every store call) hangs
        trust_left = (
            min(until for _, until in a.leadership._held.values()) - fleet.clock.monotonic()
        )
        trust_end = fleet.clock.now() + timedelta(seconds=trust_left)  # trust runs on monotonic
        # The scheduler wakes every half second of virtual time, which passes in milliseconds:
        # the round stays in flight (its bound is real time, 3.3 s), so only the send path can
        # see that the trust has ended. (The run writer hangs on the store: not waited for.)
        while fleet.clock.now() < trust_end + timedelta(seconds=6):
            await fleet.clock.advance(0.5, settle=a.scheduler.wait_idle)
        sent = await stream_keys(redis_client, redis_prefix)
        late = sorted(k for k in sent if datetime.fromisoformat(k.split(":", 1)[1]) >= trust_end)
        assert not late, f"sent after the trust ended: {late[:5]}"
        assert sent  # it did send until then
        assert not a.partitions and not [e for e in a.entries() if isinstance(e.ident, int)]
        # The database lets the leases expire (moved into the past, as the TTL would), then b
        # takes every partition and sends from after what was settled, within grace.
        await admin.execute("UPDATE pm_partitions SET expires_at = now() - interval '1 second'")
        await admin.execute(
            "UPDATE pm_partition_members SET expires_at = now() - interval '1 second'"
        )
        fleet.managers.pop("a")  # its store calls hang: not settled until the proxy is back
        b = await fleet.start("b", Settings(database_url=pg_url, **common))  # type: ignore[arg-type]
        assert b.partitions == frozenset(range(4))
        await fleet.drive(5)
        end = fleet.clock.now()
        # a's run history hung with the store: b re-sends what a sent but could not record,
        # and the claims keep one of each (the audit below).
        assert b.scheduler.counts["duplicate"] > 0
    finally:
        await proxy.cut()  # a's hung calls fail at once
        await a.stop()
        await fleet.close()
        await admin.close()
    counts = await stream_keys(redis_client, redis_prefix)
    expected = [
        k
        for i in range(1, schedules + 1)
        for k in expected_slots(f"x{i:02d}", "@every 1s", T0, end)
    ]
    assert_exactly_once(counts, expected)
    assert sum(counts.values()) == len(expected)
