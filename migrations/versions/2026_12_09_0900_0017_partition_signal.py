"""Change signal by partition: the NOTIFY on ``periodic_jobs`` names the partitions changed.

Migration 0003 NOTIFYs channel ``periodic_jobs`` once per statement with an empty payload, so
every manager wakes and reads. With ``PM_COORDINATION=partitions`` a manager holds only some
partitions; the payload now lists the partitions of the rows the statement wrote or deleted
(``id % <rows of pm_partitions>``, the rule of periodic_manager/schedules/partition.py), comma
separated, and a manager syncs only when it holds one of them. Still one notification per
statement. An empty payload still means "anything may have changed": TRUNCATE, a statement whose
list would not fit a notification (8,000 bytes), or a database without partition rows.

The statement triggers read the rows through transition tables, which PostgreSQL allows for one
event per trigger: one trigger each for INSERT, UPDATE and DELETE, and TRUNCATE as before.
SQLite has no NOTIFY: nothing changes there. Downgrade restores the trigger of 0003.

Revision ID: 0017_partition_signal
Revises: 0016_calendars
Create Date: 2026-12-07 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from periodic_manager.migrations import dialect

revision: str = "0017_partition_signal"
down_revision: str | None = "0016_calendars"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHANNEL = "periodic_jobs"
LONGEST = 7900  # payload bytes at most (PostgreSQL refuses 8,000); longer: empty, everyone reads

PG_UP = [
    "DROP TRIGGER IF EXISTS pm_jobs_notify ON periodic_jobs",
    "DROP FUNCTION IF EXISTS pm_jobs_notify()",
    f"""CREATE FUNCTION pm_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
      n bigint;
      parts text := '';
    BEGIN
      IF TG_OP <> 'TRUNCATE' THEN
        SELECT count(*) INTO n FROM pm_partitions;
        IF n > 0 THEN
          SELECT coalesce(string_agg(p::text, ',' ORDER BY p), '') INTO parts
            FROM (SELECT DISTINCT id % n AS p FROM pm_jobs_changed) AS changed;
          IF length(parts) > {LONGEST} THEN
            parts := '';
          END IF;
        END IF;
      END IF;
      PERFORM pg_notify('{CHANNEL}', parts);
      RETURN NULL;
    END $$""",
    """CREATE TRIGGER pm_jobs_notify_insert AFTER INSERT ON periodic_jobs
    REFERENCING NEW TABLE AS pm_jobs_changed FOR EACH STATEMENT EXECUTE FUNCTION pm_jobs_notify()""",
    """CREATE TRIGGER pm_jobs_notify_update AFTER UPDATE ON periodic_jobs
    REFERENCING NEW TABLE AS pm_jobs_changed FOR EACH STATEMENT EXECUTE FUNCTION pm_jobs_notify()""",
    """CREATE TRIGGER pm_jobs_notify_delete AFTER DELETE ON periodic_jobs
    REFERENCING OLD TABLE AS pm_jobs_changed FOR EACH STATEMENT EXECUTE FUNCTION pm_jobs_notify()""",
    """CREATE TRIGGER pm_jobs_notify_truncate AFTER TRUNCATE ON periodic_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION pm_jobs_notify()""",
]

PG_DOWN = [
    "DROP TRIGGER IF EXISTS pm_jobs_notify_insert ON periodic_jobs",
    "DROP TRIGGER IF EXISTS pm_jobs_notify_update ON periodic_jobs",
    "DROP TRIGGER IF EXISTS pm_jobs_notify_delete ON periodic_jobs",
    "DROP TRIGGER IF EXISTS pm_jobs_notify_truncate ON periodic_jobs",
    "DROP FUNCTION IF EXISTS pm_jobs_notify()",
    # As migration 0003 made them.
    f"""CREATE FUNCTION pm_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN PERFORM pg_notify('{CHANNEL}', ''); RETURN NULL; END $$""",
    """CREATE TRIGGER pm_jobs_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON periodic_jobs FOR EACH STATEMENT EXECUTE FUNCTION pm_jobs_notify()""",
]


def upgrade() -> None:
    # SQLite and MariaDB/MySQL have no NOTIFY: their managers find changes by revision.
    dialect.run(postgresql=PG_UP, sqlite=(), mysql=())


def downgrade() -> None:
    dialect.run(postgresql=PG_DOWN, sqlite=(), mysql=())
