"""What differs between the databases, for the migrations: the one home of their dialect branches.

Each migration asks here which database it runs on (:func:`name`: ``postgresql``, ``sqlite`` or
``mysql``, which covers MariaDB too) and runs the statements of that database (:func:`run`); a
migration that adds a trigger adds its MariaDB/MySQL text beside the other two and passes all
three here. Column types that differ (:data:`INSTANT`, :data:`JSON_VALUE`, :data:`LONG_TEXT`)
and the table options of MariaDB/MySQL (:data:`TABLE`) are here too.

MariaDB/MySQL in short (docs/operations.md, "MariaDB and MySQL"):

* instants are ``DATETIME(6)`` holding UTC (the engine's sessions run in UTC; triggers use
  ``UTC_TIMESTAMP(6)``, whatever the session's time zone);
* the JSON columns of ``periodic_jobs`` are ``LONGTEXT`` without a JSON check, so a row holding
  invalid JSON text is stored and then reported by the row judge, as on SQLite;
* tables are InnoDB, ``utf8mb4`` with the binary collation (names compare as PostgreSQL's do:
  ``Backup`` and ``backup`` are two schedules);
* triggers are row triggers that set ``NEW`` columns (a trigger may not write its own table),
  and the change counter is the one row of ``pm_revision``, whose row lock, taken by the first
  write of a transaction to ``periodic_jobs``, serializes writers until commit (revisions become
  visible in commit order).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy import PrimaryKeyConstraint
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import DDLCompiler

from periodic_manager.db.dialects import backend_name

# An instant: TIMESTAMP WITH TIME ZONE, SQLite's text, DATETIME(6) in UTC.
INSTANT = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
# A schedule's JSON column: jsonb; SQLite's JSON text; LONGTEXT (any text, judged when read).
JSON_VALUE = (
    sa.JSON()
    .with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
    .with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
)
# Text that may be longer than MySQL's TEXT (64 KiB): a payload, a change's JSON.
LONG_TEXT = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
# Options of every table created (ignored by the other databases).
TABLE = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}

# An instant "now" in a trigger, as each database stores it.
SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'"
MYSQL_NOW = "UTC_TIMESTAMP(6)"


@compiles(PrimaryKeyConstraint, "mysql")
@compiles(PrimaryKeyConstraint, "mariadb")
def _primary_key(element: PrimaryKeyConstraint, compiler: DDLCompiler, **kw: Any) -> str:
    """A primary key of MariaDB/MySQL is always named PRIMARY: its name is left out (given, the
    server ignores it with a warning, one per table, that the driver logs)."""
    if not element.columns:
        return ""
    return (
        "PRIMARY KEY (" + ", ".join(compiler.preparer.quote(c.name) for c in element.columns) + ")"
    )


def name() -> str:
    """The database the migration runs on: ``postgresql``, ``sqlite`` or ``mysql`` (MariaDB too),
    as the package's registry names it (:mod:`periodic_manager.db.dialects`)."""
    return backend_name(op.get_bind().dialect.name)


def instant_sql() -> str:
    """The SQL type of an instant column, for a plain ``ALTER TABLE ... ADD COLUMN``."""
    return {"sqlite": "DATETIME", "mysql": "DATETIME(6)"}.get(name(), "TIMESTAMP WITH TIME ZONE")


def run(*, postgresql: Sequence[str], sqlite: Sequence[str], mysql: Sequence[str]) -> None:
    """Execute the statements of the database the migration runs on."""
    for stmt in {"postgresql": postgresql, "sqlite": sqlite, "mysql": mysql}[name()]:
        op.execute(stmt)


def mysql_distinct(cols: Sequence[str]) -> str:
    """MariaDB/MySQL: "some of ``cols`` differ between OLD and NEW" (NULL-safe)."""
    return "(" + " OR ".join(f"NOT (NEW.{c} <=> OLD.{c})" for c in cols) + ")"
