"""Run Alembic migrations from code (the CLI's ``migrate``; ``run`` on SQLite), and tell where a
database's schema stands against the migrations this version ships.

On PostgreSQL an upgrade holds a transaction-level advisory lock (:data:`MIGRATION_LOCK_KEY`, taken
in ``migrations/env.py``) from before it reads the current revision until it commits, so two
``migrate`` started at once run one after the other: the second finds the schema at head and
applies nothing.

Start-up only compares the database's revision with :data:`HEAD_REVISION`, written here, so a
process that does not migrate never imports Alembic (~0.1 s and ~10 MB); a test proves that the
constant is the head of the shipped migrations.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import inspect as sa_inspect
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

import periodic_manager.migrations as migrations

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

# The revision the shipped migrations end at. A new migration changes it in the same commit
# (tests/db/test_migrations.py fails until it equals Alembic's head).
HEAD_REVISION = "0029_api_keys"
# Any fixed 64-bit value works; this one spells "pm-migr" so it is recognisable in pg_locks.
MIGRATION_LOCK_KEY = 0x706D2D6D696772
VERSION_TABLE = "alembic_version"


@dataclass(frozen=True)
class AppliedMigration:
    """One migration an upgrade ran."""

    revision: str
    title: str  # first line of the migration's docstring

    def __str__(self) -> str:
        return f"{self.revision} ({self.title})" if self.title else self.revision


def alembic_config(url: str) -> Config:
    """An Alembic config that finds the migrations shipped with the package."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.attributes["url"] = url
    return cfg


@cache
def _scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://"))


def head_revision() -> str:
    """The revision the shipped migrations end at (:data:`HEAD_REVISION`)."""
    return HEAD_REVISION


def shipped_head() -> str | None:
    """The head as Alembic reads it from the migration files (what :data:`HEAD_REVISION` must be)."""
    return _scripts().get_current_head()


def known_revisions() -> frozenset[str]:
    return frozenset(script.revision for script in _scripts().walk_revisions())


def pending(current: str | None) -> list[str]:
    """The revisions an upgrade from ``current`` (None: empty database) would apply, in order."""
    scripts = _scripts()
    steps = scripts.iterate_revisions(head_revision(), current)  # newest first
    return [script.revision for script in reversed(list(steps))]


def upgrade_sync(url: str, revision: str = "head") -> list[AppliedMigration]:
    """Upgrade the database at ``url``; returns the migrations this call ran (none: at head)."""
    cfg = alembic_config(url)
    applied: list[AppliedMigration] = []
    cfg.attributes["applied"] = applied  # filled by migrations/env.py as each step runs
    from alembic import command

    command.upgrade(cfg, revision)
    return applied


def downgrade_sync(url: str, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)


async def upgrade(url: str, revision: str = "head") -> list[AppliedMigration]:
    """Upgrade the database at ``url`` (Alembic's env runs its own loop, so use a thread)."""
    return await asyncio.to_thread(upgrade_sync, url, revision)


async def downgrade(url: str, revision: str = "base") -> None:
    await asyncio.to_thread(downgrade_sync, url, revision)


async def database_revision(conn: AsyncConnection) -> str | None:
    """The revision recorded in the database, or None when it was never migrated."""
    has_table = await conn.run_sync(lambda c: sa_inspect(c).has_table(VERSION_TABLE))
    if not has_table:
        return None
    rows = (await conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))).scalars().all()
    if len(rows) > 1:
        return ",".join(sorted(rows))  # branches: never at our (single) head
    return rows[0] if rows else None


def schema_problem(current: str | None) -> str | None:
    """None when ``current`` is the head this version ships; otherwise why it is not, in words
    an operator can act on (only a database not at head reads the migrations)."""
    head = head_revision()
    if current == head:
        return None
    if current is None:
        return "the database was never migrated: run `periodic-manager migrate`"
    if current not in known_revisions():
        return (
            f"the schema is at revision {current}, which this version does not know (head "
            f"{head}); it was migrated by a newer periodic-manager"
        )
    missing = ", ".join(pending(current))
    return f"the schema is at {current}, behind head {head} ({missing}): run `periodic-manager migrate`"
