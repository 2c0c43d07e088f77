"""Alembic environment: async engine, URL from the caller, PM_DATABASE_URL or ``-x url=``."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from alembic import context
from sqlalchemy.engine import Connection

from periodic_manager.db.engine import create_engine
from periodic_manager.db.models import Base, UTCDateTime, include_object
from periodic_manager.settings import DEFAULT_DATABASE_URL

config = context.config
target_metadata = Base.metadata


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


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_item=_render_item,
        include_object=include_object,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
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
