"""Triggers of migration 0004 on both backends, for rows written with plain SQL:
``effective_at`` moves with the schedule's timing and identity (and on resume), never with its
payload; ``updated_at`` follows every visible change and no non-change."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.db.engine import create_engine

PAST = datetime(2020, 1, 1, tzinfo=UTC)


async def _stamps(engine: AsyncEngine) -> tuple[Any, Any]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT effective_at, updated_at FROM periodic_jobs WHERE name = 'r'")
            )
        ).one()
    return row[0], row[1]


async def _sql(engine: AsyncEngine, stmt: str, **params: Any) -> None:
    async with engine.begin() as conn:
        await conn.execute(text(stmt), params)


async def _reset(engine: AsyncEngine) -> None:
    """Put both stamps far in the past, so any trigger-made stamp is visibly newer."""
    await _sql(engine, "UPDATE periodic_jobs SET effective_at = :p, updated_at = :p", p=PAST)


def _newer(value: Any) -> bool:
    if isinstance(value, str):  # SQLite hands back text through raw SQL
        value = datetime.fromisoformat(value).replace(tzinfo=UTC)
    return value.astimezone(UTC) > PAST


async def test_sql_insert_stamps_effective_at_and_a_given_value_is_kept(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        await _sql(
            engine, "INSERT INTO periodic_jobs (name, spec, task_type) VALUES ('r', '@daily', 't')"
        )
        effective, _ = await _stamps(engine)
        assert effective is not None and _newer(effective)
        await _sql(
            engine,
            "INSERT INTO periodic_jobs (name, spec, task_type, effective_at) VALUES ('g', '@daily', 't', :p)",
            p=PAST,
        )
        async with engine.connect() as conn:
            given = (
                await conn.execute(text("SELECT effective_at FROM periodic_jobs WHERE name = 'g'"))
            ).scalar()
        assert not _newer(given)
    finally:
        await engine.dispose()


async def test_timing_edits_and_resume_move_effective_at_but_payload_edits_do_not(
    db_url: str,
) -> None:
    engine = create_engine(db_url)
    base = "UPDATE periodic_jobs SET name = 'r', spec = '@daily', timezone = 'UTC', anchor = NULL"
    try:
        await _sql(
            engine, "INSERT INTO periodic_jobs (name, spec, task_type) VALUES ('r', '@daily', 't')"
        )
        await _reset(engine)
        await _sql(engine, "UPDATE periodic_jobs SET payload = '{\"n\": 1}', task_type = 'u'")
        effective, updated = await _stamps(engine)
        assert not _newer(effective) and _newer(updated)  # visible change, same timing

        for edit in (
            "spec = '@hourly'",
            "timezone = 'Europe/Berlin'",
            "anchor = '2024-01-01 00:00:00'",  # (MariaDB takes no offset in a literal)
            "name = 'r2'",
        ):
            await _sql(engine, base)
            await _reset(engine)
            await _sql(engine, f"UPDATE periodic_jobs SET {edit}")
            async with engine.connect() as conn:
                effective, updated = (
                    await conn.execute(text("SELECT effective_at, updated_at FROM periodic_jobs"))
                ).one()
            assert _newer(effective) and _newer(updated), edit

        await _sql(engine, base)
        await _sql(engine, "UPDATE periodic_jobs SET enabled = false")
        await _reset(engine)
        await _sql(engine, "UPDATE periodic_jobs SET enabled = true")
        effective, _ = await _stamps(engine)
        assert _newer(effective)  # resumed: nothing from the pause may be sent
        await _reset(engine)
        await _sql(engine, "UPDATE periodic_jobs SET enabled = false")
        effective, updated = await _stamps(engine)
        assert not _newer(effective) and _newer(updated)  # pausing starts nothing
    finally:
        await engine.dispose()


async def test_an_update_that_changes_nothing_or_sets_the_stamps_itself_keeps_them(
    db_url: str,
) -> None:
    engine = create_engine(db_url)
    try:
        await _sql(
            engine, "INSERT INTO periodic_jobs (name, spec, task_type) VALUES ('r', '@daily', 't')"
        )
        await _reset(engine)
        await _sql(engine, "UPDATE periodic_jobs SET spec = spec, enabled = enabled")
        effective, updated = await _stamps(engine)
        assert not _newer(effective) and not _newer(updated)
        # The API sets both with its own clock: the triggers keep what the statement wrote.
        mine = datetime(2021, 6, 1, tzinfo=UTC)
        await _sql(
            engine,
            "UPDATE periodic_jobs SET spec = '@hourly', effective_at = :m, updated_at = :m",
            m=mine,
        )
        effective, updated = await _stamps(engine)
        for value in (effective, updated):
            if isinstance(value, str):
                value = datetime.fromisoformat(value).replace(tzinfo=UTC)
            assert value.astimezone(UTC) == mine
    finally:
        await engine.dispose()
