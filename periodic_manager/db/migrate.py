"""Run Alembic migrations from code (the CLI's ``migrate``; ``run`` on SQLite)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations


def alembic_config(url: str) -> Config:
    """An Alembic config that finds the migrations shipped with the package."""
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.attributes["url"] = url
    return cfg


def upgrade_sync(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade_sync(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


async def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the database at ``url`` (Alembic's env runs its own loop, so use a thread)."""
    await asyncio.to_thread(upgrade_sync, url, revision)


async def downgrade(url: str, revision: str = "base") -> None:
    await asyncio.to_thread(downgrade_sync, url, revision)
