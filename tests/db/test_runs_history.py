"""Run history (pm_runs) in the database store: rows with lateness, bounds, cleanup, on both
databases."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.contracts import ManagerInfo, ManagerStatus, RunRecord
from periodic_manager.db.engine import create_engine
from periodic_manager.db.models import runs_table
from periodic_manager.db.store import DatabaseRuntimeStore

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run(
    key: str, slot_s: float, status: Any = "enqueued", late_s: float = 0.25, **kw: Any
) -> RunRecord:
    return RunRecord(key, f"job.{key}", at(slot_s), status, at(slot_s + late_s), **kw)


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_engine(db_url)
    try:
        yield eng
    finally:
        await eng.dispose()


async def rows(engine: AsyncEngine, key: str | None = None) -> list[Any]:
    stmt = select(runs_table).order_by(
        runs_table.c.schedule_key, runs_table.c.slot_at, runs_table.c.id
    )
    if key is not None:
        stmt = stmt.where(runs_table.c.schedule_key == key)
    async with engine.connect() as conn:
        return list((await conn.execute(stmt)).all())


async def count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(runs_table))).scalar_one())


async def test_every_run_is_a_row_with_its_lateness(engine: AsyncEngine) -> None:
    store = DatabaseRuntimeStore(engine)
    await store.record_runs(
        [
            run("1", 60, message_id="m-1"),
            run("1", 120, "skipped", late_s=45, error="45.000 s late"),
            run("2", 60, "failed", late_s=0.0015, error="redis down"),
            run("2", 120, "duplicate", message_id="m-0"),
        ]
    )
    got = [
        (r.schedule_key, r.slot_at, r.status, r.lateness_ms, r.message_id, r.error)
        for r in await rows(engine)
    ]
    assert got == [
        ("1", at(60), "enqueued", 250, "m-1", None),
        ("1", at(120), "skipped", 45000, None, "45.000 s late"),
        ("2", at(60), "failed", 2, None, "redis down"),
        ("2", at(120), "duplicate", 250, "m-0", None),
    ]
    assert (await rows(engine))[0].at == at(60.25) and (await rows(engine))[0].name == "job.1"


async def test_lateness_is_elapsed_time_across_a_dst_change(engine: AsyncEngine) -> None:
    from zoneinfo import ZoneInfo

    berlin = ZoneInfo("Europe/Berlin")
    slot = datetime(2030, 3, 31, 1, 59, tzinfo=berlin)  # one minute before the clocks jump
    done = (slot.astimezone(UTC) + timedelta(minutes=2)).astimezone(berlin)  # 04:01 local
    await DatabaseRuntimeStore(engine).record_runs([RunRecord("1", "j", slot, "enqueued", done)])
    assert [r.lateness_ms for r in await rows(engine)] == [120_000]


async def test_history_off_writes_no_rows(engine: AsyncEngine) -> None:
    await DatabaseRuntimeStore(engine, runs_per_schedule=0).record_runs([run("1", 60)])
    assert await count(engine) == 0


async def test_prune_keeps_the_newest_per_schedule_and_drops_old_rows(engine: AsyncEngine) -> None:
    store = DatabaseRuntimeStore(engine, runs_retention=timedelta(days=1), runs_per_schedule=3)
    await store.record_runs([run("a", s * 60) for s in range(10)] + [run("b", 60)])
    await store.record_runs([run("c", -2 * 86400)])  # two days old
    removed = await store.prune_runs(at(600))
    assert removed == 7 + 1
    assert [r.slot_at for r in await rows(engine, "a")] == [at(420), at(480), at(540)]
    assert len(await rows(engine, "b")) == 1 and await rows(engine, "c") == []
    # Nothing written since: the cap has no schedules to look at; the age bound still applies.
    assert await store.prune_runs(at(600)) == 0
    assert await store.prune_runs(at(86400 + 500)) == 3  # a's 420, 480 and b's 60 are past a day
    assert [r.slot_at for r in await rows(engine)] == [at(540)]


async def test_age_prune_is_bounded_per_call(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from periodic_manager.db import history

    monkeypatch.setattr(history, "_PRUNE_BATCH", 10)
    monkeypatch.setattr(history, "_PRUNE_ROUNDS", 2)
    store = DatabaseRuntimeStore(
        engine, runs_retention=timedelta(seconds=1), runs_per_schedule=1000
    )
    await store.record_runs([run(str(k), 0) for k in range(45)])
    assert await store.prune_runs(at(100), keys=[]) == 20
    assert await store.prune_runs(at(100), keys=[]) == 20
    assert await store.prune_runs(at(100), keys=[]) == 5
    assert await count(engine) == 0


async def heartbeat(store: DatabaseRuntimeStore, manager_id: str, status: ManagerStatus) -> None:
    """A heartbeat as the manager's heartbeat loop writes it: the beat, then the prune after it."""
    await store.heartbeat(manager_id, status)
    await store.beaten(status)


async def test_heartbeat_prunes_at_most_once_per_interval(engine: AsyncEngine) -> None:
    store = DatabaseRuntimeStore(
        engine, runs_retention=timedelta(seconds=30), prune_interval=timedelta(seconds=60)
    )
    info = ManagerInfo("m1", "h", 1, "0", at(0))

    def beat(s: float) -> ManagerStatus:
        return ManagerStatus(at(s), True, None, None, 0)

    await store.register_manager(info, beat(0))
    await store.record_runs([run("1", 0)])
    await heartbeat(store, "m1", beat(5))  # the first heartbeat only starts the timer
    await heartbeat(store, "m1", beat(50))
    assert await count(engine) == 1
    await heartbeat(store, "m1", beat(65))  # due: the row is 65 s old, retention 30 s
    assert await count(engine) == 0


async def test_a_manager_recording_no_runs_prunes_ten_times_less_often(engine: AsyncEngine) -> None:
    """At rest (no run recorded since the last prune) only age is left to prune, over days: the
    heartbeat prunes every ``idle_prune_interval`` (10 minutes), not every minute."""
    store = DatabaseRuntimeStore(engine, runs_retention=timedelta(seconds=30))
    assert store.prune_interval == timedelta(minutes=1)
    assert store.idle_prune_interval == timedelta(minutes=10)
    statements: list[str] = []

    def count_deletes(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            statements.append(statement)

    await store.register_manager(
        ManagerInfo("m1", "h", 1, "0", at(0)), ManagerStatus(at(0), True, None, None, 0)
    )
    await DatabaseRuntimeStore(engine).record_runs([run("1", -60)])  # another manager's, aged out
    await heartbeat(store, "m1", ManagerStatus(at(5), True, None, None, 0))  # starts the timer
    event.listen(engine.sync_engine, "before_cursor_execute", count_deletes)
    try:
        for s in range(10, 600, 5):  # nine minutes of beats at rest
            await heartbeat(store, "m1", ManagerStatus(at(s), True, None, None, 0))
        assert statements == [] and await count(engine) == 1
        await heartbeat(store, "m1", ManagerStatus(at(605), True, None, None, 0))
        assert statements and await count(engine) == 0
        statements.clear()
        await store.record_runs([run("2", 600)])  # recording again: once a minute
        await heartbeat(store, "m1", ManagerStatus(at(660), True, None, None, 0))
        assert statements == []
        await heartbeat(store, "m1", ManagerStatus(at(665), True, None, None, 0))
        assert statements
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", count_deletes)


async def test_heartbeat_prunes_the_change_history_too(engine: AsyncEngine) -> None:
    from periodic_manager.db.models import schedule_changes_table

    store = DatabaseRuntimeStore(
        engine,
        changes_retention=timedelta(seconds=30),
        changes_per_schedule=1,
        prune_interval=timedelta(seconds=60),
        idle_prune_interval=timedelta(seconds=60),  # this manager records no runs
    )
    info = ManagerInfo("m1", "h", 1, "0", at(0))
    await store.register_manager(info, ManagerStatus(at(0), True, None, None, 0))
    values = {"name": "n", "action": "updated", "source": "sql", "changes": "{}"}
    async with engine.begin() as conn:
        await conn.execute(
            schedule_changes_table.insert(),
            [
                {**values, "schedule_id": 1, "at": at(0)},
                {**values, "schedule_id": 2, "at": at(40)},
                {**values, "schedule_id": 2, "at": at(41)},
            ],
        )

    async def left() -> list[Any]:
        async with engine.connect() as conn:
            stmt = select(
                schedule_changes_table.c.schedule_id, schedule_changes_table.c.at
            ).order_by(schedule_changes_table.c.id)
            return [tuple(r) for r in (await conn.execute(stmt)).all()]

    await heartbeat(store, "m1", ManagerStatus(at(5), True, None, None, 0))  # starts the timer
    assert len(await left()) == 3
    await heartbeat(store, "m1", ManagerStatus(at(65), True, None, None, 0))
    assert await left() == [(2, at(41))]  # too old (35 s > 30 s), and beyond the cap of one


async def test_a_schedules_history_goes_with_its_row(engine: AsyncEngine) -> None:
    from periodic_manager.db import schedule_writer

    store = DatabaseRuntimeStore(engine)
    await store.record_runs([run("1", 60), run("1", 120), run("2", 60)])
    async with engine.begin() as conn:
        await schedule_writer.delete_rows(conn, [1])
    assert [r.schedule_key for r in await rows(engine)] == ["2"]


async def test_a_burst_is_written_in_chunks(engine: AsyncEngine) -> None:
    store = DatabaseRuntimeStore(engine, runs_per_schedule=5)
    await store.record_runs([run(str(k), 60) for k in range(12_000)])
    assert await count(engine) == 12_000


async def test_only_the_manager_doing_the_shared_work_prunes_by_age(engine: AsyncEngine) -> None:
    """PM_COORDINATION=partitions: rows past the retention and the change history are pruned by
    one manager (the holder of partition 0); another trims only the schedules it wrote."""
    from periodic_manager.db.models import schedule_changes_table

    def store() -> DatabaseRuntimeStore:
        return DatabaseRuntimeStore(
            engine,
            runs_retention=timedelta(seconds=30),
            runs_per_schedule=1,
            changes_retention=timedelta(seconds=30),
            prune_interval=timedelta(seconds=60),
            idle_prune_interval=timedelta(seconds=60),  # the holder records no runs
        )

    other, holder = store(), store()
    for name, s in (("other", other), ("holder", holder)):
        await s.register_manager(
            ManagerInfo(name, "h", 1, "0", at(0)), ManagerStatus(at(0), True, None, None, 0)
        )
    await other.record_runs([run("1", 0), run("2", 60), run("2", 61)])  # "1" old, "2" over its cap
    async with engine.begin() as conn:
        await conn.execute(
            schedule_changes_table.insert(),
            [
                {
                    "name": "n",
                    "action": "updated",
                    "source": "sql",
                    "changes": "{}",
                    "schedule_id": 1,
                    "at": at(0),
                }
            ],
        )

    async def changes() -> int:
        async with engine.connect() as conn:
            return int(
                (
                    await conn.execute(select(func.count()).select_from(schedule_changes_table))
                ).scalar_one()
            )

    for name, s, shared in (("other", other, False), ("holder", holder, True)):
        await heartbeat(s, name, ManagerStatus(at(5), True, None, None, 0, shared_work=shared))
    await heartbeat(other, "other", ManagerStatus(at(65), True, None, None, 0, shared_work=False))
    assert await count(engine) == 2  # its own "2" trimmed to one; the old row of "1" left
    assert await changes() == 1
    await heartbeat(holder, "holder", ManagerStatus(at(65), True, None, None, 0, shared_work=True))
    assert await count(engine) == 1 and await changes() == 0  # the holder of partition 0 did it


async def test_backfill_records_are_pruned_by_age_alone_and_go_with_their_row(
    engine: AsyncEngine,
) -> None:
    """What backfills sent (pm_backfill_slots) is kept PM_RUNS_RETENTION whatever the cap per
    schedule (a backfill's slots are a schedule's oldest: the cap would drop them first), and is
    deleted with its schedule."""
    from periodic_manager.db import backfill_slots, schedule_writer

    slots = [at(60 * k) for k in range(5)]

    async def kept(key: str) -> int:
        async with engine.connect() as conn:
            return len(await backfill_slots.recorded(conn, key, at(-1), at(3600)))

    for key, when in (("1", at(10)), ("2", at(10)), ("3", at(7200))):
        claimed = await backfill_slots.claim(engine, key, f"job.{key}", slots, "b", when, None)
        await backfill_slots.finish(engine, key, "b", claimed.mine, [], when, limited=False)
    store = DatabaseRuntimeStore(engine, runs_retention=timedelta(hours=1), runs_per_schedule=1)
    await store.prune_runs(at(3700), keys=["1", "2", "3"])  # the cap of 1 per schedule: no effect
    assert [await kept(k) for k in "123"] == [0, 0, 5]  # 1 and 2 sent at 10 s: past the hour
    claimed = await backfill_slots.claim(engine, "1", "job.1", slots, "c", at(3700), None)
    assert claimed.mine == slots  # forgotten: claimable again
    async with engine.begin() as conn:
        await schedule_writer.delete_rows(conn, [3])
    assert await kept("3") == 0
