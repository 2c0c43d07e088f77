"""Nothing written into periodic_jobs can kill, freeze or skew the schedule: with every hostile
row of tests/support/rawsql.py in the table (raw SQL, each backend that can hold it), the manager keeps
firing the good rows, reports each bad one naming the same field as the API, sees new rows,
and starts again with the good rows after a restart. Time is a VirtualClock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import upgrade
from periodic_manager.db.provider import DatabaseProvider
from periodic_manager.schedules.definition import UNKNOWN_START
from tests.conftest import backend_url
from tests.support import rawsql
from tests.support.e2e import Rig, at, e2e_rig, iso


@pytest.fixture(params=rawsql.BACKENDS)
def url(request: pytest.FixtureRequest) -> str:
    return backend_url(request, request.param)


def backend_of(url: str) -> str:
    return next(b for b in rawsql.BACKENDS if url.startswith(b))


async def seed(url: str) -> tuple[dict[str, int], dict[int, str]]:
    """Good rows (one of them fire_once, so a restart runs the catch-up path) and every hostile
    case of the backend; returns the good ids by name and the expected field by hostile id."""
    await upgrade(url)
    good = {
        "good.minute": await rawsql.insert(url, "good.minute"),
        "good.catchup": await rawsql.insert(
            url, "good.catchup", options="""'{"misfire": "fire_once", "catchup_window": 600}'"""
        ),
    }
    hostile: dict[int, str] = {}
    for i, case in enumerate(rawsql.cases(backend_of(url))):
        name = case.columns.get("name", f"'hostile.{i}'").strip("'")
        row_id = await rawsql.insert(url, name, **case.columns)
        hostile[row_id] = case.field
    return good, hostile


async def rig_on(url: str, redis_prefix: str, redis_url: str) -> AsyncIterator[Rig]:
    async for r in e2e_rig(url, "outbox", redis_prefix, redis_url):
        yield r


async def entries(rig: Rig) -> dict[int, dict[str, Any]]:
    items = (await rig.client.get("/entries")).json()["items"]
    return {e["schedule_id"]: e for e in items}


async def test_hostile_rows_are_reported_and_every_good_row_keeps_firing_across_a_restart(
    url: str, redis_prefix: str, redis_url: str
) -> None:
    good, hostile = await seed(url)
    async for rig in rig_on(url, redis_prefix, redis_url):
        await rig.advance_to(at(12, 3, 30))
        assert await rig.slots("good.minute") == [iso(at(12, m)) for m in (1, 2, 3)]
        # (fire_once may also have caught up the 12:00 slot, missed before the start)
        assert (await rig.slots("good.catchup"))[-3:] == [iso(at(12, m)) for m in (1, 2, 3)]
        assert rig.manager.failed is None  # no loop of the manager died

        # Each hostile row is reported by the manager and shown by the API, naming one field.
        live = await entries(rig)
        for row_id, field in hostile.items():
            entry = live[row_id]
            assert entry["status"] == "error", entry
            assert entry["last_error"].startswith(f"{field}: "), (field, entry["last_error"])
            errors = (await rig.client.get(f"/schedules/{row_id}")).json()["errors"]
            own = [e for e in errors if e["source"] == "api"]
            reported = [e for e in errors if e["source"] == "manager"]
            assert own[0]["field"] == field and reported[0]["field"] == field, errors
        assert {k for k, e in live.items() if e["status"] == "active"} == set(good.values())

        # The sync is not frozen: a row written now is picked up and fires.
        late = await rawsql.insert(url, "good.late")
        await rig.advance_to(at(12, 6, 30))
        # (at once with LISTEN on PostgreSQL, at the next 30 s sync on SQLite)
        assert (await rig.slots("good.late"))[-2:] == [iso(at(12, 5)), iso(at(12, 6))]
        assert await rig.slots("good.minute") == [iso(at(12, m)) for m in range(1, 7)]

    # A restart (start-up read, catch-up of the fire_once row) starts with every good row.
    async for rig in rig_on(url, redis_prefix, redis_url):
        await rig.advance_to(at(12, 8, 30))
        live = await entries(rig)
        assert {k for k, e in live.items() if e["status"] == "active"} == {*good.values(), late}
        assert {k for k, e in live.items() if e["status"] == "error"} == set(hostile)
        assert (await rig.slots("good.minute"))[-2:] == [iso(at(12, 7)), iso(at(12, 8))]
        listing = (await rig.client.get("/schedules", params={"limit": 500})).json()
        assert listing["total"] == len(good) + len(hostile) + 1


@pytest.fixture
async def engine(url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_engine(url)
    try:
        yield eng
    finally:
        await eng.dispose()


async def test_the_provider_judges_each_hostile_row_alone(url: str, engine: AsyncEngine) -> None:
    await upgrade(url)
    kept = await rawsql.insert(url, "kept")  # older than the seed: what follows is read as changes
    provider = DatabaseProvider(engine)
    before = (await provider.get_configs()).revision
    assert before is not None
    good, hostile = await seed(url)
    for _ in range(2):  # the second read comes from the cache of unchanged rows
        snap = await provider.get_configs()
        assert sorted(c.schedule_id for c in snap.configs) == sorted([*good.values(), kept])
        assert {e.schedule_id: e.field for e in snap.errors} == hostile
    changes = await provider.get_changes(before)
    assert changes is not None and not changes.full
    assert sorted(c.schedule_id for c in changes.configs) == sorted(good.values())
    assert {e.schedule_id: e.field for e in changes.errors} == hostile


async def test_a_row_over_the_size_limit_is_a_row_error_with_its_code(
    url: str, engine: AsyncEngine
) -> None:
    await upgrade(url)
    small = await rawsql.insert(url, "small", payload="'\"" + "x" * 900 + "\"'")
    provider = DatabaseProvider(engine, max_payload_bytes=512)
    snap = await provider.get_configs()
    [err] = snap.errors
    assert (err.schedule_id, err.field, err.code) == (small, "payload", "too-large")
    assert "902 bytes" in err.reason and "512" in err.reason
    assert [c.name for c in (await DatabaseProvider(engine).get_configs()).configs] == ["small"]


async def test_effective_at_is_read_as_an_instant_or_unknown_never_a_row_error(
    url: str, engine: AsyncEngine
) -> None:
    await upgrade(url)
    values = {"given": rawsql.instant(url, "2024-05-01 10:00:00.250000")}
    if backend_of(url) == "postgresql":
        values |= {"infinity": "'infinity'", "year10000": "'10000-01-01 00:00:00+00'"}
    elif backend_of(url) == "mysql":
        values |= {"zero": "'0000-00-00 00:00:00'", "zero.day": "'2024-05-00 00:00:00'"}
    else:
        values |= {"junk": "'soon'", "blob": "X'FF'", "plus14": "'0001-01-01T00:00:00+14:00'"}
    for label, sql in values.items():
        await rawsql.insert(url, label, effective_at=sql)
    nulled = await rawsql.insert(url, "nulled")
    await rawsql.execute(url, f"UPDATE periodic_jobs SET effective_at = NULL WHERE id = {nulled}")
    snap = await DatabaseProvider(engine).get_configs()
    assert snap.errors == []
    got = {c.name: c.effective_at for c in snap.configs}
    assert got.pop("given") == datetime(2024, 5, 1, 10, 0, 0, 250000, tzinfo=UTC)
    assert got == {label: UNKNOWN_START for label in got}
    assert set(got) == set(values) - {"given"} | {"nulled"}


async def test_the_manager_built_from_settings_honours_pm_max_payload_bytes(
    url: str, engine: AsyncEngine
) -> None:
    from periodic_manager.runtime.assemble import build_manager
    from periodic_manager.settings import Settings
    from periodic_manager.targets.memory import MemoryTarget

    await upgrade(url)
    big = await rawsql.insert(url, "big", payload="'\"" + "x" * 900 + "\"'")
    manager = build_manager(
        Settings(database_url=url, max_payload_bytes=512, leader_election=False, listen=False),
        engine,
        target=MemoryTarget(),
    )
    report = await manager.sync()
    assert [(e.schedule_id, e.field, e.code) for e in report.errors] == [
        (big, "payload", "too-large")
    ]
    assert manager.entries() == []
