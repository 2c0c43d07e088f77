"""The change history of ``periodic_jobs``: ``pm_schedule_changes``, written by triggers.

One row per change of a schedule: ``created`` (INSERT), ``updated``, ``paused`` or ``resumed``
(an UPDATE of a tracked column; ``enabled`` turning false or true names it), ``deleted``
(DELETE), with its time, its source, its actor where known and every tracked column that changed
(``changes``: JSON text ``{column: {"before": text|null, "after": text|null}}``, each value the
column's stored text, cut to 2000 characters with ``"truncated": true`` on the column then; a
SQLite blob is written ``x'<hex>'``). An UPDATE that changes no tracked column (the revision, the
stamps ``updated_at``, ``effective_at``, ``paused_at``, ``paused_by``) writes nothing.

Triggers on every database, so plain SQL is recorded too (source ``sql``):

* PostgreSQL: AFTER statement triggers reading the statement's transition tables (one
  INSERT .. SELECT per statement; an UPDATE's rows are paired by id, so an UPDATE that changes
  a row's id records nothing for it). The schedule writer marks its own statements with
  transaction-local settings (``set_config(..., true)``, as ``SET LOCAL``):
  ``periodic_manager.source`` (``api``, ``import``, ``manager``; anything else or unset is
  ``sql``), ``periodic_manager.actor`` and ``periodic_manager.at`` (its clock, epoch microseconds,
  digits only; otherwise ``statement_timestamp()``). A ``sql`` change's actor is the session's
  database role (``session_user``).
* SQLite: AFTER triggers record every change as ``sql`` at the statement's time; the schedule
  writer, which holds the database's write lock for its transaction, then sets source, actor and
  time on the rows its statements added. The follow-up UPDATE of 0009's triggers (stamping a
  plain SQL pause or resume) is not a change of its own.

* MariaDB/MySQL: AFTER row triggers building the changed columns in a JSON object; the schedule
  writer marks its transaction with session variables it clears after: ``@pm_source`` (``api``,
  ``import``, ``manager``; anything else or unset is ``sql``, whose actor is ``CURRENT_USER()``),
  ``@pm_actor`` and ``@pm_at`` (epoch microseconds, digits only; otherwise the statement's time).
  Values are their text as ``CAST(.. AS CHAR)`` gives it (an instant ``2026-12-06 09:00:00.000000``
  in UTC, a boolean ``1`` or ``0``).

A TRUNCATE records nothing (no row triggers fire). History outlives the row: a deleted
schedule's changes stay until the manager prunes them (``PM_CHANGES_RETENTION``,
``PM_CHANGES_MAX_PER_SCHEDULE``).

Revision ID: 0012_change_history
Revises: 0010_partitions
Create Date: 2026-12-06 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from periodic_manager.migrations import dialect

revision: str = "0012_change_history"
down_revision: str | None = "0010_partitions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What a person changes; frozen here as of this migration (periodic_manager.db.change_history
# holds the same list, and a test checks they agree).
TRACKED = (
    "name",
    "spec",
    "timezone",
    "anchor",
    "task_type",
    "payload",
    "options",
    "enabled",
    "description",
    "paused_note",
)
CUT = 2000  # characters of a value kept

_JSON = ("payload", "options")


def _pg_text(ref: str, col: str) -> str:
    # JSON columns as their JSON text; the others as to_jsonb's text (ISO-8601 instants, whatever
    # the session's TimeZone and DateStyle; true/false).
    return f"{ref}.{col}::text" if col in _JSON else f"to_jsonb({ref}.{col}) #>> '{{}}'"


def _pg_diff(before: str | None, after: str | None) -> str:
    """One row's changed tracked columns as a jsonb object (``{}``: none changed). A NULL
    ``before`` or ``after`` is left out of its column's item (read as null)."""
    items = []
    for c in TRACKED:
        b = _pg_text(before, c) if before else "NULL::text"
        a = _pg_text(after, c) if after else "NULL::text"
        # Unchanged: compared as stored (cheap); the text is built only for a change.
        if before and after:
            same = f"{before}.{c} IS NOT DISTINCT FROM {after}.{c}"
        else:
            same = f"{before or after}.{c} IS NULL"
        long = f"length({b}) > {CUT} OR length({a}) > {CUT}"
        item = (
            f"CASE WHEN {same} THEN NULL WHEN {long} THEN "
            f"jsonb_build_object('before', left({b}, {CUT}), 'after', left({a}, {CUT}), "
            f"'truncated', true) ELSE jsonb_build_object('before', {b}, 'after', {a}) END"
        )
        items.append(f"'{c}', {item}")
    return f"jsonb_strip_nulls(jsonb_build_object({', '.join(items)}))"


def _lateral(before: str | None, after: str | None) -> str:
    # Computed once per row (a column of a subquery in FROM would be computed per reference).
    return f"CROSS JOIN LATERAL (SELECT {_pg_diff(before, after)} AS diff OFFSET 0) AS d"


_PG_CHANGED = f"({', '.join(f'o.{c}' for c in TRACKED)}) IS DISTINCT FROM ({', '.join(f'n.{c}' for c in TRACKED)})"
_PG_ACTION = (
    "CASE WHEN n.enabled IS FALSE AND o.enabled IS DISTINCT FROM FALSE THEN 'paused' "
    "WHEN n.enabled IS TRUE AND o.enabled IS DISTINCT FROM TRUE THEN 'resumed' ELSE 'updated' END"
)
_PG_INSERT = (
    "INSERT INTO pm_schedule_changes (schedule_id, name, at, action, source, actor, changes) "
    "SELECT id, left(name, 200), at, action, src, left(who, 200), diff::text FROM ({rows}) AS c "
    "WHERE diff <> '{{}}'::jsonb"
)
# Statement triggers with transition tables: one INSERT .. SELECT per statement (a row trigger
# made a 100,000-row UPDATE four times slower). An UPDATE is matched row to row by id: one that
# changes a row's id is recorded as nothing (ids are the database's; see the docs).
PG_UP = [
    f"""CREATE FUNCTION pm_jobs_changes() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
      src text := current_setting('periodic_manager.source', true);
      who text;
      stamp text := current_setting('periodic_manager.at', true);
      at timestamptz := statement_timestamp();
    BEGIN
      IF src IS NULL OR src NOT IN ('api', 'import', 'manager') THEN
        src := 'sql';
        who := session_user;
      ELSE
        who := nullif(current_setting('periodic_manager.actor', true), '');
      END IF;
      IF stamp ~ '^[0-9]{{1,16}}$' THEN
        at := timestamptz 'epoch' + stamp::bigint * interval '1 microsecond';
      END IF;
      IF TG_OP = 'INSERT' THEN
        {_PG_INSERT.format(rows=f"SELECT n.id, n.name, 'created' AS action, d.diff FROM new_rows n {_lateral(None, 'n')}")};
      ELSIF TG_OP = 'DELETE' THEN
        {_PG_INSERT.format(rows=f"SELECT o.id, o.name, 'deleted' AS action, d.diff FROM old_rows o {_lateral('o', None)}")};
      ELSE
        {_PG_INSERT.format(rows=f"SELECT n.id, n.name, {_PG_ACTION} AS action, d.diff FROM old_rows o JOIN new_rows n ON n.id = o.id {_lateral('o', 'n')} WHERE {_PG_CHANGED}")};
      END IF;
      RETURN NULL;
    END $$""",
    """CREATE TRIGGER pm_jobs_changes_insert AFTER INSERT ON periodic_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pm_jobs_changes()""",
    """CREATE TRIGGER pm_jobs_changes_update AFTER UPDATE ON periodic_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pm_jobs_changes()""",
    """CREATE TRIGGER pm_jobs_changes_delete AFTER DELETE ON periodic_jobs
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION pm_jobs_changes()""",
]
PG_DOWN = [
    "DROP TRIGGER IF EXISTS pm_jobs_changes_delete ON periodic_jobs",
    "DROP TRIGGER IF EXISTS pm_jobs_changes_update ON periodic_jobs",
    "DROP TRIGGER IF EXISTS pm_jobs_changes_insert ON periodic_jobs",
    "DROP FUNCTION IF EXISTS pm_jobs_changes()",
]

# SQLite: a value's text (a blob as x'<hex>'); one subquery per trigger gathers the changed
# columns into one JSON object (json() keeps each item an object across the subquery).
_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'"


def _text(ref: str) -> str:
    return (
        f"CASE typeof({ref}) WHEN 'null' THEN NULL WHEN 'blob' THEN 'x''' || hex({ref}) || '''' "
        f"ELSE CAST({ref} AS TEXT) END"
    )


def _item(col: str, before: bool, after: bool) -> str:
    b = _text(f"OLD.{col}") if before else "NULL"
    a = _text(f"NEW.{col}") if after else "NULL"
    obj = f"json_object('before', substr({b}, 1, {CUT}), 'after', substr({a}, 1, {CUT}))"
    long = f"length({b}) > {CUT} OR length({a}) > {CUT}"
    return f"CASE WHEN {long} THEN json_set({obj}, '$.truncated', json('true')) ELSE {obj} END"


def _diff(before: bool, after: bool) -> str:
    parts = []
    for col in TRACKED:
        if before and after:
            changed = f"OLD.{col} IS NOT NEW.{col}"
        else:
            changed = f"{'OLD' if before else 'NEW'}.{col} IS NOT NULL"
        parts.append(f"SELECT '{col}' AS k, {_item(col, before, after)} AS v WHERE {changed}")
    return f"(SELECT json_group_object(k, json(v)) FROM ({' UNION ALL '.join(parts)}))"


def _insert(sid: str, name: str, action: str, diff: str) -> str:
    return (
        "INSERT INTO pm_schedule_changes (schedule_id, name, at, action, source, actor, changes) "
        f"VALUES ({sid}, substr({name}, 1, 200), {_NOW}, {action}, 'sql', NULL, {diff});"
    )


# An UPDATE is a change when a tracked column differs; 0009's follow-up UPDATE (stamps moved,
# ``enabled`` as it was, at most the note cleared) is part of the statement before it.
_ANY = " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in TRACKED if c != "paused_note")
_STAMPED = "(OLD.paused_at IS NOT NEW.paused_at OR OLD.paused_by IS NOT NEW.paused_by)"
_ACTION = (
    "CASE WHEN NEW.enabled IS 0 AND OLD.enabled IS NOT 0 THEN 'paused' "
    "WHEN NEW.enabled IS 1 AND OLD.enabled IS NOT 1 THEN 'resumed' ELSE 'updated' END"
)
SQLITE_UP = [
    f"""CREATE TRIGGER pm_jobs_changes_insert AFTER INSERT ON periodic_jobs BEGIN
      {_insert("NEW.id", "NEW.name", "'created'", _diff(False, True))}
    END""",
    f"""CREATE TRIGGER pm_jobs_changes_update AFTER UPDATE ON periodic_jobs
    WHEN {_ANY} OR (OLD.paused_note IS NOT NEW.paused_note AND NOT {_STAMPED}) BEGIN
      {_insert("NEW.id", "NEW.name", _ACTION, _diff(True, True))}
    END""",
    f"""CREATE TRIGGER pm_jobs_changes_delete AFTER DELETE ON periodic_jobs BEGIN
      {_insert("OLD.id", "OLD.name", "'deleted'", _diff(True, False))}
    END""",
]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS pm_jobs_changes_delete",
    "DROP TRIGGER IF EXISTS pm_jobs_changes_update",
    "DROP TRIGGER IF EXISTS pm_jobs_changes_insert",
]


# MariaDB/MySQL: one JSON object per row change, built column by column in the trigger.
def _my_text(ref: str) -> str:
    return f"CAST({ref} AS CHAR)"


def _my_diff(before: bool, after: bool) -> str:
    lines = []
    for col in TRACKED:
        b = _my_text(f"OLD.{col}") if before else "NULL"
        a = _my_text(f"NEW.{col}") if after else "NULL"
        if before and after:
            changed = f"NOT (OLD.{col} <=> NEW.{col})"
        else:
            changed = f"{'OLD' if before else 'NEW'}.{col} IS NOT NULL"
        long = f"coalesce(char_length({b}), 0) > {CUT} OR coalesce(char_length({a}), 0) > {CUT}"
        item = (
            f"IF({long}, JSON_OBJECT('before', LEFT({b}, {CUT}), 'after', LEFT({a}, {CUT}), "
            f"'truncated', JSON_EXTRACT('true', '$')), JSON_OBJECT('before', {b}, 'after', {a}))"
        )
        lines.append(f"IF {changed} THEN SET d = JSON_SET(d, '$.{col}', {item}); END IF;")
    return "\n      ".join(lines)


def _my_trigger(event: str, ref: str, action: str, before: bool, after: bool) -> str:
    return f"""CREATE TRIGGER pm_jobs_changes_{event.lower()} AFTER {event} ON periodic_jobs
    FOR EACH ROW BEGIN
      DECLARE d LONGTEXT DEFAULT JSON_OBJECT();
      DECLARE src VARCHAR(16) DEFAULT 'sql';
      DECLARE who VARCHAR(200) DEFAULT LEFT(CURRENT_USER(), 200);
      DECLARE stamp DATETIME(6) DEFAULT UTC_TIMESTAMP(6);
      {_my_diff(before, after)}
      IF @pm_source IN ('api', 'import', 'manager') THEN
        SET src = @pm_source, who = LEFT(nullif(@pm_actor, ''), 200);
      END IF;
      IF @pm_at REGEXP '^[0-9]{{1,16}}$' THEN
        SET stamp = TIMESTAMPADD(MICROSECOND, CAST(@pm_at AS UNSIGNED), '1970-01-01 00:00:00.000000');
      END IF;
      IF JSON_LENGTH(d) > 0 THEN
        INSERT INTO pm_schedule_changes (schedule_id, name, at, action, source, actor, changes)
        VALUES ({ref}.id, LEFT({ref}.name, 200), stamp, {action}, src, who, d);
      END IF;
    END"""


_MY_ACTION = (
    "CASE WHEN NEW.enabled <=> 0 AND NOT OLD.enabled <=> 0 THEN 'paused' "
    "WHEN NEW.enabled <=> 1 AND NOT OLD.enabled <=> 1 THEN 'resumed' ELSE 'updated' END"
)
MYSQL_UP = [
    _my_trigger("INSERT", "NEW", "'created'", False, True),
    _my_trigger("UPDATE", "NEW", _MY_ACTION, True, True),
    _my_trigger("DELETE", "OLD", "'deleted'", True, False),
]
MYSQL_DOWN = SQLITE_DOWN


def upgrade() -> None:
    op.create_table(
        "pm_schedule_changes",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("schedule_id", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("at", dialect.INSTANT, nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=True),
        sa.Column("changes", dialect.LONG_TEXT, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pm_schedule_changes")),
        sqlite_autoincrement=True,  # ids never reused,
        **dialect.TABLE,
    )
    op.create_index(
        "ix_pm_schedule_changes_schedule_id_id", "pm_schedule_changes", ["schedule_id", "id"]
    )
    op.create_index("ix_pm_schedule_changes_at", "pm_schedule_changes", ["at"])
    dialect.run(postgresql=PG_UP, sqlite=SQLITE_UP, mysql=MYSQL_UP)


def downgrade() -> None:
    dialect.run(postgresql=PG_DOWN, sqlite=SQLITE_DOWN, mysql=MYSQL_DOWN)
    op.drop_index("ix_pm_schedule_changes_at", table_name="pm_schedule_changes")
    op.drop_index("ix_pm_schedule_changes_schedule_id_id", table_name="pm_schedule_changes")
    op.drop_table("pm_schedule_changes")
