"""Migrations against the models, on PostgreSQL, SQLite and MariaDB/MySQL.

Empty database -> ``upgrade head`` -> autogenerate finds no difference from ``metadata``;
downgrade to base removes every table but Alembic's own bookkeeping; upgrading again works.
"""

from __future__ import annotations

from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from periodic_manager.db.column_types import UTCDateTime
from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import downgrade, upgrade
from periodic_manager.db.models import include_object, metadata
from tests.conftest import backend_url


@pytest.fixture
def empty_db_url(backend: str, request: pytest.FixtureRequest) -> str:
    # Overrides conftest's async version, which cannot resolve the async ``pg_url`` fixture
    # from inside a running event loop (pytest-asyncio 1.x); a sync fixture can.
    return backend_url(request, backend)


APP_TABLES = {
    "periodic_jobs",
    "pm_managers",
    "pm_entries",
    "pm_schedule_state",
    "pm_outbox",
    "pm_runs",
    "pm_backfill_slots",
    "pm_api_keys",
    "pm_schedule_changes",
    "periodic_jobs_deleted",
    "pm_last_good",
    "pm_calendars",
    "pm_partitions",
    "pm_partition_members",
    "pm_procrastinate_sent",
    "pm_http_deliveries",
}


def _render_item(type_: str, obj: Any, autogen_context: Any) -> str | bool:
    # Same rule as migrations/env.py (which cannot be imported: it runs on import).
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _diff(conn: Connection) -> list[Any]:
    ctx = MigrationContext.configure(
        conn,
        opts={
            "compare_type": True,
            "render_item": _render_item,
            "target_metadata": metadata,
            "include_object": include_object,
        },
    )
    return list(compare_metadata(ctx, metadata))


def _tables(conn: Connection) -> set[str]:
    return set(inspect(conn).get_table_names())


async def test_upgrade_matches_models_and_downgrade_removes_everything(empty_db_url: str) -> None:
    engine = create_engine(empty_db_url)
    try:
        await upgrade(empty_db_url)
        async with engine.connect() as conn:
            unmanaged = set() if engine.dialect.name == "postgresql" else {"pm_revision"}
            assert await conn.run_sync(_tables) == APP_TABLES | {"alembic_version"} | unmanaged
            assert await conn.run_sync(_diff) == []

        await downgrade(empty_db_url)
        async with engine.connect() as conn:
            # Alembic keeps its version table after a downgrade to base, but empties it.
            assert await conn.run_sync(_tables) == {"alembic_version"}
            assert (await conn.execute(text("SELECT count(*) FROM alembic_version"))).scalar() == 0

        await upgrade(empty_db_url)
        async with engine.connect() as conn:
            unmanaged = set() if engine.dialect.name == "postgresql" else {"pm_revision"}
            assert await conn.run_sync(_tables) == APP_TABLES | {"alembic_version"} | unmanaged
            assert await conn.run_sync(_diff) == []
    finally:
        await engine.dispose()


async def test_upgrade_is_idempotent(empty_db_url: str) -> None:
    await upgrade(empty_db_url)
    engine = create_engine(empty_db_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO periodic_jobs (name, spec, task_type) VALUES ('a', '@daily', 't')"
                )
            )
        await upgrade(empty_db_url)  # already at head: nothing to do, nothing lost
        async with engine.connect() as conn:
            version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).all()
            jobs = (await conn.execute(text("SELECT name FROM periodic_jobs"))).scalars().all()
        assert len(version) == 1
        assert jobs == ["a"]
    finally:
        await engine.dispose()


def test_head_constant_is_the_head_of_the_shipped_migrations() -> None:
    # Start-up compares the database with HEAD_REVISION without importing Alembic: a migration
    # added without moving the constant would let a manager run on a schema one step behind.
    from periodic_manager.db.migrate import HEAD_REVISION, shipped_head

    assert shipped_head() == HEAD_REVISION


def _schema(conn: Connection) -> dict[str, Any]:
    """What a migrated database holds, as comparable data: per table its columns, indexes,
    foreign keys and rows (the migrations' own: the revision, counters), and the triggers."""
    insp = inspect(conn)
    out: dict[str, Any] = {}
    for table in sorted(insp.get_table_names()):
        out[table] = (
            [
                (c["name"], str(c["type"]), c["nullable"], str(c.get("default")))
                for c in insp.get_columns(table)
            ],
            sorted(str(sorted(i.items())) for i in insp.get_indexes(table)),
            sorted(str(sorted(fk.items())) for fk in insp.get_foreign_keys(table)),
            sorted(map(str, conn.execute(text(f"SELECT * FROM {table}")).all())),
        )
    dialect = conn.dialect.name
    if dialect == "postgresql":
        query = "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal"
    elif dialect == "sqlite":
        query = "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"
    else:
        query = (
            "SELECT trigger_name, CONCAT_WS(' ', action_timing, event_manipulation,"
            " event_object_table, action_order, sql_mode, action_statement)"
            " FROM information_schema.triggers WHERE trigger_schema = DATABASE()"
        )
    out["triggers"] = sorted(map(tuple, conn.execute(text(query)).all()))
    return out


async def test_the_migrated_databases_the_tests_get_are_what_the_migrations_make(
    db_url: str, empty_db_url: str
) -> None:
    # db_url is a copy of a template migrated once per process (tests/conftest.py): on MariaDB
    # made again from the template's DDL, rows and triggers; it must equal a fresh migration.
    await upgrade(empty_db_url)
    schemas = []
    for url in (db_url, empty_db_url):
        engine = create_engine(url)
        try:
            async with engine.connect() as conn:
                schemas.append(await conn.run_sync(_schema))
        finally:
            await engine.dispose()
    copied, migrated = schemas
    assert copied["triggers"] and set(copied) >= APP_TABLES
    assert copied == migrated
