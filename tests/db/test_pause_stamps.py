"""Triggers of migration 0009 on both backends: a plain-SQL pause stamps ``paused_at`` and
``paused_by = 'sql'``, a resume clears the three columns, and a statement that stamps them itself
(the schedule writer) keeps its values."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.db import schedule_writer
from periodic_manager.db.engine import create_engine

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
    return row[0], at, row[2]


async def _id(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT id FROM periodic_jobs WHERE name = 'r'"))).scalar_one())


async def test_sql_pause_is_stamped_sql_and_resume_clears(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        await _sql(engine, "INSERT INTO periodic_jobs (name, spec, task_type) VALUES ('r', '@daily', 't')")
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
        await _sql(engine, "INSERT INTO periodic_jobs (name, spec, task_type) VALUES ('r', '@daily', 't')")
        schedule_id = await _id(engine)
        async with engine.connect() as conn:
            await schedule_writer.set_enabled(
                conn, schedule_id, False, was_enabled=True, now=PAST, note="maintenance", by="api"
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
