"""Change signal: revision counter, tombstones and NOTIFY on periodic_jobs.

Every INSERT/UPDATE of ``periodic_jobs`` gets a fresh ``revision`` and every DELETE a tombstone in
``periodic_jobs_deleted``, both from one counter, by triggers, so edits made with plain SQL are
seen like API edits. A sync then reads only ``revision > watermark``.

Revisions must be visible in commit order, or a sync could pass over a revision whose transaction
commits later. SQLite serializes writers by itself. On PostgreSQL a statement-level trigger takes a
transaction-level advisory lock first, so writers of ``periodic_jobs`` queue behind each other
until commit (schedule edits are rare; one bulk statement takes the lock once).

MariaDB/MySQL: the counter is the one row of ``pm_revision`` (as on SQLite), bumped by BEFORE
INSERT/UPDATE row triggers that set ``NEW.revision`` and by an AFTER DELETE trigger that writes
the tombstone. The row lock the bump takes is held to commit, so writers of ``periodic_jobs``
queue behind each other there too. No trigger fires on TRUNCATE (a full sync, every
``PM_FULL_SYNC_INTERVAL``, makes up for it), and there is no NOTIFY: managers poll the watermark
(``PM_POLL_INTERVAL``).

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

from periodic_manager.migrations import dialect

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

_MY_BUMP = "UPDATE pm_revision SET value = value + 1 WHERE id = 1;"
MYSQL_UP = [
    "CREATE TABLE pm_revision (id INTEGER NOT NULL PRIMARY KEY, value BIGINT NOT NULL)"
    " ENGINE=InnoDB",
    "INSERT INTO pm_revision (id, value) VALUES (1, 0)",
    "UPDATE periodic_jobs SET revision = id",
    "UPDATE pm_revision SET value = (SELECT coalesce(max(id), 0) FROM periodic_jobs)",
    f"""CREATE TRIGGER pm_jobs_revision_insert BEFORE INSERT ON periodic_jobs FOR EACH ROW BEGIN
      {_MY_BUMP}
      SET NEW.revision = {_CURRENT};
    END""",
    f"""CREATE TRIGGER pm_jobs_revision_update BEFORE UPDATE ON periodic_jobs FOR EACH ROW BEGIN
      {_MY_BUMP}
      SET NEW.revision = {_CURRENT};
    END""",
    f"""CREATE TRIGGER pm_jobs_tombstone AFTER DELETE ON periodic_jobs FOR EACH ROW BEGIN
      {_MY_BUMP}
      INSERT INTO periodic_jobs_deleted (revision, id, deleted_at)
      VALUES ({_CURRENT}, OLD.id, UTC_TIMESTAMP(6));
    END""",
]
MYSQL_DOWN = [
    "DROP TRIGGER IF EXISTS pm_jobs_tombstone",
    "DROP TRIGGER IF EXISTS pm_jobs_revision_update",
    "DROP TRIGGER IF EXISTS pm_jobs_revision_insert",
    "DROP TABLE IF EXISTS pm_revision",
]

SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS pm_jobs_delete",
    "DROP TRIGGER IF EXISTS pm_jobs_update",
    "DROP TRIGGER IF EXISTS pm_jobs_insert",
    "DROP TABLE IF EXISTS pm_revision",
]


def upgrade() -> None:
    op.add_column(
        "periodic_jobs", sa.Column("revision", sa.BigInteger(), server_default="0", nullable=False)
    )
    op.create_index("ix_periodic_jobs_revision", "periodic_jobs", ["revision"], unique=False)
    op.create_table(
        "periodic_jobs_deleted",
        sa.Column("revision", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("deleted_at", dialect.INSTANT, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("revision", name=op.f("pk_periodic_jobs_deleted")),
        **dialect.TABLE,
    )
    dialect.run(postgresql=PG_UP, sqlite=SQLITE_UP, mysql=MYSQL_UP)


def downgrade() -> None:
    dialect.run(postgresql=PG_DOWN, sqlite=SQLITE_DOWN, mysql=MYSQL_DOWN)
    op.drop_table("periodic_jobs_deleted")
    op.drop_index("ix_periodic_jobs_revision", table_name="periodic_jobs")
    with op.batch_alter_table("periodic_jobs") as batch:
        batch.drop_column("revision")
