"""The change history of ``periodic_jobs``: ``pm_schedule_changes``, written by triggers.

One row per change of a schedule: ``created`` (INSERT), ``updated``, ``paused`` or ``resumed``
(an UPDATE of a tracked column; ``enabled`` turning false or true names it), ``deleted``
(DELETE), with its time, its source, its actor where known and every tracked column that changed
(``changes``: JSON text ``{column: {"before": text|null, "after": text|null}}``, each value the
column's stored text, cut to 2000 characters with ``"truncated": true`` on the column then; a
SQLite blob is written ``x'<hex>'``). An UPDATE that changes no tracked column (the revision, the
stamps ``updated_at``, ``effective_at``, ``paused_at``, ``paused_by``) writes nothing.

Triggers on both databases, so plain SQL is recorded too (source ``sql``):

* PostgreSQL: an AFTER row trigger. The schedule writer marks its own statements with
  transaction-local settings (``set_config(..., true)``, as ``SET LOCAL``):
  ``periodic_manager.source`` (``api``, ``import``, ``manager``; anything else or unset is
  ``sql``), ``periodic_manager.actor`` and ``periodic_manager.at`` (its clock, epoch microseconds,
  digits only; otherwise ``statement_timestamp()``). A ``sql`` change's actor is the session's
  database role (``session_user``).
* SQLite: AFTER triggers record every change as ``sql`` at the statement's time; the schedule
  writer, which holds the database's write lock for its transaction, then sets source, actor and
  time on the rows its statements added. The follow-up UPDATE of 0009's triggers (stamping a
  plain SQL pause or resume) is not a change of its own.

A TRUNCATE records nothing (no row triggers fire). History outlives the row: a deleted
schedule's changes stay until the manager prunes them (``PM_CHANGES_RETENTION``,
``PM_CHANGES_MAX_PER_SCHEDULE``).

Revision ID: 0012_change_history
Revises: 0009_pause_note
Create Date: 2026-12-06 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_change_history"
down_revision: str | None = "0009_pause_note"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What a person changes; frozen here as of this migration (periodic_manager.db.change_history
# holds the same list, and a test checks they agree).
TRACKED = (
    "name", "spec", "timezone", "anchor", "task_type", "payload", "options", "enabled",
    "description", "paused_note",
)  # fmt: skip
CUT = 2000  # characters of a value kept

_PG_COLUMNS = ", ".join(f"'{c}'" for c in TRACKED)
PG_UP = [
    f"""CREATE FUNCTION pm_jobs_changes() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
      o jsonb; n jsonb; col text; b text; a text; item jsonb; diff jsonb := '{{}}'::jsonb;
      act text; nm text; sid bigint; src text; who text; stamp text; at timestamptz;
    BEGIN
      IF TG_OP = 'INSERT' THEN
        n := to_jsonb(NEW); act := 'created'; nm := NEW.name; sid := NEW.id;
      ELSIF TG_OP = 'DELETE' THEN
        o := to_jsonb(OLD); act := 'deleted'; nm := OLD.name; sid := OLD.id;
      ELSE
        o := to_jsonb(OLD); n := to_jsonb(NEW); nm := NEW.name; sid := NEW.id;
        IF NEW.enabled IS FALSE AND OLD.enabled IS DISTINCT FROM FALSE THEN act := 'paused';
        ELSIF NEW.enabled IS TRUE AND OLD.enabled IS DISTINCT FROM TRUE THEN act := 'resumed';
        ELSE act := 'updated';
        END IF;
      END IF;
      FOREACH col IN ARRAY ARRAY[{_PG_COLUMNS}] LOOP
        b := o ->> col;
        a := n ->> col;
        IF b IS DISTINCT FROM a THEN
          item := jsonb_build_object('before', left(b, {CUT}), 'after', left(a, {CUT}));
          IF length(b) > {CUT} OR length(a) > {CUT} THEN
            item := item || '{{"truncated": true}}'::jsonb;
          END IF;
          diff := diff || jsonb_build_object(col, item);
        END IF;
      END LOOP;
      IF diff = '{{}}'::jsonb THEN
        RETURN NULL;
      END IF;
      src := current_setting('periodic_manager.source', true);
      IF src IS NULL OR src NOT IN ('api', 'import', 'manager') THEN
        src := 'sql';
        who := session_user;
      ELSE
        who := nullif(current_setting('periodic_manager.actor', true), '');
      END IF;
      stamp := current_setting('periodic_manager.at', true);
      IF stamp ~ '^[0-9]{{1,16}}$' THEN
        at := timestamptz 'epoch' + stamp::bigint * interval '1 microsecond';
      ELSE
        at := statement_timestamp();
      END IF;
      INSERT INTO pm_schedule_changes (schedule_id, name, at, action, source, actor, changes)
      VALUES (sid, left(nm, 200), at, act, src, left(who, 200), diff::text);
      RETURN NULL;
    END $$""",
    """CREATE TRIGGER pm_jobs_changes AFTER INSERT OR UPDATE OR DELETE ON periodic_jobs
    FOR EACH ROW EXECUTE FUNCTION pm_jobs_changes()""",
]
PG_DOWN = [
    "DROP TRIGGER IF EXISTS pm_jobs_changes ON periodic_jobs",
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


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
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
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=True),
        sa.Column("changes", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pm_schedule_changes")),
        sqlite_autoincrement=True,  # ids never reused
    )
    op.create_index(
        "ix_pm_schedule_changes_schedule_id_id", "pm_schedule_changes", ["schedule_id", "id"]
    )
    op.create_index("ix_pm_schedule_changes_at", "pm_schedule_changes", ["at"])
    for stmt in SQLITE_UP if sqlite else PG_UP:
        op.execute(stmt)


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for stmt in SQLITE_DOWN if sqlite else PG_DOWN:
        op.execute(stmt)
    op.drop_index("ix_pm_schedule_changes_at", table_name="pm_schedule_changes")
    op.drop_index("ix_pm_schedule_changes_schedule_id_id", table_name="pm_schedule_changes")
    op.drop_table("pm_schedule_changes")
