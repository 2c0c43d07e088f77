"""Ids are never reused (AUTOINCREMENT on SQLite); last good versions kept across restarts.

Ids: AUTOINCREMENT on SQLite for periodic_jobs.id, pm_outbox.seq and pm_runs.id.

Without AUTOINCREMENT SQLite hands out ``max(rowid) + 1``, so deleting the newest schedule gave
its id to the next one (a bookmark, an API client or a run history then pointed at another
schedule), and deleting the newest outbox rows gave their ``seq`` (the message id in the run
history, and the cursor a consumer may keep) to later messages. With AUTOINCREMENT SQLite keeps
the largest id ever used in ``sqlite_sequence`` and never goes below it.

SQLite cannot add AUTOINCREMENT to a column, so each of the three tables is rebuilt: a new table,
every row copied (ids, revisions and timestamps as they are: no trigger exists on the new table
while it is filled), the old table dropped (its triggers go first, so the drop writes no
tombstones), the new one renamed, and every index and trigger the old table had created again
from the SQL SQLite kept for it (the unique index on ``name``, ``ix_periodic_jobs_revision``, the
triggers of 0003 and 0004, and any index added by hand).

What an operator added by hand survives the rebuild: a column (``ALTER TABLE ... ADD COLUMN``)
is created again with its declared type, ``NOT NULL`` and default, after the known columns, and
its values are copied; a view or a trigger elsewhere that names the table keeps working (the
rename runs with ``legacy_alter_table``, so SQLite does not check them against a schema in which
the table is briefly missing: it refused with "error in view ...: no such table"). A generated
column cannot be created again from what SQLite reports of it: the upgrade stops and says so
(drop it, upgrade, add it again).

The sequence then starts above every id the table is known to have used, not only the ones still
present, so an id deleted before this upgrade is not reused either:

- ``periodic_jobs``: the largest id of a row or a tombstone (``periodic_jobs_deleted``, kept a
  day) and the revision counter ``pm_revision``, which every INSERT since 0003 bumped and which is
  therefore at least the largest id handed out since (ids may skip ahead once: never reused is
  what counts);
- ``pm_outbox``: the largest ``seq``, and the outbox message ids (``str(seq)``: digits only) in
  the run history and the schedule state;
- ``pm_runs``: the largest id (nothing refers to a run by its id).

PostgreSQL and MariaDB/MySQL need nothing: these columns are ``BIGSERIAL`` or ``AUTO_INCREMENT`` (a sequence, which never hands out a
value twice). Downgrading rebuilds the SQLite tables without AUTOINCREMENT.

Last good versions (both backends):

- ``pm_last_good``: per schedule key, the last good version of a row that turned bad, written by
  the manager that ran it, so that a manager that starts or takes over while the row is still bad
  runs that version too (and judges it again first). See ``models.last_good_table``.
- ``pm_entries.last_good_since``: on a manager's error record for a row, since when it keeps the
  row's last good version running (null: none runs), for the API and the dashboard.

Revision ID: 0007_ids_last_good
Revises: 0006_settled_slots
Create Date: 2026-12-03 10:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text

from periodic_manager.migrations import dialect

revision: str = "0007_ids_last_good"
down_revision: str | None = "0006_settled_slots"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The columns of each rebuilt table as SQLite holds them after 0006 (the id column aside), in
# their order; the id column is (name, primary key constraint name).
TABLES: dict[str, tuple[tuple[str, str], Sequence[str]]] = {
    "periodic_jobs": (
        ("id", "pk_periodic_jobs"),
        (
            "name VARCHAR(200) NOT NULL",
            "spec VARCHAR(200) NOT NULL",
            "timezone VARCHAR(64) DEFAULT 'UTC' NOT NULL",
            "anchor DATETIME",
            "task_type VARCHAR(200) NOT NULL",
            "payload JSON",
            "options JSON DEFAULT '{}' NOT NULL",
            "enabled BOOLEAN DEFAULT 1 NOT NULL",
            "description TEXT",
            "created_at DATETIME DEFAULT CURRENT_TIMESTAMP NOT NULL",
            "updated_at DATETIME DEFAULT CURRENT_TIMESTAMP NOT NULL",
            "revision BIGINT DEFAULT '0' NOT NULL",
            "effective_at DATETIME",
            "CONSTRAINT uq_periodic_jobs_name UNIQUE (name)",
        ),
    ),
    "pm_outbox": (
        ("seq", "pk_pm_outbox"),
        (
            "task_id VARCHAR(36) NOT NULL",
            "idempotency_key VARCHAR(300) NOT NULL",
            "queue VARCHAR(100) NOT NULL",
            "name VARCHAR(200) NOT NULL",
            "task_type VARCHAR(200) NOT NULL",
            "payload TEXT NOT NULL",
            "options TEXT NOT NULL",
            "scheduled_at DATETIME NOT NULL",
            "enqueued_at DATETIME NOT NULL",
            "processed_at DATETIME",
            "CONSTRAINT uq_pm_outbox_idempotency_key UNIQUE (idempotency_key)",
        ),
    ),
    "pm_runs": (
        ("id", "pk_pm_runs"),
        (
            "schedule_key VARCHAR(128) NOT NULL",
            "name VARCHAR(200) NOT NULL",
            "slot_at DATETIME NOT NULL",
            "status VARCHAR(16) NOT NULL",
            "at DATETIME NOT NULL",
            "lateness_ms BIGINT NOT NULL",
            "message_id VARCHAR(128)",
            "error TEXT",
        ),
    ),
}


def _int_max(column: str, table: str) -> str:
    # Only integers count: these columns hold nothing else, but SQLite would compare text above
    # any number.
    return f"(SELECT max(CASE WHEN typeof({column}) = 'integer' THEN {column} END) FROM {table})"


def _digits_max(column: str, table: str) -> str:
    """The largest value of ``column`` that is an outbox message id: 1-18 digits and nothing
    else (a Redis stream id has a dash, a Celery or arq task id is a UUID)."""
    return (
        f"(SELECT max(CAST({column} AS INTEGER)) FROM {table} WHERE length({column}) <= 18"
        f" AND {column} GLOB '[0-9]*' AND NOT {column} GLOB '*[^0-9]*')"
    )


# The largest id each table is known to have used (see the module doc).
USED = {
    "periodic_jobs": (
        _int_max("id", "periodic_jobs"),
        _int_max("id", "periodic_jobs_deleted"),
        "(SELECT value FROM pm_revision WHERE id = 1 AND typeof(value) = 'integer')",
    ),
    "pm_outbox": (
        _int_max("seq", "pm_outbox"),
        _digits_max("message_id", "pm_runs"),
        _digits_max("last_message_id", "pm_schedule_state"),
    ),
    "pm_runs": (_int_max("id", "pm_runs"),),
}


def _rebuild(table: str, *, autoincrement: bool) -> None:
    """Rebuild ``table`` with (or without) AUTOINCREMENT, keeping its rows, indexes and triggers."""
    conn = op.get_bind()
    (key, pk_name), columns = TABLES[table]
    # Every index and trigger of the table as SQLite keeps it (automatic indexes of UNIQUE
    # constraints have no SQL: they come back with the constraint).
    kept = conn.execute(
        text(
            "SELECT type, sql FROM sqlite_master WHERE tbl_name = :t AND sql IS NOT NULL"
            " AND type IN ('index', 'trigger') ORDER BY type, name"
        ),
        {"t": table},
    ).all()
    names = [c.split()[0] for c in columns if not c.startswith("CONSTRAINT")]
    added = _added_by_hand(table, {key, *names})
    listed = ", ".join([key, *names, *(_quote(name) for name, _ in added)])
    definitions = [
        *(c for c in columns if not c.startswith("CONSTRAINT")),
        *(definition for _, definition in added),
        *(c for c in columns if c.startswith("CONSTRAINT")),
    ]
    new = f"{table}__0007"
    pk = f"{key} INTEGER NOT NULL CONSTRAINT {pk_name} PRIMARY KEY"
    op.execute(f"DROP TABLE IF EXISTS {new}")  # left by an interrupted run (DDL autocommits)
    op.execute(
        f"CREATE TABLE {new} ({pk}{' AUTOINCREMENT' if autoincrement else ''},"
        f" {', '.join(definitions)})"
    )
    op.execute(f"INSERT INTO {new} ({listed}) SELECT {listed} FROM {table}")
    op.execute(f"DROP TABLE {table}")
    # Views and triggers elsewhere that name the table are left as they are (they name it again
    # once renamed): without legacy_alter_table SQLite checks them now, while it is missing.
    legacy = conn.execute(text("PRAGMA legacy_alter_table")).scalar()
    op.execute("PRAGMA legacy_alter_table = ON")
    op.execute(f"ALTER TABLE {new} RENAME TO {table}")
    op.execute(f"PRAGMA legacy_alter_table = {'ON' if legacy else 'OFF'}")
    for kind in ("index", "trigger"):  # indexes first: no trigger fires meanwhile anyway
        for type_, sql in kept:
            if type_ == kind:
                op.execute(sql)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _added_by_hand(table: str, known: set[str]) -> list[tuple[str, str]]:
    """The columns of ``table`` this migration does not know (added by an operator), each with
    its definition as SQLite reports it: declared type, NOT NULL, default."""
    out: list[tuple[str, str]] = []
    info = op.get_bind().execute(text(f"PRAGMA table_xinfo({table})")).all()
    for _cid, name, type_, notnull, default, _pk, hidden in info:
        if name in known:
            continue
        if hidden in (2, 3):
            raise RuntimeError(
                f"{table}.{name} is a generated column, which this upgrade cannot rebuild: drop"
                " it, upgrade, and add it again"
            )
        definition = f"{_quote(name)} {type_ or ''}".rstrip()
        if default is not None:  # SQLite reports an expression without its parentheses
            bare = default.upper() in ("CURRENT_TIME", "CURRENT_DATE", "CURRENT_TIMESTAMP")
            definition += f" DEFAULT {default}" if bare else f" DEFAULT ({default})"
        if notnull:
            definition += " NOT NULL"
        out.append((name, definition))
    return out


def _start_sequence(table: str) -> None:
    """``sqlite_sequence`` of ``table`` at the largest id it is known to have used."""
    op.execute(f"DELETE FROM sqlite_sequence WHERE name = '{table}'")
    used = ", ".join(f"coalesce({q}, 0)" for q in USED[table])
    op.execute(f"INSERT INTO sqlite_sequence (name, seq) SELECT '{table}', max(0, {used})")


def _create_last_good() -> None:
    op.create_table(
        "pm_last_good",
        sa.Column("schedule_key", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("spec", sa.String(length=200), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("anchor", dialect.INSTANT, nullable=True),
        sa.Column("task_type", sa.String(length=200), nullable=False),
        sa.Column("payload", dialect.LONG_TEXT, nullable=False),
        sa.Column("options", dialect.LONG_TEXT, nullable=False),
        sa.Column("effective_at", dialect.INSTANT, nullable=True),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("row_revision", sa.BigInteger(), nullable=True),
        sa.Column("bad_revision", sa.BigInteger(), nullable=True),
        sa.Column("since", dialect.INSTANT, nullable=False),
        sa.Column("manager_id", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("schedule_key", name=op.f("pk_pm_last_good")),
        **dialect.TABLE,
    )


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        for table in TABLES:
            _rebuild(table, autoincrement=True)
        for table in TABLES:
            _start_sequence(table)
    _create_last_good()
    # Plain ALTER TABLE on both backends (SQLite's batch mode would rebuild the table).
    op.execute(f"ALTER TABLE pm_entries ADD COLUMN last_good_since {dialect.instant_sql()}")


def downgrade() -> None:
    op.execute("ALTER TABLE pm_entries DROP COLUMN last_good_since")
    op.drop_table("pm_last_good")
    if op.get_bind().dialect.name == "sqlite":
        for table in TABLES:
            _rebuild(table, autoincrement=False)
            op.execute(f"DELETE FROM sqlite_sequence WHERE name = '{table}'")
