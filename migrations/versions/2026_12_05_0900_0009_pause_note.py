"""Who paused a schedule, when, and why: ``paused_note``, ``paused_at``, ``paused_by``.

Three nullable columns of ``periodic_jobs``, shown by the API and the dashboard beside a paused
schedule, untrusted like every column (read as text; a value that cannot be read shows as null
with an error naming it, never a failure). They are bookkeeping people read: no manager reads
them, so they are no part of a schedule's content (nor of what a sync compares) and writing them
never restarts an entry.

The schedule writer sets them itself: a pause (``POST /schedules/{id}/pause``, a PATCH or an
import that sets ``enabled`` to false, a row created paused) stamps ``paused_at`` with its clock,
``paused_by`` (``api``, ``import``) and the note; a resume clears all three. For plain SQL,
triggers do the same: an INSERT of a paused row, and an UPDATE that turns ``enabled`` from
anything but false to false, get ``paused_at = now`` and ``paused_by = 'sql'`` (and no note,
unless the statement gives one); an UPDATE that turns it to true gets all three cleared. A
statement that sets ``paused_at`` or ``paused_by`` itself (the writer does) keeps its values, as
the triggers of 0004 do for ``effective_at``. Rows paused before this migration have no stamps
(null: unknown).

Revision ID: 0009_pause_note
Revises: 0008_procrastinate_sent
Create Date: 2026-12-05 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from periodic_manager.migrations import dialect

revision: str = "0009_pause_note"
down_revision: str | None = "0008_procrastinate_sent"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# statement_timestamp(): as 0004 (the time of the statement, one instant for all its rows).
PG_UP = [
    """CREATE FUNCTION pm_jobs_paused() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'INSERT' THEN
        IF NEW.enabled IS FALSE AND NEW.paused_at IS NULL AND NEW.paused_by IS NULL THEN
          NEW.paused_at := statement_timestamp();
          NEW.paused_by := 'sql';
        END IF;
        RETURN NEW;
      END IF;
      IF NEW.paused_at IS DISTINCT FROM OLD.paused_at
         OR NEW.paused_by IS DISTINCT FROM OLD.paused_by THEN
        RETURN NEW;  -- the statement stamps them itself (the schedule writer)
      END IF;
      IF NEW.enabled IS FALSE AND OLD.enabled IS DISTINCT FROM FALSE THEN
        NEW.paused_at := statement_timestamp();
        NEW.paused_by := 'sql';
        IF NEW.paused_note IS NOT DISTINCT FROM OLD.paused_note THEN NEW.paused_note := NULL; END IF;
      ELSIF NEW.enabled IS TRUE AND OLD.enabled IS DISTINCT FROM TRUE THEN
        NEW.paused_at := NULL;
        NEW.paused_by := NULL;
        IF NEW.paused_note IS NOT DISTINCT FROM OLD.paused_note THEN NEW.paused_note := NULL; END IF;
      END IF;
      RETURN NEW;
    END $$""",
    """CREATE TRIGGER pm_jobs_paused BEFORE INSERT OR UPDATE ON periodic_jobs
    FOR EACH ROW EXECUTE FUNCTION pm_jobs_paused()""",
]
PG_DOWN = [
    "DROP TRIGGER IF EXISTS pm_jobs_paused ON periodic_jobs",
    "DROP FUNCTION IF EXISTS pm_jobs_paused()",
]

# SQLite: AFTER UPDATE triggers writing the row again (as 0003 and 0004 do); the second write
# leaves ``enabled`` as it is, so neither fires again. ``enabled`` is judged exactly 0 or 1.
_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'"
_UNSTAMPED = "NEW.paused_at IS OLD.paused_at AND NEW.paused_by IS OLD.paused_by"
_NOTE = "CASE WHEN NEW.paused_note IS OLD.paused_note THEN NULL ELSE NEW.paused_note END"
SQLITE_UP = [
    f"""CREATE TRIGGER pm_jobs_paused_insert AFTER INSERT ON periodic_jobs
    WHEN NEW.enabled IS 0 AND NEW.paused_at IS NULL AND NEW.paused_by IS NULL BEGIN
      UPDATE periodic_jobs SET paused_at = {_NOW}, paused_by = 'sql' WHERE id = NEW.id;
    END""",
    f"""CREATE TRIGGER pm_jobs_paused AFTER UPDATE ON periodic_jobs
    WHEN {_UNSTAMPED} AND NEW.enabled IS 0 AND OLD.enabled IS NOT 0 BEGIN
      UPDATE periodic_jobs SET paused_at = {_NOW}, paused_by = 'sql', paused_note = {_NOTE}
      WHERE id = NEW.id;
    END""",
    f"""CREATE TRIGGER pm_jobs_resumed AFTER UPDATE ON periodic_jobs
    WHEN {_UNSTAMPED} AND NEW.enabled IS 1 AND OLD.enabled IS NOT 1 BEGIN
      UPDATE periodic_jobs SET paused_at = NULL, paused_by = NULL, paused_note = {_NOTE}
      WHERE id = NEW.id;
    END""",
]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS pm_jobs_resumed",
    "DROP TRIGGER IF EXISTS pm_jobs_paused",
    "DROP TRIGGER IF EXISTS pm_jobs_paused_insert",
]

# MariaDB/MySQL: BEFORE row triggers setting NEW, as PostgreSQL's; ``enabled`` judged exactly 0 or 1.
_MY_NOW = dialect.MYSQL_NOW
_MY_UNSTAMPED = "NEW.paused_at <=> OLD.paused_at AND NEW.paused_by <=> OLD.paused_by"
_MY_NOTE = "IF NEW.paused_note <=> OLD.paused_note THEN SET NEW.paused_note = NULL; END IF;"
MYSQL_UP = [
    f"""CREATE TRIGGER pm_jobs_paused_insert BEFORE INSERT ON periodic_jobs FOR EACH ROW BEGIN
      IF NEW.enabled <=> 0 AND NEW.paused_at IS NULL AND NEW.paused_by IS NULL THEN
        SET NEW.paused_at = {_MY_NOW}, NEW.paused_by = 'sql';
      END IF;
    END""",
    f"""CREATE TRIGGER pm_jobs_paused BEFORE UPDATE ON periodic_jobs FOR EACH ROW BEGIN
      -- A statement that stamps them itself (the schedule writer) keeps its values.
      IF {_MY_UNSTAMPED} AND NEW.enabled <=> 0 AND NOT OLD.enabled <=> 0 THEN
        SET NEW.paused_at = {_MY_NOW}, NEW.paused_by = 'sql';
        {_MY_NOTE}
      ELSEIF {_MY_UNSTAMPED} AND NEW.enabled <=> 1 AND NOT OLD.enabled <=> 1 THEN
        SET NEW.paused_at = NULL, NEW.paused_by = NULL;
        {_MY_NOTE}
      END IF;
    END""",
]
MYSQL_DOWN = [
    "DROP TRIGGER IF EXISTS pm_jobs_paused",
    "DROP TRIGGER IF EXISTS pm_jobs_paused_insert",
]

COLUMNS = ("paused_note", "paused_at", "paused_by")


def upgrade() -> None:
    # Plain ALTER TABLE on every backend: SQLite's batch mode would rebuild the table and lose
    # its triggers (see 0004).
    op.execute("ALTER TABLE periodic_jobs ADD COLUMN paused_note TEXT")
    op.execute(f"ALTER TABLE periodic_jobs ADD COLUMN paused_at {dialect.instant_sql()}")
    op.execute("ALTER TABLE periodic_jobs ADD COLUMN paused_by VARCHAR(64)")
    dialect.run(postgresql=PG_UP, sqlite=SQLITE_UP, mysql=MYSQL_UP)


def downgrade() -> None:
    dialect.run(postgresql=PG_DOWN, sqlite=SQLITE_DOWN, mysql=MYSQL_DOWN)
    for column in reversed(COLUMNS):
        op.execute(f"ALTER TABLE periodic_jobs DROP COLUMN {column}")
