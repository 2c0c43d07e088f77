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
        rows = await _all(
            engine, "SELECT name, action, source FROM pm_schedule_changes ORDER BY id"
        )
        assert rows == [("r", "updated", "sql"), ("p", "deleted", "sql")]

        await downgrade(empty_db_url, "0010_partitions")
        async with engine.connect() as conn:
            tables = await conn.run_sync(lambda c: inspect(c).get_table_names())
        assert "pm_schedule_changes" not in tables
        # No trigger left behind: every kind of write still works.
        await _sql(engine, "UPDATE periodic_jobs SET spec = '@daily'")
        await _sql(
            engine, "INSERT INTO periodic_jobs (name, spec, task_type) VALUES ('n', '@daily', 't')"
        )
        await _sql(engine, "DELETE FROM periodic_jobs WHERE name = 'r'")
        assert await _all(engine, "SELECT name FROM periodic_jobs") == [("n",)]
        await upgrade(empty_db_url)  # and up again
        await _sql(engine, "UPDATE periodic_jobs SET description = 'x'")
        assert await _all(engine, "SELECT name, action FROM pm_schedule_changes") == [
            ("n", "updated")
        ]
    finally:
        await engine.dispose()


async def test_0021_plans_each_statement_for_its_own_row_count(pg_url: str) -> None:
    """The change trigger's INSERT is planned for the statement it records: after single-row
    updates (whose plan, cached by 0012's static SQL, paired a large UPDATE's rows by a nested
    loop: a 20,000-row UPDATE took a minute), a 2,000-row UPDATE's plan expects 2,000 rows and
    compiles nothing (JIT cost a second per statement). Read from the server's own plans."""
    await upgrade(pg_url)
    engine = create_engine(pg_url)
    try:
        await _sql(
            engine,
            "INSERT INTO periodic_jobs (name, spec, task_type)"
            " SELECT 'j' || g, '@daily', 't' FROM generate_series(1, 2000) g",
        )
        async with engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            plans: list[str] = []
            raw.add_log_listener(lambda _c, message: plans.append(message.message))
            for stmt in (
                "LOAD 'auto_explain'",
                "SET auto_explain.log_min_duration = 0",
                "SET auto_explain.log_nested_statements = on",
                "SET auto_explain.log_level = notice",
                "SET jit_above_cost = 0",  # would compile every plan, unless the trigger says no
            ):
                await raw.execute(stmt)
            for n in range(6):
                await raw.execute(
                    f"UPDATE periodic_jobs SET description = 'd{n}' WHERE name = 'j1'"
                )
            plans.clear()
            await raw.execute("UPDATE periodic_jobs SET spec = '@hourly'")
        [insert] = [p for p in plans if "INSERT INTO pm_schedule_changes" in p]
        scans = [line for line in insert.splitlines() if "Named Tuplestore Scan" in line]
        assert scans and all("rows=2000 " in line for line in scans), insert
        assert "JIT:" not in insert, insert
        assert await _all(
            engine, "SELECT count(*) FROM pm_schedule_changes WHERE action = 'updated'"
        ) == [(2006,)]
    finally:
        await engine.dispose()
