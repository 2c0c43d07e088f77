"""A row that turns bad keeps its last good version running until it is fixed or deleted, across
restarts: the manager stores that version (``pm_last_good``) and a manager that starts while the
row is still bad runs it, judged again, with the row error and a last-good note published. Real
managers (in the API's process, outbox target) on PostgreSQL and SQLite; time is a VirtualClock."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.api.app import create_app
from periodic_manager.api.state import state_of
from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import LastGoodVersion
from periodic_manager.db.engine import create_engine
from periodic_manager.db.provider import DatabaseProvider
from periodic_manager.db.store import DatabaseRuntimeStore
from periodic_manager.runtime.assemble import build_manager
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.runtime.timing import Timing
from periodic_manager.settings import Settings
from periodic_manager.targets.memory import MemoryTarget
from tests.support import rawsql
from tests.support.e2e import T0, Rig, at, iso
from tests.support.managers import ManualLeader, settle
from tests.support.polling import eventually

JOB = {"name": "keep.me", "spec": "* * * * *", "task_type": "t", "payload": {"v": 1}}


@asynccontextmanager
async def running(
    url: str, start: datetime, *, manager: bool = True, **overrides: Any
) -> AsyncIterator[Rig]:
    """The API with a manager in its process (outbox target; ``manager=False``: the API alone),
    from ``start`` on a VirtualClock; stopped (the manager too) on exit, like a process that
    ends."""
    # One leader: this VirtualClock jumps minutes at once, past the trust of partition leases
    # (their expiry is the database's real time); partitions run in test_partition_moves.py.
    # No change signal: it runs on the wall clock and would sync SQL edits at a virtual instant
    # of its own (tests/support/e2e.py says more).
    settings = Settings(
        database_url=url,
        target="outbox",
        sync_interval=30,
        grace=30,
        heartbeat_interval=5,
        **{"coordination": "leader", "listen": False, **overrides},
    )
    clock = VirtualClock(start)
    engine = create_engine(url)
    app = create_app(
        settings,
        clock=clock,
        engine=engine,
        manager_factory=(lambda eng: build_manager(settings, eng, clock=clock))
        if manager
        else None,
    )
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
                yield Rig(c, state_of(app).manager, clock, engine, settings, None)
    finally:
        await engine.dispose()


@asynccontextmanager
async def two_managers(
    url: str, timing: Timing
) -> AsyncIterator[tuple[PeriodicTaskManager, PeriodicTaskManager, AsyncEngine]]:
    """Two started managers on ``url`` (both leading, database provider and store, one memory
    target, one VirtualClock from T0), and their engine; stopped on exit."""
    clock, target = VirtualClock(T0), MemoryTarget()
    engine = create_engine(url)

    def make() -> PeriodicTaskManager:
        return PeriodicTaskManager(
            DatabaseProvider(engine),
            target,
            clock=clock,
            store=DatabaseRuntimeStore(engine),
            timing=timing,
            leadership=ManualLeader(True),
        )

    a, b = make(), make()
    await a.start()
    await b.start()
    try:
        yield a, b, engine
    finally:
        await a.stop()
        await b.stop()
        await engine.dispose()


async def payloads(rig: Rig, name: str = "keep.me") -> dict[str, Any]:
    """Slot -> payload of every task of ``name`` that reached the outbox."""
    return {
        m["scheduled_at"]: json.loads(m["payload"])
        for m in await rig.messages()
        if m["name"] == name
    }


async def manager_errors(rig: Rig, sid: int) -> list[dict[str, Any]]:
    body = (await rig.client.get(f"/schedules/{sid}")).json()
    return [e for e in body["errors"] if e["source"] == "manager"]


async def stored(url: str) -> list[tuple[Any, ...]]:
    return await rawsql.execute(url, "SELECT schedule_key, spec, payload FROM pm_last_good")


async def test_the_last_good_version_survives_a_restart_until_the_row_is_fixed(db_url: str) -> None:
    async with running(db_url, T0) as rig:
        sid = (await rig.client.post("/schedules", json=JOB)).json()["id"]
        await rig.advance_to(at(12, 2, 30))
        assert await payloads(rig) == {iso(at(12, 1)): {"v": 1}, iso(at(12, 2)): {"v": 1}}

        # The row turns bad (plain SQL: the API would refuse it); the good version goes on.
        await rawsql.execute(
            db_url,
            f"""UPDATE periodic_jobs SET spec = '61 * * * *', payload = '{{"v": 2}}' WHERE id = {sid}""",
        )
        await rig.advance_to(at(12, 4, 30))
        assert (
            list((await payloads(rig)).values()) == [{"v": 1}] * 4
        )  # 12:01-12:04, the old version
        [err] = await manager_errors(rig, sid)
        assert err["field"] == "spec" and err["last_good_since"] is not None, err
        since = err["last_good_since"]
        # When the manager saw it bad (at once with LISTEN, at the next sync on SQLite).
        assert at(12, 2, 30) <= datetime.fromisoformat(since.replace("Z", "+00:00")) <= at(12, 3, 1)
        assert [(k, s) for k, s, _ in await stored(db_url)] == [(str(sid), "* * * * *")]

    # A new manager starts while the row is still bad: it runs the stored last good version.
    async with running(db_url, at(12, 6, 0)) as rig:
        assert rig.manager.entry(sid) is not None
        await rig.advance_to(at(12, 8, 30))
        got = await payloads(rig)
        # Nothing fires at start (12:05 and 12:06 passed while no manager ran); then v1 again.
        assert list(got) == [iso(at(12, m)) for m in (1, 2, 3, 4, 7, 8)]
        assert all(p == {"v": 1} for p in got.values())
        [err] = await manager_errors(rig, sid)
        assert err["field"] == "spec" and err["manager_id"] == rig.manager.manager_id
        assert err["last_good_since"] == since  # kept since the row turned bad, not since start
        api_err = (await rig.client.get(f"/schedules/{sid}")).json()["errors"][0]
        assert api_err["source"] == "api" and api_err["field"] == "spec"
        entries = (await rig.client.get("/entries", params={"schedule_id": sid})).json()["items"]
        assert sorted(e["status"] for e in entries) == ["active", "error"]
        [error_entry] = [e for e in entries if e["status"] == "error"]
        assert error_entry["last_good_since"] == since
        [active] = [e for e in entries if e["status"] == "active"]
        assert active["spec"] == "* * * * *"  # the version that runs is the stored good one
        views = (await rig.client.get("/views/entries", params={"status": "error"})).json()
        assert views["items"][0]["last_good_since"] == since

        # Fixed: the new version runs, the note and the stored version are gone.
        r = await rig.client.patch(
            f"/schedules/{sid}", json={"spec": "*/2 * * * *", "payload": {"v": 3}}
        )
        assert r.status_code == 200, r.text
        await rig.advance_to(at(12, 12, 30))
        got = await payloads(rig)
        assert {k: v for k, v in got.items() if k > iso(at(12, 8))} == {
            iso(at(12, 10)): {"v": 3},
            iso(at(12, 12)): {"v": 3},
        }
        assert (await rig.client.get(f"/schedules/{sid}")).json()["errors"] == []
        assert await stored(db_url) == []

    # And a restart after the fix runs the fixed row, nothing else.
    async with running(db_url, at(12, 13, 0)) as rig:
        await rig.advance_to(at(12, 14, 30))
        assert (await payloads(rig))[iso(at(12, 14))] == {"v": 3}


async def test_a_row_that_was_never_good_runs_nowhere_and_says_so(db_url: str) -> None:
    async with running(db_url, at(12, 0, 30)) as rig:
        sid = await rawsql.insert(db_url, "born.bad", spec="'61 * * * *'")
        await rig.advance_to(at(12, 2, 30))
        [err] = await manager_errors(rig, sid)
        assert err["last_good_since"] is None  # no version of it runs: the API does not claim one
        assert await stored(db_url) == [] and rig.manager.entry(sid) is None


@pytest.mark.parametrize("how", ["pause", "delete-sql", "delete-api-while-stopped"])
async def test_the_stored_version_is_forgotten_when_the_row_is_paused_or_deleted(
    db_url: str, how: str
) -> None:
    async with running(db_url, at(12, 0, 30)) as rig:
        sid = (await rig.client.post("/schedules", json=JOB)).json()["id"]
        await rig.advance_to(at(12, 1, 30))
        await rawsql.execute(
            db_url, f"UPDATE periodic_jobs SET spec = '61 * * * *' WHERE id = {sid}"
        )
        await rig.advance_to(at(12, 3, 30))
        assert len(await stored(db_url)) == 1
        if how == "pause":
            assert (await rig.client.post(f"/schedules/{sid}/pause")).status_code == 200
        elif how == "delete-sql":
            await rawsql.execute(db_url, f"DELETE FROM periodic_jobs WHERE id = {sid}")
        if how != "delete-api-while-stopped":
            await rig.advance_to(at(12, 5, 30))
            assert await stored(db_url) == [] and rig.manager.entry(sid) is None
            before = len(await payloads(rig))
    if how == "delete-api-while-stopped":
        # No manager runs: the API's DELETE takes the stored version with the row.
        async with running(db_url, at(12, 4, 0), manager=False) as rig:
            assert (await rig.client.delete(f"/schedules/{sid}")).status_code == 204
            assert await stored(db_url) == []
        return
    # Resumed after a restart while still bad: the old version does not come back.
    if how == "pause":
        await rawsql.execute(db_url, f"UPDATE periodic_jobs SET enabled = true WHERE id = {sid}")
    async with running(db_url, at(12, 7, 0)) as rig:
        await rig.advance_to(at(12, 9, 30))
        assert rig.manager.entry(sid) is None and len(await payloads(rig)) == before


@pytest.mark.parametrize(
    "tamper",
    [
        "spec = '61 * * * *'",
        """options = '{"target": "celery"}'""",  # not configured here: the judge's target check
        "payload = 'not json'",
        "anchor = NULL, spec = '@every 36501d'",
    ],
)
async def test_a_stored_version_is_judged_again_and_never_trusted(db_url: str, tamper: str) -> None:
    async with running(db_url, at(12, 0, 30)) as rig:
        sid = (await rig.client.post("/schedules", json=JOB)).json()["id"]
        await rig.advance_to(at(12, 1, 30))
        await rawsql.execute(
            db_url, f"UPDATE periodic_jobs SET spec = '61 * * * *' WHERE id = {sid}"
        )
        await rig.advance_to(at(12, 3, 30))
    assert len(await stored(db_url)) == 1  # untouched, it would run (the first test)
    await rawsql.execute(db_url, f"UPDATE pm_last_good SET {tamper}")
    async with running(db_url, at(12, 5, 0)) as rig:
        await rig.advance_to(at(12, 7, 30))
        assert rig.manager.entry(sid) is None  # nothing unusable runs, whoever stored it
        assert rig.manager.failed is None
        [err] = await manager_errors(rig, sid)
        assert err["field"] == "spec" and err["last_good_since"] is None
        assert [k for k in await payloads(rig) if k > iso(at(12, 3))] == []


async def test_a_manager_with_an_older_view_neither_overwrites_nor_forgets_a_newer_version(
    db_url: str,
) -> None:
    engine = create_engine(db_url)
    store = DatabaseRuntimeStore(engine)

    def version(spec: str, bad: int | None, since: datetime) -> LastGoodVersion:
        return LastGoodVersion(
            "7", "n", spec, "UTC", None, "t", "null", "{}", None, spec * 2, 3, bad, since, "m"
        )

    try:
        t1, t2 = datetime(2024, 5, 1, 12, tzinfo=UTC), datetime(2024, 5, 1, 13, tzinfo=UTC)
        await store.save_last_good([version("@daily", 10, t1)])
        await store.save_last_good([version("@daily", 12, t2)])  # bad again at 12: same content
        await store.save_last_good([version("@hourly", 11, t2)])  # a manager that saw revision 11
        [loaded] = await store.load_last_good(["7", "8"])
        assert loaded.raw[1] in ("@daily", b"@daily") and loaded.bad_revision == 12
        assert loaded.since == t1  # the same content keeps its since
        assert await store.last_good_index() == {"7": 12}
        await store.forget_last_good(["7"], 11)  # seen good at revision 11: before it turned bad
        assert await store.last_good_index() == {"7": 12}
        await store.forget_last_good(["7"], 12)
        assert await store.last_good_index() == {}
    finally:
        await engine.dispose()


async def test_hostile_rows_in_pm_last_good_never_fail_a_sync(db_url: str) -> None:
    async with running(db_url, at(12, 0, 30)) as rig:
        sid = (await rig.client.post("/schedules", json=JOB)).json()["id"]
        await rig.advance_to(at(12, 1, 30))
        await rawsql.execute(
            db_url, f"UPDATE periodic_jobs SET spec = '61 * * * *' WHERE id = {sid}"
        )
        await rig.advance_to(at(12, 3, 30))
    if db_url.startswith("sqlite"):
        junk = "since = 'soon', anchor = X'FF', bad_revision = 'x', effective_at = 'never'"
    elif db_url.startswith("mysql"):  # zero dates
        junk = "since = '0000-00-00', anchor = '2024-00-00', effective_at = '0000-00-00'"
    else:
        junk = "since = 'infinity', anchor = '10000-01-01 00:00:00+00', effective_at = '-infinity'"
    await rawsql.execute(db_url, f"UPDATE pm_last_good SET {junk}")
    await rawsql.execute(
        db_url,
        "INSERT INTO pm_last_good (schedule_key, name, spec, timezone, task_type, payload, options,"
        " content_hash, since) VALUES ('name:x', 'x', '@daily', 'UTC', 't', 'null', '{}', 'h',"
        f" {rawsql.instant(db_url, '2024-05-01 12:00:00')})",
    )
    async with running(db_url, at(12, 5, 0)) as rig:
        await rig.advance_to(at(12, 7, 30))
        assert rig.manager.failed is None and rig.manager.last_sync_error is None
        # The anchor cannot be read: the stored version is refused like a row with that anchor.
        assert rig.manager.entry(sid) is None
        [err] = await manager_errors(rig, sid)
        assert err["field"] == "spec"
        # A full reconcile forgets what belongs to no bad row (the 'name:x' junk).
        await rig.manager.sync(full=True)
        async with rig.engine.connect() as conn:
            keys = (
                (await conn.execute(text("SELECT schedule_key FROM pm_last_good"))).scalars().all()
            )
        assert keys == [str(sid)]  # the bad row's own version stays (refused, not forgotten)


async def test_a_standby_started_while_the_row_is_bad_takes_over_with_its_last_good_version(
    db_url: str,
) -> None:
    """Managers as objects (database provider and store, memory target, leadership by hand): the
    leader stores the version when the row turns bad; a standby started afterwards restores it,
    and runs it when it takes over (re-sending the last grace, as any takeover)."""
    clock, target = VirtualClock(T0), MemoryTarget()
    engine = create_engine(db_url)
    before = rawsql.instant(db_url, "2024-04-30 12:00:00")
    sid = await rawsql.insert(
        db_url, "keep.me", spec="'@every 10s'", payload="""'{"v": 1}'""", effective_at=before
    )

    def make(leader: bool) -> PeriodicTaskManager:
        return PeriodicTaskManager(
            DatabaseProvider(engine),
            target,
            clock=clock,
            store=DatabaseRuntimeStore(engine),
            timing=Timing(grace=30, sync_interval=3600),
            leadership=ManualLeader(leader),
        )

    leader = make(True)
    await leader.start()
    standby: PeriodicTaskManager | None = None
    try:
        await clock.advance(25, settle=lambda: leader.wait_settled(clock.now()))
        await rawsql.execute(
            db_url, f"UPDATE periodic_jobs SET spec = '@every 0s' WHERE id = {sid}"
        )
        await leader.sync()  # the row is bad now: its good version is stored, and keeps running
        standby = make(False)
        await standby.start()
        restored = standby.entry(sid)
        assert restored is not None and restored.spec == "@every 10s"  # held, not sent: standby
        await settle(clock, leader, standby)
        await clock.advance(10, settle=lambda: leader.wait_settled(clock.now()))
        await leader.stop()  # dies at 12:00:35.5; nobody leads for 20 s
        await clock.advance(20)
        await standby.leadership._set(True)  # type: ignore[attr-defined]
        # The takeover reads the settled slots from the database (real I/O, in a task of its
        # own that a settle does not wait for) before its scheduler sends: polled for.
        await eventually(lambda: standby.scheduler.active, "the standby took over")
        await settle(clock, standby)
        # 12:00:10-30 by the leader; 12:00:40 and :50 re-sent by the standby (within grace).
        assert target.slots("keep.me") == [
            T0.replace(microsecond=0) + timedelta(seconds=s) for s in (10, 20, 30, 40, 50)
        ]
        assert {t.payload_json for t, _ in target.messages} == {'{"v":1}'}
        [err] = [bad.record for bad in standby.syncer.reconciler.row_errors.values()]
        assert err.last_error is not None and err.last_error.startswith("spec: ")
        assert err.last_good_since == T0 + timedelta(seconds=25)  # when the leader saw it bad
    finally:
        if standby is not None:
            await standby.stop()
        await leader.stop()  # if an assert came before its stop (a second stop does nothing)
        await engine.dispose()


async def test_a_manager_that_never_saw_the_row_good_runs_the_version_another_one_stored(
    db_url: str,
) -> None:
    """Created and broken between two of B's syncs: B never held it, A did and stored it. B's
    next (incremental) sync finds the row bad and the stored version, and runs that."""
    async with two_managers(db_url, Timing(grace=30, sync_interval=3600)) as (a, b, _):
        sid = await rawsql.insert(db_url, "quick", spec="'@every 10s'")
        await a.sync()
        await rawsql.execute(
            db_url, f"UPDATE periodic_jobs SET spec = '@every 0s' WHERE id = {sid}"
        )
        await a.sync()
        assert b.entry(sid) is None
        report = await b.sync()  # incremental: the row is new to B, and bad
        assert [e.schedule_id for e in report.errors] == [sid]
        entry = b.entry(sid)
        assert entry is not None and entry.spec == "@every 10s"
        assert b.syncer.reconciler.row_errors[str(sid)].record.last_good_since == T0


async def test_a_full_reconcile_due_with_nothing_written_still_restores_a_version_stored_since(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B reads the row already bad, when nothing is stored yet; A stores its version after.
    Nothing is written to periodic_jobs since B's read, so B's next full reconcile is the
    digest alone on PostgreSQL (no row listed): it still looks at what is stored, and B runs
    A's version (as a full reconcile that lists the rows does on SQLite and MariaDB/MySQL)."""
    listed: list[str] = []
    get_configs = DatabaseProvider.get_configs

    async def counted(self: DatabaseProvider) -> Any:
        listed.append("get_configs")
        return await get_configs(self)

    monkeypatch.setattr(DatabaseProvider, "get_configs", counted)

    timing = Timing(grace=30, sync_interval=3600, full_sync_interval=60)
    async with two_managers(db_url, timing) as (a, b, engine):
        sid = await rawsql.insert(db_url, "quick", spec="'@every 10s'")
        await a.sync()
        await rawsql.execute(
            db_url, f"UPDATE periodic_jobs SET spec = '@every 0s' WHERE id = {sid}"
        )
        report = await b.sync(full=True)  # bad, and no version stored: nothing runs in B
        assert [e.schedule_id for e in report.errors] == [sid] and b.entry(sid) is None
        await a.sync()  # A sees it bad and stores the version it ran
        assert [r[0] for r in await stored(db_url)] == [str(sid)]
        assert isinstance(b.clock, VirtualClock)
        await b.clock.advance(61)
        listed.clear()
        await b.sync()  # a full reconcile is due
        assert listed == ([] if engine.dialect.name == "postgresql" else ["get_configs"])
        entry = b.entry(sid)
        assert entry is not None and entry.spec == "@every 10s"
        assert b.syncer.reconciler.row_errors[str(sid)].record.last_good_since is not None
