"""Migration 0012 on both backends: upgrading keeps the rows (their history starts then), plain
SQL is recorded from then on, and a downgrade to 0009 drops the table and leaves no trigger
behind."""

from __future__ import annotations

from typing import Any

from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import downgrade, upgrade


async def _sql(engine: AsyncEngine, stmt: str) -> None:
    async with engine.begin() as conn:
        await conn.execute(text(stmt))


async def _all(engine: AsyncEngine, stmt: str) -> list[tuple[Any, ...]]:
    async with engine.connect() as conn:
        return [tuple(r) for r in (await conn.execute(text(stmt))).all()]


async def test_0012_upgrade_keeps_rows_records_sql_and_downgrade_removes_everything(
    empty_db_url: str,
) -> None:
    await upgrade(empty_db_url, "0010_partitions")
    engine = create_engine(empty_db_url)
    try:
        await _sql(
            engine,
            "INSERT INTO periodic_jobs (name, spec, task_type, enabled) VALUES"
            " ('r', '@daily', 't', true), ('p', '@daily', 't', false)",
        )
        await upgrade(empty_db_url)
        assert await _all(engine, "SELECT count(*) FROM periodic_jobs") == [(2,)]
        assert await _all(engine, "SELECT count(*) FROM pm_schedule_changes") == [(0,)]
        await _sql(engine, "UPDATE periodic_jobs SET spec = '@hourly' WHERE name = 'r'")
        await _sql(engine, "DELETE FROM periodic_jobs WHERE name = 'p'")
        rows = await _all(engine, "SELECT name, action, source FROM pm_schedule_changes ORDER BY id")
        assert rows == [("r", "updated", "sql"), ("p", "deleted", "sql")]

        await downgrade(empty_db_url, "0010_partitions")
        async with engine.connect() as conn:
            tables = await conn.run_sync(lambda c: inspect(c).get_table_names())
        assert "pm_schedule_changes" not in tables
        # No trigger left behind: every kind of write still works.
        await _sql(engine, "UPDATE periodic_jobs SET spec = '@daily'")
        await _sql(engine, "INSERT INTO periodic_jobs (name, spec, task_type) VALUES ('n', '@daily', 't')")
        await _sql(engine, "DELETE FROM periodic_jobs WHERE name = 'r'")
        assert await _all(engine, "SELECT name FROM periodic_jobs") == [("n",)]
        await upgrade(empty_db_url)  # and up again
        await _sql(engine, "UPDATE periodic_jobs SET description = 'x'")
        assert await _all(engine, "SELECT name, action FROM pm_schedule_changes") == [("n", "updated")]
    finally:
        await engine.dispose()
