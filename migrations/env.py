"""Alembic environment: async engine, URL from the caller, PM_DATABASE_URL or ``-x url=``."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection

from periodic_manager.db.column_types import UTCDateTime
from periodic_manager.db.engine import create_engine
from periodic_manager.db.models import include_object, metadata
from periodic_manager.migrations import dialect  # noqa: F401 - its DDL rule for MariaDB/MySQL
from periodic_manager.settings import DEFAULT_DATABASE_URL

config = context.config
target_metadata = metadata


def _url() -> str:
    return (
        config.attributes.get("url")
        or context.get_x_argument(as_dictionary=True).get("url")
        or os.environ.get("PM_DATABASE_URL")
        or DEFAULT_DATABASE_URL
    )


def _render_item(type_: str, obj: Any, autogen_context: Any) -> str | bool:
    # Migrations are plain SQLAlchemy: render our instant type as what it is in the database.
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _record_applied(ctx: Any, step: Any, heads: Any, run_args: Any) -> None:
    # Tells the caller (periodic_manager.db.migrate.upgrade_sync) what this run really applied.
    applied = config.attributes.get("applied")
    if applied is None or not step.is_upgrade:
        return
    from periodic_manager.db.migrate import AppliedMigration

    for script in step.up_revisions:
        title = (script.doc or "").strip().splitlines()[0] if script.doc else ""
        applied.append(AppliedMigration(script.revision, title.rstrip(".")))


def _configure(connection: Connection) -> None:
    from periodic_manager.db.migrate import MIGRATION_LOCK_KEY

    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_item=_render_item,
        include_object=include_object,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
        on_version_apply=_record_applied,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Serialise concurrent upgrades (two `migrate` at once, several pods starting): the
            # lock is taken before Alembic reads the current revision and released at commit,
            # so the second upgrade sees the first one's result and applies nothing.
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
            )
        elif connection.dialect.name in ("mysql", "mariadb"):
            # The same with a named lock of the session (freed when the connection closes).
            connection.execute(
                text("SELECT GET_LOCK(:key, 600)"), {"key": f"pm-migrate-{MIGRATION_LOCK_KEY}"}
            )
        context.run_migrations()


async def _run_async() -> None:
    engine = create_engine(_url())
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_configure)
            await conn.commit()
    finally:
        await engine.dispose()


def run_migrations_offline() -> None:
    context.configure(
        url=_url(), target_metadata=target_metadata, literal_binds=True, render_item=_render_item
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
    else:
        asyncio.run(_run_async())
