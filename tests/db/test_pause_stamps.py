"""Triggers of migration 0009 on both backends: a plain-SQL pause stamps ``paused_at`` and
``paused_by = 'sql'``, a resume clears the three columns, and a statement that stamps them itself
(the schedule writer) keeps its values."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.db import schedule_writer
from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import downgrade, upgrade
from periodic_manager.schedules.import_export import export_entries
from tests.conftest import backend_url

PAST = datetime(2020, 1, 1, tzinfo=UTC)


async def _sql(engine: AsyncEngine, stmt: str, **params: Any) -> None:
    async with engine.begin() as conn:
        await conn.execute(text(stmt), params)


async def _paused(engine: AsyncEngine) -> tuple[Any, Any, Any]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT paused_note, paused_at, paused_by FROM periodic_jobs WHERE name = 'r'")
            )
        ).one()
    at = row[1]
    if isinstance(at, str):  # SQLite hands back text through raw SQL
        at = datetime.fromisoformat(at).replace(tzinfo=UTC)
    elif isinstance(at, datetime) and at.tzinfo is None:  # MariaDB/MySQL: DATETIME, in UTC
        at = at.replace(tzinfo=UTC)
    return row[0], at, row[2]


async def _id(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(
            (await conn.execute(text("SELECT id FROM periodic_jobs WHERE name = 'r'"))).scalar_one()
        )


async def test_sql_pause_is_stamped_sql_and_resume_clears(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        await _sql(
            engine, "INSERT INTO periodic_jobs (name, spec, task_type) VALUES ('r', '@daily', 't')"
        )
        assert await _paused(engine) == (None, None, None)
        await _sql(engine, "UPDATE periodic_jobs SET enabled = false")
        note, at, by = await _paused(engine)
        assert note is None and by == "sql" and at.astimezone(UTC) > PAST
        # Pausing a paused row again changes nothing; other edits leave the stamps alone.
        await _sql(engine, "UPDATE periodic_jobs SET enabled = false, description = 'x'")
        assert await _paused(engine) == (note, at, by)
        await _sql(engine, "UPDATE periodic_jobs SET enabled = true")
        assert await _paused(engine) == (None, None, None)
        # A note given by the same statement is kept.
        await _sql(engine, "UPDATE periodic_jobs SET enabled = false, paused_note = 'why'")
        note, _, by = await _paused(engine)
        assert (note, by) == ("why", "sql")
        await _sql(engine, "UPDATE periodic_jobs SET enabled = true")
        assert await _paused(engine) == (None, None, None)
    finally:
        await engine.dispose()


async def test_the_writers_own_stamps_are_kept(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        await _sql(
            engine, "INSERT INTO periodic_jobs (name, spec, task_type) VALUES ('r', '@daily', 't')"
        )
        schedule_id = await _id(engine)
        async with engine.connect() as conn:
            await schedule_writer.set_enabled(
                conn, schedule_id, False, was_enabled=True, now=PAST, note="maintenance"
            )
        assert await _paused(engine) == ("maintenance", PAST, "api")
        async with engine.connect() as conn:
            await schedule_writer.set_enabled(conn, schedule_id, True, was_enabled=False, now=PAST)
        assert await _paused(engine) == (None, None, None)
        # Stamps given by plain SQL are kept too.
        await _sql(
            engine,
            "UPDATE periodic_jobs SET enabled = false, paused_at = :p, paused_by = 'ops'",
            p=PAST,
        )
        assert await _paused(engine) == (None, PAST, "ops")
    finally:
        await engine.dispose()


@pytest.fixture
def empty_db_url(backend: str, request: pytest.FixtureRequest) -> str:
    # As tests/db/test_migrations.py: a sync fixture can resolve the async database fixtures.
    return backend_url(request, backend)


async def test_0009_upgrade_keeps_rows_and_downgrade_removes_columns_and_triggers(
    empty_db_url: str,
) -> None:
    await upgrade(empty_db_url, "0008_procrastinate_sent")
    engine = create_engine(empty_db_url)
    try:
        await _sql(
            engine,
            "INSERT INTO periodic_jobs (name, spec, task_type, enabled) VALUES"
            " ('r', '@daily', 't', true), ('p', '@daily', 't', false)",
        )
        await upgrade(empty_db_url)
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    text(
                        "SELECT name, paused_note, paused_at, paused_by FROM periodic_jobs ORDER BY name"
                    )
                )
            ).all()
        assert [tuple(r) for r in rows] == [("p", None, None, None), ("r", None, None, None)]
        await _sql(engine, "UPDATE periodic_jobs SET enabled = false WHERE name = 'r'")
        assert (await _paused(engine))[2] == "sql"

        await downgrade(empty_db_url, "0008_procrastinate_sent")
        async with engine.connect() as conn:
            columns = {
                c["name"]
                for c in await conn.run_sync(lambda c: inspect(c).get_columns("periodic_jobs"))
            }
        assert not {"paused_note", "paused_at", "paused_by"} & columns
        await _sql(engine, "UPDATE periodic_jobs SET enabled = true")  # no trigger left behind
        async with engine.connect() as conn:
            count = (await conn.execute(text("SELECT count(*) FROM periodic_jobs"))).scalar()
        assert count == 2
    finally:
        await engine.dispose()


async def test_export_ignores_unreadable_pause_columns_and_an_import_pause_is_by_import(
    db_url: str,
) -> None:
    engine = create_engine(db_url)
    try:
        await _sql(
            engine, "INSERT INTO periodic_jobs (name, spec, task_type) VALUES ('r', '@daily', 't')"
        )
        schedule_id = await _id(engine)
        await schedule_writer.write_import(
            engine,
            [schedule_writer.RowWrite({"enabled": False}, row_id=schedule_id, was_enabled=True)],
            [],
            PAST,
        )
        assert await _paused(engine) == (None, PAST, "import")
        # What each database holds that is no instant: text, infinity, a zero date.
        hostile = {"sqlite": "'yesterday'", "postgresql": "'infinity'"}.get(
            engine.dialect.name, "'0000-00-00 00:00:00'"
        )
        await _sql(engine, f"UPDATE periodic_jobs SET paused_at = {hostile}")
        export = await export_entries(engine)
        assert export.invalid == []
        assert export.entries == [
            {"name": "r", "spec": "@daily", "task_type": "t", "enabled": False}
        ]
    finally:
        await engine.dispose()


async def test_a_row_created_paused_is_stamped(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        await _sql(
            engine,
            "INSERT INTO periodic_jobs (name, spec, task_type, enabled) VALUES ('r', '@daily', 't', false)",
        )
        note, at, by = await _paused(engine)
        assert note is None and by == "sql" and at.astimezone(UTC) > PAST
        await _sql(engine, "DELETE FROM periodic_jobs")
        await _sql(
            engine,
            "INSERT INTO periodic_jobs (name, spec, task_type, enabled, paused_at, paused_by, paused_note)"
            " VALUES ('r', '@daily', 't', false, :p, 'ops', 'n')",
            p=PAST,
        )
        assert await _paused(engine) == ("n", PAST, "ops")
        async with engine.connect() as conn:
            await schedule_writer.create(
                conn, {"name": "api", "spec": "@daily", "task_type": "t", "enabled": False}, PAST
            )
            row = (
                await conn.execute(text("SELECT paused_by FROM periodic_jobs WHERE name = 'api'"))
            ).one()
        assert row[0] == "api"
    finally:
        await engine.dispose()
