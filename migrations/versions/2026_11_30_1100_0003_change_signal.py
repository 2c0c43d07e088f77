"""Change signal: revision counter, tombstones and NOTIFY on periodic_jobs.

Every INSERT/UPDATE of ``periodic_jobs`` gets a fresh ``revision`` and every DELETE a tombstone in
``periodic_jobs_deleted``, both from one counter, by triggers, so edits made with plain SQL are
seen like API edits. A sync then reads only ``revision > watermark``.

Revisions must be visible in commit order, or a sync could pass over a revision whose transaction
commits later. SQLite serializes writers by itself. On PostgreSQL a statement-level trigger takes a
transaction-level advisory lock first, so writers of ``periodic_jobs`` queue behind each other
until commit (schedule edits are rare; one bulk statement takes the lock once).

PostgreSQL also NOTIFYs channel ``periodic_jobs`` once per statement (empty payload: listeners
re-read), so a bulk UPDATE of 10,000 rows is one notification.

Revision ID: 0003_change_signal
Revises: 0002_runs_history
Create Date: 2026-11-30 11:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_change_signal"
down_revision: str | None = "0002_runs_history"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# pg_advisory_xact_lock key serializing writers of periodic_jobs (distinct from the leader lock).
WRITER_LOCK_KEY = 7_310_452_981_110_233_001
CHANNEL = "periodic_jobs"

PG_UP = [
    "CREATE SEQUENCE periodic_jobs_revision_seq",
    "UPDATE periodic_jobs SET revision = nextval('periodic_jobs_revision_seq')",
    f"""CREATE FUNCTION pm_jobs_serialize() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN PERFORM pg_advisory_xact_lock({WRITER_LOCK_KEY}); RETURN NULL; END $$""",
    """CREATE TRIGGER pm_jobs_serialize BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON periodic_jobs FOR EACH STATEMENT EXECUTE FUNCTION pm_jobs_serialize()""",
    """CREATE FUNCTION pm_jobs_revision() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN NEW.revision := nextval('periodic_jobs_revision_seq'); RETURN NEW; END $$""",
    """CREATE TRIGGER pm_jobs_revision BEFORE INSERT OR UPDATE ON periodic_jobs
    FOR EACH ROW EXECUTE FUNCTION pm_jobs_revision()""",
    """CREATE FUNCTION pm_jobs_tombstone() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO periodic_jobs_deleted (revision, id)
      VALUES (nextval('periodic_jobs_revision_seq'), CASE WHEN TG_OP = 'TRUNCATE' THEN 0 ELSE OLD.id END);
      RETURN NULL;
    END $$""",
    """CREATE TRIGGER pm_jobs_tombstone AFTER DELETE ON periodic_jobs
    FOR EACH ROW EXECUTE FUNCTION pm_jobs_tombstone()""",
    """CREATE TRIGGER pm_jobs_truncate AFTER TRUNCATE ON periodic_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION pm_jobs_tombstone()""",
    f"""CREATE FUNCTION pm_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN PERFORM pg_notify('{CHANNEL}', ''); RETURN NULL; END $$""",
    """CREATE TRIGGER pm_jobs_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON periodic_jobs FOR EACH STATEMENT EXECUTE FUNCTION pm_jobs_notify()""",
]

PG_DOWN = [
    "DROP TRIGGER IF EXISTS pm_jobs_notify ON periodic_jobs",
    "DROP TRIGGER IF EXISTS pm_jobs_truncate ON periodic_jobs",
    "DROP TRIGGER IF EXISTS pm_jobs_tombstone ON periodic_jobs",
    "DROP TRIGGER IF EXISTS pm_jobs_revision ON periodic_jobs",
    "DROP TRIGGER IF EXISTS pm_jobs_serialize ON periodic_jobs",
    "DROP FUNCTION IF EXISTS pm_jobs_notify()",
    "DROP FUNCTION IF EXISTS pm_jobs_tombstone()",
    "DROP FUNCTION IF EXISTS pm_jobs_revision()",
    "DROP FUNCTION IF EXISTS pm_jobs_serialize()",
    "DROP SEQUENCE IF EXISTS periodic_jobs_revision_seq",
]

_BUMP = "UPDATE pm_revision SET value = value + 1 WHERE id = 1;"
_CURRENT = "(SELECT value FROM pm_revision WHERE id = 1)"
SQLITE_UP = [
    "CREATE TABLE pm_revision (id INTEGER PRIMARY KEY CHECK (id = 1), value BIGINT NOT NULL)",
    "INSERT INTO pm_revision (id, value) VALUES (1, 0)",
    "UPDATE periodic_jobs SET revision = id",
    "UPDATE pm_revision SET value = (SELECT coalesce(max(id), 0) FROM periodic_jobs)",
    f"""CREATE TRIGGER pm_jobs_insert AFTER INSERT ON periodic_jobs BEGIN
      {_BUMP}
      UPDATE periodic_jobs SET revision = {_CURRENT} WHERE id = NEW.id;
    END""",
    # The WHEN clause keeps the trigger's own UPDATE from firing it again.
    f"""CREATE TRIGGER pm_jobs_update AFTER UPDATE ON periodic_jobs
    WHEN NEW.revision = OLD.revision BEGIN
      {_BUMP}
      UPDATE periodic_jobs SET revision = {_CURRENT} WHERE id = NEW.id;
    END""",
    f"""CREATE TRIGGER pm_jobs_delete AFTER DELETE ON periodic_jobs BEGIN
      {_BUMP}
      INSERT INTO periodic_jobs_deleted (revision, id, deleted_at)
      VALUES ({_CURRENT}, OLD.id, CURRENT_TIMESTAMP);
    END""",
]

SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS pm_jobs_delete",
    "DROP TRIGGER IF EXISTS pm_jobs_update",
    "DROP TRIGGER IF EXISTS pm_jobs_insert",
    "DROP TABLE IF EXISTS pm_revision",
]


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    op.add_column(
        "periodic_jobs", sa.Column("revision", sa.BigInteger(), server_default="0", nullable=False)
    )
    op.create_index("ix_periodic_jobs_revision", "periodic_jobs", ["revision"], unique=False)
    op.create_table(
        "periodic_jobs_deleted",
        sa.Column("revision", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column(
            "deleted_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("revision", name=op.f("pk_periodic_jobs_deleted")),
    )
    for stmt in SQLITE_UP if sqlite else PG_UP:
        op.execute(stmt)


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for stmt in SQLITE_DOWN if sqlite else PG_DOWN:
        op.execute(stmt)
    op.drop_table("periodic_jobs_deleted")
    op.drop_index("ix_periodic_jobs_revision", table_name="periodic_jobs")
    with op.batch_alter_table("periodic_jobs") as batch:
        batch.drop_column("revision")
