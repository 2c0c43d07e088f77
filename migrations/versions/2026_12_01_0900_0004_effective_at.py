"""effective_at: the instant from which a schedule's slots may be sent; updated_at follows SQL edits.

``effective_at`` is set when a row is inserted, and again whenever an UPDATE changes what its
slots or idempotency keys are (``name``, ``spec``, ``timezone``, ``anchor``) or resumes it
(``enabled`` false -> true). No manager ever sends a slot at or before it: a takeover re-sending
the last ``grace`` and a ``fire_once`` catch-up both stop there, so a schedule never gets a slot
from before it existed, from its old timing, or from while it was paused. A statement that sets
the column itself (the API does, with its own clock) keeps its value; triggers fill it for plain
SQL. Existing rows start from their ``updated_at`` (the latest instant their timing may have
changed: conservative).

``updated_at`` is now also maintained for plain SQL: an UPDATE that changes a column people see
but leaves ``updated_at`` as it was gets the current time. An UPDATE that changes nothing leaves
it alone.

Revision ID: 0004_effective_at
Revises: 0003_change_signal
Create Date: 2026-12-01 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from periodic_manager.migrations import dialect

revision: str = "0004_effective_at"
down_revision: str | None = "0003_change_signal"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Columns that decide the slots or the keys of a schedule, and every column people edit
# (effective_at is bookkeeping: stamping it, as the insert trigger does, is no edit).
TIMING = ("name", "spec", "timezone", "anchor")
VISIBLE = (*TIMING, "task_type", "payload", "options", "enabled", "description")


def _distinct(cols: Sequence[str], pg: bool) -> str:
    if pg:
        new = ", ".join(f"NEW.{c}" for c in cols)
        old = ", ".join(f"OLD.{c}" for c in cols)
        return f"ROW({new}) IS DISTINCT FROM ROW({old})"
    return "(" + " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in cols) + ")"


# statement_timestamp(): the time of the statement, not of the transaction's start (as close as
# the database can tell to when the edit takes effect), and one instant for every row a
# statement writes (a bulk INSERT's rows share it, and a manager shares one object for them).
PG_UP = [
    f"""CREATE FUNCTION pm_jobs_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'INSERT' THEN
        IF NEW.effective_at IS NULL THEN NEW.effective_at := statement_timestamp(); END IF;
        RETURN NEW;
      END IF;
      IF NEW.effective_at IS NOT DISTINCT FROM OLD.effective_at
         AND ({_distinct(TIMING, True)} OR (NEW.enabled AND NOT OLD.enabled)) THEN
        NEW.effective_at := statement_timestamp();
      END IF;
      IF NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at AND {_distinct(VISIBLE, True)} THEN
        NEW.updated_at := statement_timestamp();
      END IF;
      RETURN NEW;
    END $$""",
    """CREATE TRIGGER pm_jobs_stamp BEFORE INSERT OR UPDATE ON periodic_jobs
    FOR EACH ROW EXECUTE FUNCTION pm_jobs_stamp()""",
]
PG_DOWN = [
    "DROP TRIGGER IF EXISTS pm_jobs_stamp ON periodic_jobs",
    "DROP FUNCTION IF EXISTS pm_jobs_stamp()",
]

# MariaDB/MySQL: BEFORE row triggers setting NEW (UTC_TIMESTAMP(6): the statement's time, in UTC).
_MY_NOW = dialect.MYSQL_NOW
MYSQL_UP = [
    f"""CREATE TRIGGER pm_jobs_stamp_insert BEFORE INSERT ON periodic_jobs FOR EACH ROW BEGIN
      IF NEW.effective_at IS NULL THEN SET NEW.effective_at = {_MY_NOW}; END IF;
    END""",
    f"""CREATE TRIGGER pm_jobs_stamp_update BEFORE UPDATE ON periodic_jobs FOR EACH ROW BEGIN
      IF NEW.effective_at <=> OLD.effective_at
         AND ({dialect.mysql_distinct(TIMING)} OR (NEW.enabled <=> 1 AND NOT OLD.enabled <=> 1)) THEN
        SET NEW.effective_at = {_MY_NOW};
      END IF;
      IF NEW.updated_at <=> OLD.updated_at AND {dialect.mysql_distinct(VISIBLE)} THEN
        SET NEW.updated_at = {_MY_NOW};
      END IF;
    END""",
]
MYSQL_DOWN = [
    "DROP TRIGGER IF EXISTS pm_jobs_stamp_update",
    "DROP TRIGGER IF EXISTS pm_jobs_stamp_insert",
]

# SQLite keeps instants as naive UTC text; six fractional digits, like SQLAlchemy writes them.
_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'"
SQLITE_UP = [
    f"""CREATE TRIGGER pm_jobs_effective_insert AFTER INSERT ON periodic_jobs
    WHEN NEW.effective_at IS NULL BEGIN
      UPDATE periodic_jobs SET effective_at = {_NOW} WHERE id = NEW.id;
    END""",
    f"""CREATE TRIGGER pm_jobs_effective_update AFTER UPDATE ON periodic_jobs
    WHEN NEW.effective_at IS OLD.effective_at
     AND ({_distinct(TIMING, False)} OR (NEW.enabled IS 1 AND OLD.enabled IS NOT 1)) BEGIN
      UPDATE periodic_jobs SET effective_at = {_NOW} WHERE id = NEW.id;
    END""",
    f"""CREATE TRIGGER pm_jobs_touch AFTER UPDATE ON periodic_jobs
    WHEN NEW.updated_at IS OLD.updated_at AND {_distinct(VISIBLE, False)} BEGIN
      UPDATE periodic_jobs SET updated_at = {_NOW} WHERE id = NEW.id;
    END""",
]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS pm_jobs_touch",
    "DROP TRIGGER IF EXISTS pm_jobs_effective_update",
    "DROP TRIGGER IF EXISTS pm_jobs_effective_insert",
]


def upgrade() -> None:
    # Plain ALTER TABLE on every backend: SQLite's batch mode would rebuild the table and lose
    # the triggers of 0003.
    op.execute(f"ALTER TABLE periodic_jobs ADD COLUMN effective_at {dialect.instant_sql()}")
    op.execute("UPDATE periodic_jobs SET effective_at = updated_at")
    dialect.run(postgresql=PG_UP, sqlite=SQLITE_UP, mysql=MYSQL_UP)


def downgrade() -> None:
    dialect.run(postgresql=PG_DOWN, sqlite=SQLITE_DOWN, mysql=MYSQL_DOWN)
    op.execute("ALTER TABLE periodic_jobs DROP COLUMN effective_at")
