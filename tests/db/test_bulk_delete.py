"""Deleting many schedule rows at once (``import --prune``): every IN (...) list stays under the
driver's bind-parameter limit (asyncpg: 32767), however many rows go."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import text

from periodic_manager.cli.main import main
from periodic_manager.db import schedule_writer
from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import upgrade

ROWS = 40_000  # over asyncpg's 32767 bind parameters


async def _fill(url: str) -> None:
    """``ROWS`` schedules, each with state, a run and a last good version (plain SQL, fast)."""
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO periodic_jobs (name, spec, task_type) "
                    "SELECT 'bulk.' || g, '@every 1h', 't' FROM generate_series(1, :n) g"
                ),
                {"n": ROWS},
            )
            await conn.execute(
                text(
                    "INSERT INTO pm_schedule_state (schedule_key, name, updated_at) "
                    "SELECT id::text, name, now() FROM periodic_jobs"
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO pm_runs (schedule_key, name, slot_at, status, at, lateness_ms) "
                    "SELECT id::text, name, now(), 'enqueued', now(), 0 FROM periodic_jobs"
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO pm_last_good (schedule_key, name, spec, timezone, task_type,"
                    " payload, options, content_hash, since) SELECT id::text, name, spec, 'UTC',"
                    " task_type, 'null', '{}', 'h', now() FROM periodic_jobs"
                )
            )
    finally:
        await engine.dispose()


async def _counts(url: str) -> list[int]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return [
                int((await conn.execute(text(f"SELECT count(*) FROM {t}"))).scalar_one())
                for t in ("periodic_jobs", "pm_schedule_state", "pm_runs", "pm_last_good")
            ]
    finally:
        await engine.dispose()


async def test_delete_rows_over_the_bind_parameter_limit(pg_url: str) -> None:
    await upgrade(pg_url)
    await _fill(pg_url)
    engine = create_engine(pg_url)
    try:
        async with engine.begin() as conn:
            ids = list((await conn.execute(text("SELECT id FROM periodic_jobs"))).scalars())
            await schedule_writer.delete_rows(conn, ids[:-1])
    finally:
        await engine.dispose()
    assert await _counts(pg_url) == [1, 1, 1, 1]


def test_import_prune_of_more_rows_than_bind_parameters(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(upgrade(pg_url))
    asyncio.run(_fill(pg_url))
    f = tmp_path / "one.yaml"
    f.write_text('schedules:\n  - {name: kept, spec: "@every 1h", task_type: t}\n')
    code = main(["import", str(f), "--database-url", pg_url, "--prune"])
    out, err = capsys.readouterr()
    assert code == 0, (out, err)
    assert asyncio.run(_counts(pg_url)) == [1, 0, 0, 0]
