"""Exclusion calendars: ``pm_calendars``, and triggers that make a calendar write a schedule write.

A schedule's ``options.exclude`` names calendars; what it sends depends on their content, which the
manager folds into the schedule's content hash. So that managers see a calendar write (API, import
or plain SQL) like a schedule edit, a trigger on ``pm_calendars`` gives every ``periodic_jobs`` row
whose options name the calendar a new revision (a no-op ``UPDATE ... SET revision = revision``,
which the triggers of 0003 renumber; on PostgreSQL it also NOTIFYs). The match is on the text of
``options`` (``"exclude"`` and the quoted name): a row matched by mistake is only read again.

Revision ID: 0016_calendars
Revises: 0015_pause_on_failure
Create Date: 2026-12-08 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from periodic_manager.migrations import dialect

revision: str = "0016_calendars"
down_revision: str | None = "0015_pause_on_failure"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _touch_pg(name: str) -> str:
    return (
        "UPDATE periodic_jobs SET revision = revision WHERE strpos(options::text, '\"exclude\"') > 0"
        f" AND strpos(options::text, '\"' || {name} || '\"') > 0;"
    )


PG_UP = [
    f"""CREATE FUNCTION pm_calendars_touch() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'TRUNCATE' THEN
        UPDATE periodic_jobs SET revision = revision WHERE strpos(options::text, '"exclude"') > 0;
        RETURN NULL;
      END IF;
      IF TG_OP <> 'INSERT' THEN {_touch_pg("OLD.name")} END IF;
      IF TG_OP <> 'DELETE' AND (TG_OP = 'INSERT' OR NEW.name IS DISTINCT FROM OLD.name) THEN
        {_touch_pg("NEW.name")}
      END IF;
      RETURN NULL;
    END $$""",
    """CREATE TRIGGER pm_calendars_touch AFTER INSERT OR UPDATE OR DELETE ON pm_calendars
    FOR EACH ROW EXECUTE FUNCTION pm_calendars_touch()""",
    """CREATE TRIGGER pm_calendars_truncate AFTER TRUNCATE ON pm_calendars
    FOR EACH STATEMENT EXECUTE FUNCTION pm_calendars_touch()""",
]
PG_DOWN = [
    "DROP TRIGGER IF EXISTS pm_calendars_truncate ON pm_calendars",
    "DROP TRIGGER IF EXISTS pm_calendars_touch ON pm_calendars",
    "DROP FUNCTION IF EXISTS pm_calendars_touch()",
]


def _touch_sqlite(name: str) -> str:
    text = "CAST(options AS TEXT)"
    return (
        f"UPDATE periodic_jobs SET revision = revision WHERE instr({text}, '\"exclude\"') > 0"
        f" AND instr({text}, '\"' || {name} || '\"') > 0;"
    )


SQLITE_UP = [
    f"""CREATE TRIGGER pm_calendars_insert AFTER INSERT ON pm_calendars BEGIN
      {_touch_sqlite("NEW.name")}
    END""",
    f"""CREATE TRIGGER pm_calendars_update AFTER UPDATE ON pm_calendars BEGIN
      {_touch_sqlite("OLD.name")}
      {_touch_sqlite("NEW.name")}
    END""",
    f"""CREATE TRIGGER pm_calendars_delete AFTER DELETE ON pm_calendars BEGIN
      {_touch_sqlite("OLD.name")}
    END""",
]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS pm_calendars_delete",
    "DROP TRIGGER IF EXISTS pm_calendars_update",
    "DROP TRIGGER IF EXISTS pm_calendars_insert",
]


def _touch_mysql(name: str) -> str:
    return (
        "UPDATE periodic_jobs SET revision = revision WHERE LOCATE('\"exclude\"', options) > 0"
        f" AND LOCATE(CONCAT('\"', {name}, '\"'), options) > 0;"
    )


# MariaDB/MySQL: row triggers as on SQLite (a TRUNCATE fires none there: the next full sync
# reads every row again); periodic_jobs' own triggers (0003) renumber the rows touched.
MYSQL_UP = [
    f"""CREATE TRIGGER pm_calendars_insert AFTER INSERT ON pm_calendars FOR EACH ROW BEGIN
      {_touch_mysql("NEW.name")}
    END""",
    f"""CREATE TRIGGER pm_calendars_update AFTER UPDATE ON pm_calendars FOR EACH ROW BEGIN
      {_touch_mysql("OLD.name")}
      {_touch_mysql("NEW.name")}
    END""",
    f"""CREATE TRIGGER pm_calendars_delete AFTER DELETE ON pm_calendars FOR EACH ROW BEGIN
      {_touch_mysql("OLD.name")}
    END""",
]
MYSQL_DOWN = SQLITE_DOWN


def upgrade() -> None:
    op.create_table(
        "pm_calendars",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("spec", dialect.LONG_TEXT, nullable=False),
        sa.Column("updated_at", dialect.INSTANT, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pm_calendars")),
        **dialect.TABLE,
    )
    dialect.run(postgresql=PG_UP, sqlite=SQLITE_UP, mysql=MYSQL_UP)


def downgrade() -> None:
    dialect.run(postgresql=PG_DOWN, sqlite=SQLITE_DOWN, mysql=MYSQL_DOWN)
    op.drop_table("pm_calendars")
